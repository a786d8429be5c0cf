"""Draft-length policies: the schedules (draft_policy.py), the cost-aware `auto` policy (auto.py) and the costs and
calibration kept per model pair (costs.py)."""

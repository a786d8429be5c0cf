"""The JSONL job behind `structspec batch`: resumable runs (run.py), two-pass input reading (input.py), the output
lock (lock.py), Ray workers (ray.py) and `BatchGenerator` for `Dataset.map_batches` (distributed.py)."""

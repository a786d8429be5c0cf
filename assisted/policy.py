"""Candidate-length policies: how many model-drafted tokens to ask for in the next step.

Forced tokens are free and never count against k. A policy sees, after every step that had
model-drafted tokens, how many were drafted and how many of those the target accepted.
"""

from __future__ import annotations

from typing import Protocol


class Policy(Protocol):
    k: int  # model-drafted tokens to ask for next

    def update(self, drafted: int, accepted: int) -> None: ...


class Constant:
    """Always the same k."""

    def __init__(self, k: int):
        self.k = k

    def update(self, drafted: int, accepted: int) -> None:
        pass


class Heuristic:
    """transformers' original assisted generation: +2 when every draft was accepted, else -1 (min 1)."""

    def __init__(self, k: int):
        self.k = k

    def update(self, drafted: int, accepted: int) -> None:
        self.k = self.k + 2 if accepted == drafted else max(1, self.k - 1)


SCHEDULES = {"constant": Constant, "heuristic": Heuristic}


def make_policy(schedule: str, k: int) -> Policy:
    """The policy named `schedule` (one of SCHEDULES), starting at `k`."""
    return SCHEDULES[schedule](k)

"""Candidate-length policies: how many model-drafted tokens to ask for in the next step, and when to stop.

Forced tokens are free and never count against k. After each drafted token the loop asks the policy's
`cut` whether to go on (None) or how many drafts to verify; after every step it tells the policy which
drafts the target judged (up to the first rejection, with the assistant's confidence in each), how many it
accepted, and what the step cost: a `StepCost` of wall times the loop measured around calls it made
anyway. `constant` and `heuristic` (transformers' schedules) never cut; `auto` (`assisted.policy.auto`) does. With
`generate(tree=True)`, the policy also decides whether a side leaf is verified: the fixed schedules always,
`auto` where its expected extra token pays for its row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from assisted.policy.auto import Auto, AutoConfig, Calibration, Estimates
from assisted.policy.costs import CostTable, StepCost

if TYPE_CHECKING:
    from drafting.base import Draft
    from drafting.tree import Branch

__all__ = ["SCHEDULES", "Auto", "AutoConfig", "Constant", "Estimates", "Heuristic", "Policy", "StepCost",
           "make_policy"]


class Policy(Protocol):
    k: int  # model-drafted tokens to ask for next
    lookup_k: int  # ... of which prompt lookup may draft this many (the assistant stops at k)

    def update(self, drafted: int, accepted: int, cost: StepCost | None = None,
               confidence: tuple[float, ...] = ()) -> None:
        """`drafted` model drafts were judged by the target (the assistant's confidence in each, NaN for
        prompt-lookup tokens), the first `accepted` of them accepted."""

    def cut(self, confidence: tuple[float, ...]) -> int | None:
        """After drafts with these confidences: None to draft on (up to k), else how many of them to verify (an
        `Auto` priced with other rows also takes `peers`, their proposals: `Auto.cut`)."""

    def assistant_behind(self, positions: int) -> None:
        """The assistant's cache lacks this many of the row's positions (its next call's catch-up)."""

    def leaf_pays(self, draft: Draft, branch: Branch, rows: int, feeds: Sequence[int] = ()) -> bool:
        """Whether to verify `branch`, a side leaf of `draft`, in the forward over the draft's `rows` tokens, beside
        the other rows' `feeds` (per slot)."""

    def observe_leaf(self, confidence: float, picked: bool) -> None:
        """The target rejected a branch's sibling and did or did not pick the runner-up (of this confidence)."""

    def estimates(self) -> Estimates | None:
        """What a cost-aware policy believes now; None for the others."""

    def learned(self) -> CostTable | None:
        """The costs the next call on the same model pair should start from; None for the others."""

    def calibration(self) -> Calibration | None:
        """What the next call on the pair with the same sampling should start its acceptance model from; None
        for the others."""


class Constant:
    """Always the same k."""

    def __init__(self, k: int):
        self.k = k

    @property
    def lookup_k(self) -> int:
        return self.k

    def update(self, drafted: int, accepted: int, cost: StepCost | None = None,
               confidence: tuple[float, ...] = ()) -> None:
        pass

    def cut(self, confidence: tuple[float, ...]) -> None:
        return None

    def assistant_behind(self, positions: int) -> None:
        pass

    def leaf_pays(self, draft: Draft, branch: Branch, rows: int, feeds: Sequence[int] = ()) -> bool:
        return True

    def observe_leaf(self, confidence: float, picked: bool) -> None:
        pass

    def estimates(self) -> None:
        return None

    def learned(self) -> None:
        return None

    def calibration(self) -> None:
        return None


class Heuristic(Constant):
    """transformers' original assisted generation: +2 when every draft was accepted, else -1 (min 1).

    Steps in which the target judged no assistant token leave k alone.
    """

    def update(self, drafted: int, accepted: int, cost: StepCost | None = None,
               confidence: tuple[float, ...] = ()) -> None:
        if drafted:
            self.k = self.k + 2 if accepted == drafted else max(1, self.k - 1)


SCHEDULES = {"constant": Constant, "heuristic": Heuristic, "auto": Auto}


def make_policy(schedule: str, k: int, costs: CostTable | None = None, calibration: Calibration | None = None,
                prices=None) -> Policy:
    """The policy named `schedule` (one of SCHEDULES), starting at `k`; `auto` also from a pair's measured `costs`
    and the `calibration` of its earlier calls with the same sampling, priced by the engine's shared `prices`
    (`assisted.policy.prices.SharedPrices`; None: alone, by `costs`)."""
    if schedule == "auto":
        return Auto(k, costs=costs, calibration=calibration, prices=prices)
    return SCHEDULES[schedule](k)

"""Drafts priced by position, per forward: the costs and rates the `auto` rows of one engine share.

B rows decoded together share one target forward per step over B x n positions (each row fed n) and one assistant
forward per drafting round. What such a forward costs at each width (the positions it computed,
`drafting.row_kv.RowsKV.positions`: padding included where it pads) is measured once per step into one `CostTable`;
whether a step drafts at all, and the price of a second, are the batch's: plain decoding commits B tokens per T(B)
seconds, drafting steps commit the rows' expected tokens in theirs. Each row keeps its own beliefs (acceptance,
calibration, window: `assisted.policy.auto.Auto`) and drafts up to its own cap; after each of its drafts it asks
`SharedPrices.cut`, which chooses the width the whole batch verifies at (`assisted.policy.estimates.cut_width`): a
row's drafts past the others' widen every row, so a row drafts on only where the batch's expected tokens per second
gain by it, and may draft nothing. With one row this is the single-row `auto` exactly: the same functions at width 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Callable

from assisted.policy.auto import Auto, AutoConfig, AutoState, mode, time_step
from assisted.policy.costs import CostTable, StepCost
from assisted.policy.estimates import shared_cut


class SharedPrices:
    """The prices of one engine's forwards, shared by its `Auto` rows (each built with ``prices=`` this).

    Parameters
    ----------
    config : AutoConfig
        The rows' knobs (one config for the engine).
    costs : CostTable, optional
        Costs earlier runs measured on the same pair, device and engine (`assisted.policy.costs.recall`).
    prefilled : bool
        The engine prefills prompts when it admits rows (no decoding step holds a prefill).
    assistant_prefilled : bool, optional
        The same for the assistant's cache (default: `prefilled`). A lazy assistant cache is not: its first call
        catches up on the rows it drafts for, which is timed as the pair's catch-up cost, not as a drafting step.
    """

    def __init__(self, config: AutoConfig, costs: CostTable | None = None, prefilled: bool = False,
                 assistant_prefilled: bool | None = None):
        self.config = config
        drafted_before = prefilled if assistant_prefilled is None else assistant_prefilled
        self.state = AutoState(k0=0, costs=costs or CostTable(), prefilled=prefilled, drafted_before=drafted_before)
        self.width = 1  # rows in this step's forwards
        self.mode = mode(self.state, config, self.width)  # "warm-up", "plain" or "draft", for every row
        self.members: list[Auto | None] = []  # per slot: the row's policy if it prices here, else None

    def begin(self, policies: list) -> None:
        """A step over rows with these policies (slot order) begins: decide its mode for that many rows."""
        self.members = [p if isinstance(p, Auto) and p.prices is self else None for p in policies]
        if len(policies) != self.width:
            self.width = len(policies)
            self._decide()

    def mode_for(self, row: Auto) -> str:
        """The step's mode for `row`: the batch's, except that in a warm-up only the first priced row drafts. Its k0
        drafts make the forward wider than the batch's rows, which is all the warm-up has to time; every other row's
        would cost positions, dear where the forward is bound by its arithmetic."""
        if self.mode != "warm-up":
            return self.mode
        return self.mode if row is next((p for p in self.members if p is not None), row) else "plain"

    def cut(self, row: Auto, confidence: tuple[float, ...], proposals: Sequence) -> int | None:
        """`row`'s cut after drafts of these confidences, decided for the batch: None to draft on, else how many of
        them to verify (`shared_cut` over every row's drafts so far, `proposals`: per slot, its
        `drafting.proposal.Proposal` as it grows; rows of other schedules only widen)."""
        estimates, confidences, asking, fixed, to_come = [row.estimates()], [confidence], [True], 0, []
        for policy, proposal in zip(self.members, proposals):
            if policy is None:
                fixed = max(fixed, 1 + proposal.model_drafts)
            elif policy is not row and proposal.copies_to_come:  # it will fill the width chosen here with free copies
                to_come.append(policy.estimates())
            elif policy is not row:
                estimates.append(policy.estimates())
                confidences.append(proposal.model_confidence)
                # a row more than a round behind is filling later (this row's copies came all at once): its future
                # drafts are its own cut's to weigh, not a reason for this row to go on
                asking.append(proposal.may_draft and proposal.model_drafts >= len(confidence) - 1)
        width = shared_cut(estimates, confidences, asking, self.config.k_max, fixed if fixed > 1 else 0, to_come)
        return None if width is None else min(width - 1, len(confidence))

    def beside(self, row: Auto, feeds: Sequence[int]) -> int:
        """The widest feed of the other rows in this step's forward (`feeds`: per slot, the tokens each feeds)."""
        return max((n for p, n in zip(self.members, feeds) if p is not row), default=0)

    def observe(self, cost: StepCost, rows: list[tuple[Auto, tuple[float, ...]]]) -> None:
        """Book one step: its forward's costs (`cost`, over every row) and, per `auto` row that took part, the
        assistant's confidence in each draft it verified; then decide the next step."""
        self.state = time_step(self.state, cost, self.config, [(p.state, c) for p, c in rows], self.width)
        self._decide()

    def _decide(self) -> None:
        self.mode = mode(self.state, self.config, self.width)
        for policy in self.members:
            if policy is not None:
                policy.refresh()


def row_cuts(policies: Sequence, proposals: Sequence, prices: SharedPrices | None) -> list[Callable]:
    """Each row's cut this step (slot order): a row priced by `prices` weighs every row's `proposals` as they grow
    (`proposals` is complete before any cut is asked: `Proposal` asks only while drafting); any other row cuts alone."""
    members = [None] * len(policies) if prices is None else prices.members
    return [p.cut if m is None else partial(m.cut, peers=proposals) for p, m in zip(policies, members)]

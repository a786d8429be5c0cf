"""`auto` for B rows: drafts priced by the positions they add to the shared forward (`assisted.policy.prices`).

With one row the shared prices are the single-row `auto` exactly (same k, cuts and beliefs on any trace). For B rows,
a replay with injected costs (no timing: a cost table measured once and held) drives the engine's drafting rounds
through real `Proposal`s: the batch never drafts past the measured break-even, where the batch's expected tokens per
second would fall below what plain decoding of every row commits; on the same costs one row drafts, and on flat
(GPU-like) costs the batch drafts too.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace

import numpy as np
import pytest

from assisted.policy.auto import Auto, AutoConfig
from assisted.policy.costs import CostTable, StepCost
from assisted.policy.estimates import RowDrafts, cut_width
from assisted.policy.prices import SharedPrices, row_cuts
from drafting.base import Cursor, Drafted
from drafting.proposal import Proposal

EOS = frozenset([0])


def replayed(policies: list[Auto], steps: int, target, draft: float, confidence, seed: int = 0, prices=None):
    """Drive rows in lock-step as the engine does (one cut per drafted token, rows drafting in rounds); returns the
    per-step (k, verified drafts) of every row."""
    rng, trace = random.Random(seed), []
    for step in range(steps):
        if prices is not None:
            prices.begin(policies)
        ks = [p.k for p in policies]
        proposals: list[Proposal] = []  # as the engine hands them to the rows' cuts
        cuts = row_cuts(policies, proposals, prices)
        proposals += [Proposal([1], Cursor(None, EOS), k=k, lookup_k=0, limit=64, cut=cut) for cut, k in zip(cuts, ks)]
        asking, rounds = [r for r, p in enumerate(proposals) if p.fill()], 0
        while asking:
            rounds += 1
            for r in asking:
                proposals[r].give(Drafted(2, None, confidence(step, r), None))
            asking = [r for r in asking if proposals[r].fill()]
        verified = [p.model_confidence for p in proposals]
        width = len(policies) * (1 + max(map(len, verified)))
        for policy, conf in zip(policies, verified):
            judged = accepted = 0
            while judged < len(conf):
                judged += 1
                if rng.random() >= conf[judged - 1]:
                    break
                accepted += 1
            policy.update(judged, accepted, StepCost(len(conf) + 1, target(width), rounds, draft * rounds), conf)
        if prices is not None:
            prices.observe(StepCost(width, target(width), rounds, draft * rounds), list(zip(policies, verified)))
        trace.append([(k, len(c)) for k, c in zip(ks, verified)])
    return trace


@pytest.mark.parametrize("seed", range(6))
def test_one_row_priced_by_shared_prices_is_auto_alone(seed):
    """The engine prices every `auto` row through `SharedPrices`; with one row that is today's `auto`: the same draft
    caps, the same cuts and the same beliefs, step by step, on random costs and confidences."""
    rng = random.Random(seed)
    slope, draft = rng.uniform(0.0, 0.1), rng.uniform(0.001, 0.05)
    level = rng.uniform(0.3, 0.99)

    def confidence(step, row):
        return min(0.999, level + 0.2 * math.sin(step + 3 * row))

    alone = Auto(5)
    prices = SharedPrices(AutoConfig())
    shared = Auto(5, prices=prices)
    target = lambda n: 0.1 + slope * n  # noqa: E731
    assert replayed([alone], 60, target, draft, confidence, seed) == \
        replayed([shared], 60, target, draft, confidence, seed, prices)
    assert alone.estimates() == shared.estimates() and alone.k == shared.k


# --- the batch: a replay with injected costs ----------------------------------------------------------------
# The int8 Qwen2.5-Coder-1.5B target measured on a 2-core CPU (stop 51: 211/228/280/359/434 ms at 1/2/4/8/16
# positions), continued linearly past 16; an int4 assistant round costs 71 ms at one row, 191 ms at eight.


def int8_cpu(w: float) -> float:
    xs, ys = [1, 2, 4, 8, 16], [0.211, 0.228, 0.280, 0.359, 0.434]
    return float(np.interp(w, xs, ys)) + (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) * max(w - xs[-1], 0)


def flat(w: float) -> float:
    return 0.020 + 0.00001 * w  # a GPU: 16-64 positions cost about one step


def held(target, rows: int) -> CostTable:
    """Costs already measured (at every width the replay can meet) and held: the calls' own timings cannot move them."""
    return CostTable(tuple((w, target(w), 1e12) for w in range(1, 64 * rows + 1)), draft_per_token=None)


def batch(rows: int, target, draft: float):
    prices = SharedPrices(AutoConfig(), held(target, rows), prefilled=True)
    prices.state = replace(prices.state, costs=prices.state.costs.with_draft(draft, 0))
    return [Auto(4, prices=prices) for _ in range(rows)], prices


def break_even(rows: int, target, draft: float, acceptance: float) -> int:
    """The widest per-row width n at which the batch, every row drafting n - 1 tokens of this acceptance, still
    commits at least plain decoding's tokens per second (the measured costs decide it, not the policy)."""
    def rate(n):
        tokens = rows * sum(acceptance**i for i in range(n))
        return tokens / (target(rows * n) + (n - 1) * draft)
    return max(n for n in range(1, 22) if rate(n) >= rate(1))


@pytest.mark.parametrize("rows, target, draft, drafts", [
    (16, int8_cpu, 0.300, False),  # 16 positions cost about 2x one: drafts lose to 16 plain rows
    (1, int8_cpu, 0.071, True),  # the same CPU, one row: a draft costs a few % of a step, and pays
    (16, flat, 0.010, True),  # flat costs: every row drafts
])
def test_the_batch_never_drafts_past_the_measured_break_even(rows, target, draft, drafts):
    acceptance = 0.8
    policies, prices = batch(rows, target, draft)
    trace = replayed(policies, 30, target, draft, lambda step, row: acceptance, prices=prices)
    widest = max(1 + verified for step in trace[2:] for _, verified in step)  # after a two-step warm-up
    assert widest <= break_even(rows, target, draft, acceptance)
    assert (widest > 1) == drafts


def test_a_batch_row_waits_for_its_own_assistant_and_a_last_row_does_not_catch_up_on_its_whole_context():
    """Rows of a batch start after the batch's prefills (`prefilled`), but a lazy assistant has run for none of them.
    Where no draft can pay (an assistant round over 16 rows costs more than a target position saves) a plain step
    loses nothing against drafting, so a row pays no rent; left alone at the end of the batch, where one row's drafts
    could pay, it waits like a lone call until its own plain steps have lost what catching up on its context costs."""
    costs = replace(held(int8_cpu, 16), draft_per_token=0.300, catch_up=0.01, drafting_rate=4.0 / int8_cpu(1))
    prices = SharedPrices(AutoConfig(), costs, prefilled=True)
    rows = [Auto(4, prices=prices) for _ in range(16)]
    for _ in range(5):  # 16 rows: plain, no rent
        prices.begin(rows)
        for row in rows:
            row.assistant_behind(100)
        assert all(row.k == 0 for row in rows)
        for row in rows:
            row.update(0, 0, StepCost(16, int8_cpu(16), 0, 0.0))
        prices.observe(StepCost(16, int8_cpu(16), 0, 0.0), [(row, ()) for row in rows])
    assert all(row.state.rent == 0.0 for row in rows)
    last = rows[0]
    prices.begin([last])  # alone: a one-row forward, where drafts pay (`can_pay`), but 1 s of catch-up ahead
    assert prices.mode == "draft" and last.k == 0
    step, lost = int8_cpu(1), int8_cpu(1) * (1.0 - 1.0 / 4.0)  # drafting 4x plain decoding's rate: 3/4 of a step
    waited = 0
    while last.k == 0:
        last.update(0, 0, StepCost(1, step, 0, 0.0))
        prices.observe(StepCost(1, step, 0, 0.0), [(last, ())])
        last.assistant_behind(100)
        waited += 1
    assert waited == math.ceil(100 * 0.01 / lost) and last.state.rent == pytest.approx(waited * lost)
    last.update(2, 2, StepCost(3, int8_cpu(3), 2, 0.6), (0.9, 0.9))  # its assistant drafted for it: no more rent
    last.update(0, 0, StepCost(1, step, 0, 0.0))
    assert last.state.started and last.state.rent == pytest.approx(waited * lost)


def test_a_batch_priced_as_one_row_would_draft_past_it(monkeypatch):
    """Negative control: the same replay with the batch's forward priced as one row's (its positions as cheap as a
    single row's) drafts where the batch's break-even says not to."""
    rows, draft, acceptance = 16, 0.300, 0.8
    fair = SharedPrices.begin

    def one_row(self, policies):
        fair(self, policies[:1])
        self.members = [p if p.prices is self else None for p in policies]

    monkeypatch.setattr(SharedPrices, "begin", one_row)
    policies, prices = batch(rows, int8_cpu, draft)
    trace = replayed(policies, 30, int8_cpu, draft, lambda step, row: acceptance, prices=prices)
    widest = max(1 + verified for step in trace[2:] for _, verified in step)
    assert widest > break_even(rows, int8_cpu, draft, acceptance) == 1


def test_the_cut_chooses_one_width_for_the_batch_and_a_row_may_draft_nothing():
    """Two rows sharing a forward whose positions are dear: the sure row's drafts pay for the width, the unsure row
    rides along up to it (its drafts there are free); at a width only the unsure row would fill, nothing pays."""
    seconds = np.array([0.0, 1.0, 1.9, 2.8, 3.7, 4.6])  # every position of both rows costs 0.45 s ...
    sure = RowDrafts(np.array([0.99, 0.99, 0.99]), 0.9, 3, asking=False)
    unsure = RowDrafts(np.array([0.2, 0.2, 0.2, 0.2]), 0.2, 4, asking=False)
    assert cut_width([sure, unsure], seconds, 1.0, 0.0) == 4  # ... at a token a second: the sure row's 3 drafts
    assert cut_width([unsure], seconds, 1.0, 0.0) == 1  # alone, the unsure row drafts nothing
    assert cut_width([sure, RowDrafts(np.array([0.99]), 0.9, 8)], seconds, 1.0, 0.0) is None  # a sure row may go on


def test_rows_whose_copies_come_later_fill_the_width_the_cut_chooses_and_widen_nothing():
    """Prompt lookup fills row by row: a row's copies alone do not pay for a position more per row, with a later row's
    copies filling the same width they do; the later row's own copies, sure as they are, widen nothing here (its own
    cut weighs them)."""
    seconds = np.array([0.0, 1.0, 1.6, 2.2, 2.8])  # a position more per row costs 0.6 s, at a token a second
    copies = RowDrafts(np.array([0.5]), 0.5, 4, asking=False)
    later = RowDrafts(np.array([0.5, 0.5, 0.5, 0.5]), 0.5, 4, asking=False, to_come=True)
    assert cut_width([copies], seconds, 1.0, 0.0) == 1
    assert cut_width([copies, later], seconds, 1.0, 0.0) == 2
    sure = RowDrafts(np.full(4, 0.99), 0.9, 4, asking=False, to_come=True)
    assert cut_width([RowDrafts(np.array([0.1]), 0.1, 1, asking=False), sure], seconds, 1.0, 0.0) == 2


@pytest.mark.parametrize("slope, pays", [(0.0094, False), (0.0001, True)])
def test_a_batch_whose_positions_cost_what_its_rows_do_decodes_plainly(slope, pays):
    """16 rows: where each added position costs about what a row's plain token does (T(16) / 16 = 9.4 ms: a CPU's
    arithmetic-bound forward), no draft can pay even if every one is accepted, so after the warm-up the batch decodes
    plainly and never probes; where positions are nearly free (a GPU), it drafts. One row stays open either way."""
    from assisted.policy.auto import AutoState, can_pay, mode
    rows, step = 16, 0.150
    table = CostTable(tuple((n, step + slope * (n - rows), 1.0) for n in (rows, 2 * rows, 4 * rows)), 0.040)
    state, cfg = AutoState(k0=4, costs=table), AutoConfig()
    assert can_pay(state, rows) == pays and can_pay(state, 1)
    assert (mode(state, cfg, rows) == "plain") == (not pays) and mode(replace(state, idle=10**6), cfg, rows) == (
        "plain" if not pays else "draft")


def test_in_a_batch_warm_up_only_the_first_row_drafts():
    """The warm-up times a forward wider than the batch's rows: one row's k0 drafts make it, the others decode plainly
    (each of their drafts would cost a position); once timed, every row drafts by the batch's mode again."""
    prices = SharedPrices(AutoConfig(), prefilled=True)
    policies = [Auto(4, prices=prices) for _ in range(3)]
    prices.begin(policies)
    assert prices.mode == "warm-up" and [p.k for p in policies] == [4, 0, 0]
    prices.mode = "draft"
    for p in policies:
        p.refresh()
    assert [p.k for p in policies] == [policies[0].k] * 3 and policies[0].k > 0

"""The cost-aware policy `Auto`: decode plainly, or draft and cut the draft where it stops paying.

Two decisions, both on costs measured online (`assisted.policy.costs.CostTable`):

- Per drafted token (`Estimates.cut`): draft another token, or stop and verify the first i drafts. A
  draft's acceptance is predicted from the assistant's confidence in it (the max of its distribution),
  calibrated online per confidence bin (each bin starts from what earlier calls on the pair with the same
  sampling learned, or else from the confidence itself, worth one judged draft; for the Qwen pair the
  acceptance per bin is the confidence or a little above it); tokens not drafted yet are predicted to be
  accepted as often as the latest one or as the mean, whichever is higher (optimistic: an unsure token in
  code is often followed by sure ones, and a draft that turns out unsure costs one assistant forward: it is
  dropped unverified). Choices between policies like these were measured with `experiments.policy_replay` (at
  commit ae05ac6: recorded acceptance traces, no timing noise). A step drafts at most a window of four times the
  tokens the previous drafting step committed (its accepted run + 1; k0 at a call's start), as TCP's slow start
  sizes its bets: the calibration learns only from verified drafts, and early in a call (or where the
  assistant is sure but the target is not: prose, high temperatures) one uncut 20-token draft costs several
  plain steps.
  The cut maximizes expected accepted tokens - price * seconds: a confident run of code is drafted long,
  and an unsure draft is not verified where verification is expensive. A second is priced at what the
  call can commit in it, the better of plain decoding's rate and the measured drafting rate (Dinkelbach's
  method for the best ratio of tokens to seconds; the drafting rate is decayed over steps, so one lucky
  step barely moves it). Priced at plain decoding's rate alone, a draft would go on while it saves time over
  plain decoding, even where the time would commit more in a shorter draft and the next step.
- One measure of worth (`worth`), for every draft source (an assistant of the same or another tokenizer,
  prompt lookup) and acceptance rule (greedy, speculative sampling, point masses accepted with the target's
  p(x)): each judged draft's predicted acceptance is checked against the target's verdict; decayed accepted
  drafts over decayed predicted ones, past what luck explains (`worth_noise` standard deviations), scales every
  predicted acceptance. A point-mass draft from another tokenizer, which its assistant is sure of whatever the
  target thinks, is then valued at what it commits, not at its assistant's confidence.
- Per step (`choose`): draft or decode plainly. Plain decoding commits 1 / target(1) tokens per second;
  the drafting rate is measured over the call's drafting steps (decayed tokens each step is expected to commit
  under the checked estimates / seconds of both models, forced tokens left out: the mean of what it committed,
  without the luck of one rejection). While plain decoding is faster, a drafting step (a probe) is retried
  once the plain steps since the last drafting step took long enough that what a step like it is expected to
  lose against plain decoding (its seconds times the rate deficit) is at most `probe_budget` of their time.
  The bound: while plain decoding is faster, probes lose in expectation at most `probe_budget` (3%) times the most
  drafting could save (`upside`: every draft accepted) of the time spent decoding plainly, plus the call's first
  `min_drafting_steps` drafting steps; where even every draft accepted would lose, a call never probes. A step that
  explores (those first steps, probes) drafts at most what could lose one plain step should the target accept no more
  of its drafts than of the row's last verified ones (`safe_drafts`; every draft rejected at a call's start), whatever
  the assistant's confidence claims before the target judged any of its drafts (another tokenizer's text: sure, often
  wrong): slow start, so a row whose drafts were all accepted about doubles its bet. The rate that decides is read with
  hope (`optimism` standard deviations above each acceptance): one early miss of a sure draft, which thin evidence
  cannot tell from a poor assistant, does not end drafting. A probe cut at its first token costs one assistant forward
  and comes back soon, so does a near tie (one unlucky rejection must not lock a call into plain decoding); a long
  draft far behind comes back rarely.

- Per call, when to start the assistant (`catching_up`): it starts lazily, so its first call feeds the whole prompt
  (its prefill), which a short output may never earn back. Where earlier calls on the pair measured that catch-up
  (seconds per position, `CostTable.catch_up`), a call decodes plainly (forced runs and prompt-lookup copies are
  free) until its plain steps have lost, by the estimate, as much as the catch-up would cost: each plain step loses
  its seconds times the share drafting saves (1 - plain rate / drafting rate, the call's or the pair's remembered;
  at least `probe_budget`; all of it where neither is known). That is ski rental: a call never pays more than twice
  what the better of starting at once and never starting would have cost, had it known its length. Each row of a
  batch waits alike for its own assistant (filled lazily, it has run for no row yet), paying its share of the
  shared forward: so a batch's last row, alone in a forward where drafts could pay, does not catch up on its whole
  context to draft its last few tokens.
- Per draft tree (`Estimates.leaf_pays`, `generate(tree=True)`): verify the assistant's runner-up as a side
  leaf, or not. The leaf commits one more token when the chain is accepted up to its sibling, the sibling is
  rejected and the target picks the runner-up there: the product of the chain's predicted acceptances before
  the sibling, one minus the sibling's, and the runner-up's, predicted from the assistant's confidence in it
  among the rest and calibrated online like the chain's (`observe_leaf`). Whether the target picked the
  runner-up where it rejected the sibling is seen whether or not the leaf was verified (greedy: the same
  event; sampling without the leaf: the residual draw, a lower estimate), so a leaf priced out still teaches
  the calibration. It pays when that beats the price of one more verification row, target(rows + 1) -
  target(rows) seconds at the cut's price; fixed schedules always verify it.

`observe` (state, step -> state), `observe_leaf`, `choose` (state -> k) and `estimate` (state -> Estimates) are
pure, so traces can be replayed and tested without models.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from assisted.policy.costs import N_MAX, CostTable, StepCost
from assisted.policy.estimates import CONFIDENCE_BINS, RUN_BINS, Calibration, Estimates, confidence_bins, run_bins

if TYPE_CHECKING:
    from drafting.base import Draft
    from drafting.tree import Branch

__all__ = ["CONFIDENCE_BINS", "Auto", "AutoConfig", "AutoState", "Calibration", "Estimates", "catching_up", "choose",
           "confidence_bins", "estimate", "observe", "observe_leaf", "paid_rent"]


@dataclass(frozen=True)
class AutoConfig:
    """Knobs of the cost-aware policy; each default is a plain, conservative choice."""

    k_max: int = 20  # never draft more in one step (transformers' default draft length)
    acceptance_prior: float = 0.6  # mean acceptance before any evidence of the call ...
    prior_weight: float = 1.0  # ... worth this many judged tokens
    acceptance_decay: float = 0.8  # per judged step: the estimate follows the text (code, prose, JSON values)
    calibration_decay: float = 0.95  # per judged step, in the confidence bins it touches
    rate_decay: float = 0.8  # per timed drafting step: the drafting rate follows the text
    cost_decay: float = 0.9  # per timed forward: old timings fade (load on a shared machine changes)
    min_drafting_steps: int = 2  # timed drafting steps of a call before plain decoding can win
    probe_budget: float = 0.03  # while plain decoding is faster, probes may lose at most this share of the time
    optimism: float = 0.5  # standard deviations above the calibration's mean where a cut would verify nothing
    window_growth: int = 4  # a step drafts at most this many times what the last drafting step committed
    worth_decay: float = 0.8  # per judged step: drafts predicted accepted against drafts accepted (`worth`)
    worth_weight: float = 2.0  # `worth` starts at 1 (the estimates hold), worth this many judged drafts
    worth_max: float = 1.5  # predicted acceptance is scaled by at most this much (and held at most 1)
    worth_noise: float = 2.0  # standard deviations of accepted drafts that `worth` reads as luck
    catch_up_min: int = 16  # an assistant's first call catching up on fewer positions is not timed as its prefill


@dataclass(frozen=True)
class AutoState:
    """What the policy has observed: costs (possibly from earlier calls), acceptance, the drafting rate."""

    k0: int  # drafts per step while the cost table lacks a timing with drafts (no cut then)
    costs: CostTable = CostTable()
    judged: float = 0.0  # decayed judged assistant drafts (the prior is added when estimating)
    accepted: float = 0.0  # decayed accepted assistant drafts
    lookup_judged: tuple[float, ...] = (0.0,) * len(RUN_BINS)  # the same for prompt-lookup drafts, per place in
    lookup_accepted: tuple[float, ...] = (0.0,) * len(RUN_BINS)  # the copied run (`RUN_BINS`)
    calibration: Calibration = field(default_factory=Calibration)
    drafting_tokens: float = 0.0  # decayed expected tokens of timed drafting steps (forced tokens left out)
    drafting_seconds: float = 0.0  # their decayed seconds, both models
    drafting_hope: float = 0.0  # decayed tokens of those steps with every acceptance read `optimism` stds higher
    drafting_steps: int = 0  # timed drafting steps so far
    prefilled: bool = False  # the call's first target forward (the prompt's prefill) is not recorded
    drafted_before: bool = False  # the call's first assistant call (the assistant's prefill) is not recorded
    idle: int = 0  # steps since the last drafting step
    probe_loss: float = 0.0  # expected seconds a drafting step as long as the last one loses to plain decoding
    window: int = 0  # the most drafts of the next step: window_growth * (last accepted run + 1) (0: k0)
    leaf_calibration: Calibration = field(default_factory=Calibration)  # the runner-up's, given its confidence
    predicted: float = 0.0  # decayed sum of the acceptance estimated for each judged draft (calibration's mean) ...
    realized: float = 0.0  # ... and the decayed drafts the target accepted: `worth` checks one against the other
    spread: float = 0.0  # ... and their variance were the estimates right (decayed sum of a (1 - a))
    lag: int = 0  # positions of the row the assistant's cache lacks (told by the engine before each step)
    rent: float = 0.0  # seconds the row's plain steps lost, by the estimate, while its assistant had not started
    started: bool = False  # the assistant has drafted for this row this call (its catch-up is behind it)


NEVER = 2**62  # plain steps before a probe where no draft can pay (`_wait`)
# what the rows of one forward share (`assisted.policy.prices`); the rest is each row's own
PRICES = ("costs", "drafting_tokens", "drafting_seconds", "drafting_hope", "drafting_steps", "prefilled",
          "drafted_before", "idle", "probe_loss")


def observe(state: AutoState, drafted: int, accepted: int, cost: StepCost | None, cfg: AutoConfig,
            confidence: tuple[float, ...] = ()) -> AutoState:
    """The state after one step of a row decoded alone: `learn` what the target judged, then `time_step` what the
    step cost. The target judged the first `drafted` of the verified drafts (the assistant's confidence in each
    verified draft: `confidence`; NaN, or missing, for prompt-lookup drafts) and accepted `accepted`."""
    row = learn(state, drafted, accepted, cost is not None and cost.drafted > 0, cfg, confidence)
    return time_step(row, cost, cfg, [(row, confidence)])


def learn(state: AutoState, drafted: int, accepted: int, asked: bool, cfg: AutoConfig,
          confidence: tuple[float, ...] = ()) -> AutoState:
    """A row's beliefs after the target judged its drafts (`asked`: the assistant drafted for it this step): mean
    acceptance of assistant and prompt-lookup drafts, the calibration, and the window (a step that verified drafts
    sets it to `window_growth` x its accepted run + 1, the assistant's or, where it did not draft, the prompt-lookup
    copies'; one whose cut verified nothing says nothing about it)."""
    verified = confidence + (math.nan,) * (drafted - len(confidence))  # missing: no confidence, like lookup
    judged = estimate(state, cfg).accepts(verified[:drafted], checked=False)  # (drafted,) as estimated
    lookup, ok = np.isnan(np.asarray(verified[:drafted], dtype=float)), np.arange(drafted) < accepted  # (drafted,)
    d = cfg.acceptance_decay if (~lookup).any() else 1.0
    place = run_bins(np.asarray(verified[:drafted], dtype=float))[lookup]  # each judged copy token's place in its run
    judged_at = np.bincount(place, minlength=len(RUN_BINS))  # (bins,) judged copy tokens per place
    new = replace(state, judged=d * state.judged + int((~lookup).sum()),
                  accepted=d * state.accepted + int((ok & ~lookup).sum()),
                  lookup_judged=_faded(state.lookup_judged, judged_at, judged_at, cfg.acceptance_decay),
                  lookup_accepted=_faded(state.lookup_accepted, judged_at,
                                         np.bincount(place, ok[lookup], minlength=len(RUN_BINS)), cfg.acceptance_decay),
                  calibration=state.calibration.observed(confidence[:drafted], accepted, cfg.calibration_decay))
    if drafted:  # the estimate of each judged draft's acceptance, against the target's verdicts
        new = replace(new, predicted=cfg.worth_decay * state.predicted + float(judged.sum()),
                      realized=cfg.worth_decay * state.realized + accepted,
                      spread=cfg.worth_decay * state.spread + float((judged * (1.0 - judged)).sum()))
    return replace(new, window=cfg.window_growth * (accepted + 1)) if drafted and (asked or lookup.all()) else new


def _faded(counts: tuple[float, ...], judged: np.ndarray, new: np.ndarray, decay: float) -> tuple[float, ...]:
    """Per-place decayed counts plus `new`; only the places this step judged fade."""
    return tuple((np.where(judged > 0, decay, 1.0) * np.asarray(counts) + new).tolist())


def time_step(prices: AutoState, cost: StepCost | None, cfg: AutoConfig,
              rows: list[tuple[AutoState, tuple[float, ...]]], width: int = 1) -> AutoState:
    """The prices after one step whose forward served `rows` (each row's beliefs after `learn`, and the assistant's
    confidence in each draft it verified) with `width` rows: the cost table, and for a drafting step the rates.

    A drafting step counts its *expected* tokens, for each row 1 + its verified drafts' survival probabilities
    under its updated calibration: the same mean as the tokens committed, without the luck of one rejection.
    The timings of the first target forward (the prompt's prefill) and first assistant call (the assistant's
    prefill) say nothing about a decoding step and are not recorded; a drafting step that holds one still counts
    toward the drafting rate, at the seconds the cost table predicts for it (its tokens are evidence like any other
    step's: a call that starts with a lucky or an unlucky draft is not judged on the two steps after it alone).
    The warm-up's uncut drafts are not recorded.
    """
    costs, prefilled, drafted_before = prices.costs, prices.prefilled, prices.drafted_before
    step_seconds = _step_seconds(prices, cost, max((len(c) for _, c in rows), default=0), width)
    timed = step_seconds is not None and warmed_up(prices, width)
    if cost is not None and cost.target_tokens:
        if prefilled:
            costs = costs.with_target(cost.target_tokens, cost.target_seconds, cfg.cost_decay, N_MAX * width)
        prefilled = True
    if cost is not None and cost.drafted:
        costs = costs.with_draft(cost.draft_seconds / cost.drafted, cfg.cost_decay) if drafted_before else costs
        asked = [row for row, confidence in rows if confidence] or [row for row, _ in rows]  # the rows it drafted for
        lag = sum(row.lag for row in asked)
        if not drafted_before and lag >= cfg.catch_up_min:  # the assistant's prefill: seconds per position it fed
            costs = costs.with_catch_up(cost.draft_seconds / (lag + cost.drafted), cfg.cost_decay)
        drafted_before = True
    new = replace(prices, costs=costs, prefilled=prefilled, drafted_before=drafted_before)
    if cost is None or not cost.drafted:  # no assistant call: a plain step (prompt-lookup drafts are free)
        return replace(new, idle=prices.idle + 1)
    if not timed:
        return replace(new, idle=0)
    tokens, hope = cfg.rate_decay * prices.drafting_tokens, cfg.rate_decay * prices.drafting_hope
    for row, confidence in rows:  # expected under the checked estimates: the mean of what it committed, without luck
        est = estimate(priced(row, new), cfg, width)
        tokens += 1.0 + float(np.cumprod(est.accepts(confidence)).sum())
        hope += 1.0 + float(np.cumprod(est.accepts(confidence, cfg.optimism)).sum())
    seconds = cfg.rate_decay * prices.drafting_seconds + step_seconds
    plain_tokens = seconds * estimate(new, cfg, width).plain_rate  # what plain decoding commits in that time
    deficit = 1.0 - tokens / plain_tokens if plain_tokens > 0 else 0.0
    return replace(new, idle=0, drafting_tokens=tokens, drafting_seconds=seconds, drafting_hope=hope,
                   drafting_steps=prices.drafting_steps + 1, probe_loss=step_seconds * max(deficit, 0.0))


def priced(beliefs: AutoState, prices: AutoState) -> AutoState:
    """A row's beliefs with the prices of the forward it shares (the same object when it is decoded alone)."""
    return beliefs if beliefs is prices else replace(beliefs, **{f: getattr(prices, f) for f in PRICES})


def observe_leaf(state: AutoState, confidence: float, picked: bool, cfg: AutoConfig) -> AutoState:
    """The state after the target rejected a branch's sibling and did (`picked`) or did not take the runner-up
    of this `confidence` there."""
    calibration = state.leaf_calibration.observed((confidence,), int(picked), cfg.calibration_decay)
    return replace(state, leaf_calibration=calibration)


def _step_seconds(state: AutoState, cost: StepCost | None, verified: int, width: int = 1) -> float | None:
    """The step's seconds without prefills: as measured, or for a step that holds a prefill as the cost table
    predicts for its forward over `verified` drafts and its drafted tokens (None: no target forward, or no
    assistant timing to predict with)."""
    if cost is None or not cost.target_tokens:
        return None
    if state.prefilled and state.drafted_before:
        return cost.seconds
    if state.costs.draft_per_token is None:
        return None
    return float(state.costs.curve(verified + 1, width)[verified + 1]) + cost.drafted * state.costs.draft_per_token


def estimate(state: AutoState, cfg: AutoConfig, width: int = 1) -> Estimates:
    """Current beliefs: the target's cost curve, the assistant's cost, acceptance and both modes' rates; for a
    forward of `width` rows, the curve at n positions per row and the batch's rates."""
    prior = cfg.acceptance_prior * cfg.prior_weight
    acceptance = (state.accepted + prior) / (state.judged + cfg.prior_weight)
    lookup = (np.asarray(state.lookup_accepted) + prior) / (np.asarray(state.lookup_judged) + cfg.prior_weight)
    curve = tuple(state.costs.curve(cfg.k_max + 1, width).tolist())
    plain = width / curve[1] if curve[1] > 0 else 0.0
    drafting = state.drafting_tokens / state.drafting_seconds if state.drafting_seconds > 0 else None
    return Estimates(curve, state.costs.draft_per_token or 0.0, acceptance, state.calibration, plain, drafting,
                     tuple(lookup.tolist()), cfg.optimism, max(state.window, state.k0), state.leaf_calibration,
                     worth(state, cfg))


def worth(state: AutoState, cfg: AutoConfig) -> float:
    """The check of the estimates against the target's verdicts: decayed accepted drafts over the decayed sum of the
    acceptance the estimates predicted for each judged draft (before the target judged it; drafts up to the first
    rejection, so the two have the same mean where the estimates hold), for every source (assistant, another
    tokenizer's text, prompt lookup) and acceptance rule alike. Every predicted acceptance is scaled by it (at most 1).
    Starts at 1, worth `worth_weight` judged drafts; only the part of the difference past `worth_noise` standard
    deviations of what right estimates would give counts (one miss in a long sure run is luck, not a bias)."""
    w, miss = cfg.worth_weight, state.realized - state.predicted
    noise = cfg.worth_noise * math.sqrt(state.spread + w / 4)  # `worth_weight` drafts of unknown acceptance add theirs
    excess = math.copysign(max(abs(miss) - noise, 0.0), miss)
    return min((state.predicted + excess + w) / (state.predicted + w), cfg.worth_max)


def saving(state: AutoState, cfg: AutoConfig, width: int = 1) -> float:
    """The share of a plain step's seconds drafting is expected to save in a forward over `width` rows: 0 where no
    draft can pay there (`can_pay`); else 1 - plain rate / drafting rate (the call's measured rate, else for one row
    the pair's remembered one, a one-row rate), at least `probe_budget`; 1 where no rate is known."""
    if not can_pay(state, width):
        return 0.0
    est = estimate(state, cfg, width)
    rate = est.drafting_rate or (state.costs.drafting_rate if width == 1 else None)
    return 1.0 if not rate else max(cfg.probe_budget, 1.0 - est.plain_rate / rate)


def paid_rent(beliefs: AutoState, prices: AutoState, cost: StepCost | None, cfg: AutoConfig,
              width: int = 1) -> AutoState:
    """The row's beliefs after a step: a plain step taken while its assistant had not started (`prices`: what the row
    decided by, before the step) adds its expected loss against drafting to `rent`: its share of a forward over
    `width` rows, times the share drafting saves."""
    plain = cost is not None and cost.target_tokens and not cost.drafted
    if not plain or prices.started:
        return beliefs
    share = float(prices.costs.curve(1, width)[1]) / width
    return replace(beliefs, rent=beliefs.rent + share * saving(prices, cfg, width))


def catching_up(state: AutoState) -> bool:
    """Whether the row decodes plainly while its assistant waits (the module docstring): the assistant has not drafted
    for it this call, and catching up on the row's `lag` positions would cost more than the `rent` its plain steps
    paid."""
    price = state.costs.catch_up
    return (not state.started and price is not None and state.costs.curve(1)[1] > 0
            and state.rent < state.lag * price)


def _drafting_pays(state: AutoState, cfg: AutoConfig, width: int = 1) -> bool:
    """The call's first `min_drafting_steps` drafting steps, then while their rate read with hope is plain decoding's
    or better: every acceptance at `optimism` standard deviations above its estimate, so one early miss of a sure
    draft, which thin evidence cannot tell from a poor assistant, does not stop drafting (UCB's optimism under
    uncertainty); with much evidence hope is the mean."""
    return state.drafting_steps < cfg.min_drafting_steps or _measured_to_pay(state, width)


def _measured_to_pay(state: AutoState, width: int = 1) -> bool:
    """The call's drafting steps, read with hope (`_drafting_pays`), commit at least plain decoding's tokens per
    second."""
    step = state.costs.curve(1, width)[1]
    plain = width / step if step > 0 else 0.0
    return state.drafting_seconds > 0 and state.drafting_hope / state.drafting_seconds >= plain


def _wait(state: AutoState, cfg: AutoConfig, width: int = 1) -> int:
    """Plain steps before the next probe: enough that its expected loss is the probe budget of them (`probe_budget`
    times the most drafting could save, `upside`). A probe explores: it loses what a step as long as the last drafting
    step did, or if shorter, a step of `safe_drafts` at the same rate deficit."""
    step = state.costs.curve(1, width)[1]
    budget = cfg.probe_budget * upside(state, cfg.k_max, width)
    if step <= 0:
        return 1
    return max(1, math.ceil(_probe_loss(state, cfg, width) / (budget * step))) if budget > 0 else NEVER


def _probe_loss(state: AutoState, cfg: AutoConfig, width: int = 1) -> float:
    """The expected seconds the next probe loses against plain decoding (`_wait`)."""
    costs, est = state.costs, estimate(state, cfg, width)
    if costs.draft_per_token is None or not est.drafting_rate or est.plain_rate <= 0:
        return state.probe_loss
    seconds = drafting_step_seconds(costs, cfg.k_max, width)[safe_drafts(state, cfg.k_max, width) - 1]
    return min(state.probe_loss, seconds * max(0.0, 1.0 - est.drafting_rate / est.plain_rate))


def best_drafting_rate(state: AutoState, k_max: int, width: int = 1) -> float | None:
    """Tokens per second of drafting at its best, every draft accepted: the most of w (k + 1) / (k d + T(w (k + 1)))
    over k = 1..k_max (d: an assistant round). None where the plain forward of `width` rows or the assistant was never
    timed: the curve below its smallest timing is a guess."""
    costs = state.costs
    if width not in costs.measured() or costs.draft_per_token is None:
        return None
    k = np.arange(1, k_max + 1)  # (k_max,)
    best = float((width * (k + 1) / drafting_step_seconds(costs, k_max, width)).max())
    return max(best, costs.drafting_rate or 0.0) if width == 1 else best


def drafting_step_seconds(costs: CostTable, k_max: int, width: int = 1) -> np.ndarray:
    """(k_max,) seconds of a step of k = 1..k_max drafts per row over `width` rows: k assistant rounds and the target's
    forward over k + 1 positions per row (the cost table must hold the assistant's seconds)."""
    k = np.arange(1, k_max + 1)  # (k_max,)
    return k * costs.draft_per_token + costs.curve(k_max + 1, width)[k + 1]


def upside(state: AutoState, k_max: int, width: int = 1) -> float:
    """The most drafting could save of plain decoding's time, every draft accepted: 1 - plain rate / the best drafting
    rate (0 where it cannot pay; 1 where that is unknown)."""
    best, step = best_drafting_rate(state, k_max, width), state.costs.curve(1, width)[1]
    return 1.0 if best is None or step <= 0 else max(0.0, 1.0 - width / step / best)


def can_pay(state: AutoState, width: int = 1) -> bool:
    """Whether drafting could beat plain decoding at all in a forward over `width` > 1 rows, every draft accepted:
    only where a drafted position costs less than a plain token, T(w) / w. A drafted position costs the target's added
    seconds per added position, the slope from T(w) to the widest forward timed, plus its share of an assistant round
    (the round's seconds / w). Where the forward is bound by its arithmetic (many rows on a CPU) the slope is about
    T(w) / w and no draft can pay, however good: such a batch decodes plainly and never probes. One row's forward
    is bound by its weights' bytes, its cost curve concave (the first added position is the dearest), so a straight
    line through it would shut out drafts that pay: there, and where costs are unknown, it stays open."""
    costs = state.costs
    wider = [n for n in costs.measured() if n > width]
    if width == 1 or not costs.knows(width) or not wider or costs.draft_per_token is None:
        return True
    n = max(wider)
    plain, widest = costs.curve(n, 1)[[width, n]]
    per_position = (widest - plain) / (n - width) + costs.draft_per_token / width
    return per_position < plain / width


def warmed_up(state: AutoState, width: int = 1) -> bool:
    """The cost table prices a forward that verifies none (of `width` rows: `CostTable.knows`) and holds one that
    verified drafts."""
    return state.costs.knows(width) and any(n > width for n in state.costs.measured())


def mode(state: AutoState, cfg: AutoConfig, width: int = 1) -> str:
    """What the next step does: "warm-up" (k0 uncut drafts, to time a forward that verifies drafts), "plain" or
    "draft" (up to the window, cut by `Estimates.cut`).

    Warm-up: until the cost table holds a forward that verified drafts, k0 drafts; until it can price one that
    verifies none (`CostTable.knows`), k = 0. A table remembered from an earlier call on the same pair skips both.
    Where the costs say no draft can pay (`can_pay`), plain decoding from then on. Otherwise each call drafts until
    its drafting rate is measured over `min_drafting_steps` steps, and keeps drafting while that rate is at least
    plain decoding's, probing again after a budgeted loss.
    """
    if not any(n > width for n in state.costs.measured()):
        return "warm-up"
    if not state.costs.knows(width) or not can_pay(state, width):
        return "plain"
    if _drafting_pays(state, cfg, width) or state.idle >= _wait(state, cfg, width):
        return "draft"
    return "plain"


def choose(state: AutoState, cfg: AutoConfig, width: int = 1) -> int:
    """The draft cap for the next step: the window, at most k_max (drafting, cut by `Estimates.cut`), or 0
    (plain decoding); k0 (or 1) during the warm-up (`mode`)."""
    return cap(state, cfg, mode(state, cfg, width), width)


def cap(state: AutoState, cfg: AutoConfig, step: str, width: int = 1) -> int:
    """A row's draft cap in a step of this `mode`."""
    if step == "warm-up":
        return state.k0 or 1
    return min(cfg.k_max, window(state, cfg, width)) if step == "draft" else 0


def window(state: AutoState, cfg: AutoConfig, width: int = 1) -> int:
    """The most drafts of the next drafting step: `window_growth` x the last accepted run + 1, at least k0; at most
    `safe_drafts` in a step that explores (a call's first steps and probes: drafting has not been measured to pay),
    given the row's last accepted run (`last_run`)."""
    grown = max(state.window, state.k0)
    if not _explores(state, cfg, width):
        return grown
    return min(grown, safe_drafts(state, cfg.k_max, width, last_run(state, cfg)))


def last_run(state: AutoState, cfg: AutoConfig) -> int:
    """The drafts the target accepted in a row of the row's last step that verified drafts (0 before any)."""
    return max(0, state.window // cfg.window_growth - 1)


def _explores(state: AutoState, cfg: AutoConfig, width: int = 1) -> bool:
    """Whether a drafting step would explore: the call's drafting steps (read with hope) do not commit plain decoding's
    rate, or before `min_drafting_steps` of them, no earlier call on the pair measured drafting faster (one row)."""
    if state.drafting_steps >= cfg.min_drafting_steps:
        return not _measured_to_pay(state, width)
    remembered, step = state.costs.drafting_rate if width == 1 else None, state.costs.curve(1, width)[1]
    return not (remembered and step > 0 and remembered >= width / step)


def safe_drafts(state: AutoState, k_max: int, width: int = 1, run: int = 0) -> int:
    """The most drafts of an exploring step: the most that could pay (every draft accepted) and lose at most one plain
    step should the target accept no more of them than the `run` it accepted of the row's last verified drafts (every
    draft rejected, where none were), whatever the assistant's confidence says before the target judged its drafts:
    slow start, so a row whose drafts were all accepted doubles its bet, and one that met a rejection bets little.
    Where a concave curve makes every such bet lose, the fewest that could pay. k_max where the costs are not timed."""
    costs = state.costs
    if width not in costs.measured() or costs.draft_per_token is None:
        return k_max
    plain, k = costs.curve(1, width)[1], np.arange(1, k_max + 1)  # (k_max,)
    step = drafting_step_seconds(costs, k_max, width)  # (k_max,) a step of k drafts
    pays = (k + 1) / step > 1 / plain
    safe = k[(step <= (np.minimum(k, run) + 2) * plain) & pays]
    return int(safe.max()) if len(safe) else int(k[pays].min()) if pays.any() else 1


class Auto:
    """Cost-aware drafting: plain decoding or confidence-cut drafts, whichever commits more tokens per second.

    Parameters
    ----------
    k : int
        Drafts per step while the costs of verifying drafts have not been timed (the warm-up; then one
        step at k = 0 is timed too), unless `costs` already holds such timings; then the most drafts of
        the call's first drafting step (the window then follows the accepted runs).
    config : AutoConfig, optional
        Decays, priors, k_max and probing.
    costs : CostTable, optional
        Costs measured by earlier calls on the same model pair and device (`assisted.policy.costs.recall`).
    calibration : Calibration, optional
        Acceptance per confidence bin learned by earlier calls on the pair with the same sampling
        (`assisted.policy.costs.recall_calibration`); each bin starts from the confidence itself otherwise.
    prices : assisted.policy.prices.SharedPrices, optional
        The costs and rates of the forwards this row shares with others (one engine's rows, `costs` then unused):
        it decides by them, and the engine times each step once for all rows. None: the row prices alone.

    Notes
    -----
    `k` is the cap the loop drafts up to (the window, or 0); after each drafted token the loop asks `cut`
    whether to go on and how many drafts to verify. The module docstring gives the model.
    """

    def __init__(self, k: int, config: AutoConfig | None = None, costs: CostTable | None = None,
                 calibration: Calibration | None = None, prices=None):
        self.config, self.prices = config or AutoConfig(), prices
        self.state = AutoState(k0=k, costs=costs or CostTable(), calibration=calibration or Calibration())
        self.refresh()

    def update(self, drafted: int, accepted: int, cost: StepCost | None = None,
               confidence: tuple[float, ...] = ()) -> None:
        before = self.priced
        if self.prices is None:
            self.state = observe(self.state, drafted, accepted, cost, self.config, confidence)
        else:  # the engine times the shared forward once, after every row has learned (`SharedPrices.observe`)
            self.state = learn(self.state, drafted, accepted, cost is not None and cost.drafted > 0, self.config,
                               confidence)
        width = 1 if self.prices is None else self.prices.width
        self.state = paid_rent(self.state, before, cost, self.config, width)
        if cost is not None and cost.drafted and (self.prices is None or confidence):  # it drafted for this row
            self.state = replace(self.state, started=True)
        self.refresh()

    def assistant_behind(self, positions: int) -> None:
        """The assistant's cache lacks this many of the row's positions (what its next call would catch up on)."""
        self.state = replace(self.state, lag=positions)
        self.refresh()

    @property
    def priced(self) -> AutoState:
        """This row's beliefs at the prices it decides by."""
        return self.state if self.prices is None else priced(self.state, self.prices.state)

    @property
    def lookup_k(self) -> int:
        """Prompt lookup drafts are free: they are offered even in plain decoding, and the cut weighs them."""
        return self.config.k_max

    def cut(self, confidence: tuple[float, ...], peers: Sequence = ()) -> int | None:
        """None: draft another token; else verify the first this-many drafts (no cut during the warm-up). `peers`:
        every row's `drafting.proposal.Proposal` this step (slot order), where the row is priced with others."""
        if not self._cuts:
            return None
        if self.prices is None:
            return self._estimates.cut(confidence, self.config.k_max)
        return self.prices.cut(self, confidence, peers)

    def leaf_pays(self, draft: Draft, branch: Branch, rows: int, feeds: Sequence[int] = ()) -> bool:
        """Whether `branch`, a side leaf of `draft`, pays for one more row next to the draft's `rows`
        (`Estimates.leaf_pays`; in a batch, next to the other rows' `feeds`: per slot, the tokens each feeds).

        Greedy, a leaf after which the target's token is not committed (EOS, a coalesced forced run) commits no
        more than the target's correction would: it never pays. Sampling, that depends on the runner-up drawn,
        and whether a leaf is verified must not (the accepted tokens would lean), so it is not asked.
        """
        if draft.q is None and not branch.bonus:
            return False
        confidence = draft.model_confidence
        ahead = sum(s != "forced" for s in draft.sources[: branch.at])  # model drafts before the sibling
        beside = 0 if self.prices is None else self.prices.beside(self, feeds)
        return self._estimates.leaf_pays(confidence[:ahead], confidence[ahead], branch.confidence, rows, beside)

    def observe_leaf(self, confidence: float, picked: bool) -> None:
        self.state = observe_leaf(self.state, confidence, picked, self.config)
        self.refresh()

    def estimates(self) -> Estimates:
        return self._estimates

    def learned(self) -> CostTable:
        """The costs this row priced by, with the call's drafting rate folded into the pair's."""
        state = self.priced
        if state.drafting_seconds <= 0:
            return state.costs
        return state.costs.with_drafting_rate(state.drafting_tokens / state.drafting_seconds, self.config.rate_decay)

    def calibration(self) -> Calibration:
        return self.state.calibration

    def refresh(self) -> None:
        """Decide the next step from the current beliefs and prices (`SharedPrices` asks again once it has timed a
        step)."""
        width, state = (1 if self.prices is None else self.prices.width), self.priced
        step = mode(state, self.config, width) if self.prices is None else self.prices.mode_for(self)
        self.k = cap(state, self.config, "plain" if catching_up(state) else step, width)
        self._estimates, self._cuts = estimate(state, self.config, width), warmed_up(state, width)

"""Candidate-length policies: how many model-drafted tokens to ask for in the next step.

Forced tokens are free and never count against k. After every step a policy is told how many
assistant tokens the target judged (up to the first rejection) and accepted, and, for the cost-aware
policy, what the step cost: a `StepCost` of wall times the loop measured around calls it made anyway.

`Auto` keeps its knowledge in a frozen `AutoState`; `observe` (state, step -> state) and `choose`
(state -> k) are pure functions, so traces can be replayed and tested without models.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from assisted.costs import CostTable


@dataclass(frozen=True)
class StepCost:
    """Wall times of one step, as the loop measured them."""

    target_tokens: int  # tokens fed to the target forward (uncached + draft; the bonus row is the last); 0: none
    target_seconds: float  # that forward's wall time
    drafted: int  # assistant tokens drafted (one assistant forward each)
    draft_seconds: float  # their wall time


@dataclass(frozen=True)
class Estimates:
    """A cost-aware policy's beliefs: what a step with k drafts costs and how many tokens it commits."""

    target_seconds: tuple[float, ...]  # [n]: seconds of a target forward over n tokens, n = 0..k_max + 1
    draft_per_token: float  # seconds per assistant token (one assistant forward)
    acceptance: float  # probability that the target accepts an assistant token (decayed estimate)

    def expected_tokens(self, k: int) -> float:
        """Committed tokens of a step with k drafts: sum of acceptance^i for i in 0..k."""
        return float(self._tokens(np.array([k]))[0])

    def seconds(self, k: int) -> float:
        """Cost of a step with k drafts: one target forward over k + 1 tokens and k assistant forwards."""
        return max(self.target_seconds[k + 1] + self.draft_per_token * k, 1e-9)

    def best_k(self, k_max: int) -> int:
        """The k in 0..k_max with the most expected committed tokens per second (the smallest on ties)."""
        ks = np.arange(k_max + 1)  # (k_max + 1,)
        seconds = np.maximum(np.asarray(self.target_seconds[1 : k_max + 2]) + self.draft_per_token * ks, 1e-9)
        return int(np.argmax(self._tokens(ks) / seconds))

    def _tokens(self, ks: np.ndarray) -> np.ndarray:
        a = self.acceptance
        return ks + 1.0 if a >= 1.0 else (1.0 - a ** (ks + 1.0)) / (1.0 - a)


class Policy(Protocol):
    k: int  # model-drafted tokens to ask for next

    def update(self, drafted: int, accepted: int, cost: StepCost | None = None) -> None:
        """`drafted` assistant tokens were judged by the target, `accepted` of them accepted."""

    def estimates(self) -> Estimates | None:
        """What a cost-aware policy believes now; None for the others."""

    def learned(self) -> CostTable | None:
        """The costs the next call on the same model pair should start from; None for the others."""


class Constant:
    """Always the same k."""

    def __init__(self, k: int):
        self.k = k

    def update(self, drafted: int, accepted: int, cost: StepCost | None = None) -> None:
        pass

    def estimates(self) -> None:
        return None

    def learned(self) -> None:
        return None


class Heuristic(Constant):
    """transformers' original assisted generation: +2 when every draft was accepted, else -1 (min 1).

    Steps in which the target judged no assistant token leave k alone.
    """

    def update(self, drafted: int, accepted: int, cost: StepCost | None = None) -> None:
        if drafted:
            self.k = self.k + 2 if accepted == drafted else max(1, self.k - 1)


@dataclass(frozen=True)
class AutoConfig:
    """Knobs of the cost-aware policy; each default is a plain, conservative choice."""

    k_max: int = 16  # never ask for more (expected tokens saturate below 1 / (1 - acceptance))
    acceptance_prior: float = 0.6  # believed acceptance before any evidence of the call ...
    prior_weight: float = 1.0  # ... worth this many judged tokens (one accepted probe of 2 makes it 0.87)
    acceptance_decay: float = 0.8  # per judged step: the estimate follows the text (code, prose, JSON values)
    cost_decay: float = 0.9  # per timed forward: old timings fade (load on a shared machine changes)
    probe_every: int = 8  # at k = 0, draft again after this many steps without drafts ...
    probe_backoff: int = 3  # ... doubling the wait after each probe that changes nothing, at most this often ...
    probe_k: int = 2  # ... this many tokens, so that returning acceptance is noticed ...
    probe_acceptance: float = 0.95  # ... but only if drafting would pay at this acceptance (or the estimate)


@dataclass(frozen=True)
class AutoState:
    """What the policy has observed: costs (possibly from earlier calls) and decayed acceptance counts."""

    k0: int  # the starting k, used while the cost table lacks a timing with drafts
    costs: CostTable = CostTable()
    judged: float = 0.0  # decayed judged assistant tokens (the prior is added when estimating)
    accepted: float = 0.0  # decayed accepted assistant tokens
    prefilled: bool = False  # the call's first target forward (the prompt's prefill) is not recorded
    drafted_before: bool = False  # the call's first drafting step (the assistant's prefill) is not recorded
    idle: int = 0  # steps since the target last judged an assistant token
    failed_probes: int = 0  # probes in a row after which k = 0 stayed best


def observe(state: AutoState, drafted: int, accepted: int, cost: StepCost | None, cfg: AutoConfig) -> AutoState:
    """The state after one step: acceptance from judged tokens, costs from the step's timings.

    The call's first target forward (the prompt's prefill) and first drafting step (the assistant's
    prefill) are not recorded: they say nothing about the cost of a decoding step.
    """
    costs, prefilled, drafted_before = state.costs, state.prefilled, state.drafted_before
    if cost is not None and cost.target_tokens:
        costs = costs.with_target(cost.target_tokens, cost.target_seconds, cfg.cost_decay) if prefilled else costs
        prefilled = True
    if cost is not None and cost.drafted:
        costs = costs.with_draft(cost.draft_seconds / cost.drafted, cfg.cost_decay) if drafted_before else costs
        drafted_before = True
    d = cfg.acceptance_decay if drafted else 1.0
    new = replace(state, costs=costs, prefilled=prefilled, drafted_before=drafted_before,
                  judged=d * state.judged + drafted, accepted=d * state.accepted + accepted,
                  idle=0 if drafted else state.idle + 1)
    probe = drafted and state.idle >= _wait(state, cfg)
    if not (probe or (drafted and state.failed_probes)):
        return new  # the back-off only moves after a probe, or resets once drafting pays again
    pays = estimate(new, cfg).best_k(cfg.k_max) > 0
    return replace(new, failed_probes=0 if pays else state.failed_probes + probe)


def estimate(state: AutoState, cfg: AutoConfig) -> Estimates:
    """Current beliefs: the target's cost curve, the assistant's cost per token, the acceptance rate."""
    acceptance = (state.accepted + cfg.acceptance_prior * cfg.prior_weight) / (state.judged + cfg.prior_weight)
    curve = tuple(state.costs.curve(cfg.k_max + 1).tolist())
    return Estimates(curve, state.costs.draft_per_token or 0.0, acceptance)


def _wait(state: AutoState, cfg: AutoConfig) -> int:
    return cfg.probe_every * 2 ** min(state.failed_probes, cfg.probe_backoff)


def choose(state: AutoState, cfg: AutoConfig) -> int:
    """k for the next step: warm-up timings first, then the best k, with probes from k = 0.

    Warm-up: until the cost table holds a forward that verified drafts, the starting k; until it holds
    one that verified none, k = 0 (on a compute-bound device verifying k tokens costs nearly k steps).
    A table remembered from an earlier call on the same pair skips both.
    """
    measured = state.costs.measured()
    if not any(n > 1 for n in measured):
        return state.k0 or cfg.probe_k
    if 1 not in measured:
        return 0
    est = estimate(state, cfg)
    k = est.best_k(cfg.k_max)
    if k == 0 and state.idle >= _wait(state, cfg):
        hopeful = replace(est, acceptance=max(est.acceptance, cfg.probe_acceptance))
        return cfg.probe_k if hopeful.best_k(cfg.k_max) > 0 else 0
    return k


class Auto:
    """Cost-aware k: maximizes expected committed tokens per second under an online cost model.

    Parameters
    ----------
    k : int
        Starting k, kept until a target forward that verified drafts has been timed (then one step at
        k = 0 is timed too), unless `costs` already holds such timings.
    config : AutoConfig, optional
        Decays, priors, k_max and probing.
    costs : CostTable, optional
        Costs measured by earlier calls on the same model pair and device (`assisted.costs.recall`).

    Notes
    -----
    With acceptance a, a step with k drafts commits (1 - a^(k+1)) / (1 - a) tokens on average and costs
    target(k + 1) + k * draft seconds, where target(n) is the measured cost of a forward over n tokens
    (`assisted.costs.CostTable`) and draft an EWMA of assistant seconds per token. k = 0 is plain
    decoding (no assistant call); from there a probe of `probe_k` drafts after `probe_every` steps
    (doubling after each probe that changes nothing) notices returning acceptance, when drafting could
    pay at all on this device.
    """

    def __init__(self, k: int, config: AutoConfig | None = None, costs: CostTable | None = None):
        self.config = config or AutoConfig()
        self.state = AutoState(k0=k, costs=costs or CostTable())
        self.k = choose(self.state, self.config)

    def update(self, drafted: int, accepted: int, cost: StepCost | None = None) -> None:
        self.state = observe(self.state, drafted, accepted, cost, self.config)
        self.k = choose(self.state, self.config)

    def estimates(self) -> Estimates:
        return estimate(self.state, self.config)

    def learned(self) -> CostTable:
        return self.state.costs


SCHEDULES = {"constant": Constant, "heuristic": Heuristic, "auto": Auto}


def make_policy(schedule: str, k: int, costs: CostTable | None = None) -> Policy:
    """The policy named `schedule` (one of SCHEDULES), starting at `k`; `auto` also from a pair's measured `costs`."""
    return Auto(k, costs=costs) if schedule == "auto" else SCHEDULES[schedule](k)

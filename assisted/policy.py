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


@dataclass(frozen=True)
class StepCost:
    """Wall times of one step, as the loop measured them."""

    target_tokens: int  # tokens fed to the target forward (uncached + draft; the bonus row is the last); 0: none
    target_seconds: float  # that forward's wall time
    drafted: int  # assistant tokens drafted (one assistant forward each)
    draft_seconds: float  # their wall time


@dataclass(frozen=True)
class Estimates:
    """A cost-aware policy's beliefs: target forward = fixed + per_token * n seconds, and so on."""

    target_fixed: float  # seconds of a target forward independent of how many tokens it verifies (a)
    target_per_token: float  # seconds per token fed to the target (b)
    draft_per_token: float  # seconds per assistant token (one assistant forward)
    acceptance: float  # probability that the target accepts an assistant token (decayed estimate)

    def expected_tokens(self, k: int) -> float:
        """Committed tokens of a step with k drafts: sum of acceptance^i for i in 0..k."""
        a = self.acceptance
        return k + 1.0 if a >= 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)

    def seconds(self, k: int) -> float:
        """Cost of a step with k drafts: one target forward over k + 1 tokens and k assistant forwards."""
        return max(self.target_fixed + self.target_per_token * (k + 1) + self.draft_per_token * k, 1e-9)

    def best_k(self, k_max: int) -> int:
        """The k in 0..k_max with the most expected committed tokens per second (the smallest on ties)."""
        return max(range(k_max + 1), key=lambda k: self.expected_tokens(k) / self.seconds(k))


class Policy(Protocol):
    k: int  # model-drafted tokens to ask for next

    def update(self, drafted: int, accepted: int, cost: StepCost | None = None) -> None:
        """`drafted` assistant tokens were judged by the target, `accepted` of them accepted."""

    def estimates(self) -> Estimates | None:
        """What a cost-aware policy believes now; None for the others."""


class Constant:
    """Always the same k."""

    def __init__(self, k: int):
        self.k = k

    def update(self, drafted: int, accepted: int, cost: StepCost | None = None) -> None:
        pass

    def estimates(self) -> None:
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
    warmup: int = 3  # target timings to collect (at the starting k, one at k = 0) before choosing k from the model
    acceptance_prior: float = 0.6  # believed acceptance before any evidence ...
    prior_weight: float = 2.0  # ... worth this many judged tokens
    acceptance_decay: float = 0.8  # per judged step: the estimate follows the text (code, prose, JSON values)
    cost_decay: float = 0.9  # per timed forward: old timings fade (load on a shared machine changes)
    ridge: float = 0.5  # pulls the slope b to 0 (flat cost) until n varies enough to measure it
    probe_every: int = 8  # at k = 0, draft again after this many steps without drafts ...
    probe_k: int = 2  # ... this many tokens, so that returning acceptance is noticed


@dataclass(frozen=True)
class AutoState:
    """Decayed sufficient statistics of everything the policy has observed."""

    k0: int  # the starting k, used during warm-up
    fit: tuple[float, float, float, float, float] = (0.0, 0.0, 0.0, 0.0, 0.0)  # sum w, wn, ws, wnn, wns
    draft_per_token: float | None = None  # EWMA of assistant seconds per drafted token
    judged: float = 0.0  # decayed judged assistant tokens (the prior is added when estimating)
    accepted: float = 0.0  # decayed accepted assistant tokens
    timed: int = 0  # target forwards seen (the first, the prompt's prefill, is not fitted)
    drafts: int = 0  # steps with assistant tokens seen (the first holds the assistant's prefill)
    idle: int = 0  # steps since the target last judged an assistant token


def observe(state: AutoState, drafted: int, accepted: int, cost: StepCost | None, cfg: AutoConfig) -> AutoState:
    """The state after one step: acceptance from judged tokens, costs from the step's timings."""
    d = cfg.acceptance_decay
    if drafted:
        state = replace(state, judged=d * state.judged + drafted, accepted=d * state.accepted + accepted, idle=0)
    else:
        state = replace(state, idle=state.idle + 1)
    return state if cost is None else _observe_draft(_observe_target(state, cost, cfg), cost, cfg)


def _observe_target(state: AutoState, cost: StepCost, cfg: AutoConfig) -> AutoState:
    """Add (n, seconds) to the decayed least-squares sums; the first forward (prefill) is only counted."""
    if not cost.target_tokens:
        return state
    if state.timed == 0:
        return replace(state, timed=1)
    n, s, d = float(cost.target_tokens), cost.target_seconds, cfg.cost_decay
    w, wn, ws, wnn, wns = state.fit
    fit = (d * w + 1, d * wn + n, d * ws + s, d * wnn + n * n, d * wns + n * s)
    return replace(state, fit=fit, timed=state.timed + 1)


def _observe_draft(state: AutoState, cost: StepCost, cfg: AutoConfig) -> AutoState:
    """EWMA of seconds per assistant token; the first drafting step (the assistant's prefill) is skipped."""
    if not cost.drafted:
        return state
    per_token, old = cost.draft_seconds / cost.drafted, state.draft_per_token
    if state.drafts == 0:
        new = None
    else:
        new = per_token if old is None else cfg.cost_decay * old + (1 - cfg.cost_decay) * per_token
    return replace(state, draft_per_token=new, drafts=state.drafts + 1)


def estimate(state: AutoState, cfg: AutoConfig) -> Estimates:
    """Current beliefs: the ridge least-squares line through the timings, draft cost, acceptance."""
    w, wn, ws, wnn, wns = state.fit
    if w > 0:
        var, cov = wnn - wn * wn / w, wns - wn * ws / w
        b = max(cov / (var + cfg.ridge), 0.0)
        a = max(ws / w - b * wn / w, 0.0)
    else:
        a, b = 0.0, 0.0
    acceptance = (state.accepted + cfg.acceptance_prior * cfg.prior_weight) / (state.judged + cfg.prior_weight)
    return Estimates(a, b, state.draft_per_token or 0.0, acceptance)


def choose(state: AutoState, cfg: AutoConfig) -> int:
    """k for the next step: the starting k while warming up, else the best k, with probes at k = 0.

    The second timed forward of the warm-up verifies no drafts (k = 0), so that the cost line is fitted
    from two lengths: on a compute-bound device verifying k tokens costs nearly k single steps.
    """
    if state.timed <= cfg.warmup:
        return 0 if state.timed == 2 else state.k0
    k = estimate(state, cfg).best_k(cfg.k_max)
    return cfg.probe_k if k == 0 and state.idle >= cfg.probe_every else k


class Auto:
    """Cost-aware k: maximizes expected committed tokens per second under an online cost model.

    Parameters
    ----------
    k : int
        Starting k, kept until `config.warmup` target forwards have been timed (one of them at k = 0).
    config : AutoConfig, optional
        Decays, priors, k_max and probing.

    Notes
    -----
    With acceptance a, a step with k drafts commits (1 - a^(k+1)) / (1 - a) tokens on average and costs
    target(k + 1) + k * draft seconds, where target(n) = fixed + per_token * n is fitted by decayed
    least squares over the timed forwards and draft is an EWMA of assistant seconds per token. k = 0 is
    plain decoding (no assistant call); from there a probe of `probe_k` drafts every `probe_every` steps
    keeps the acceptance estimate alive.
    """

    def __init__(self, k: int, config: AutoConfig | None = None):
        self.config = config or AutoConfig()
        self.state = AutoState(k0=k)
        self.k = k

    def update(self, drafted: int, accepted: int, cost: StepCost | None = None) -> None:
        self.state = observe(self.state, drafted, accepted, cost, self.config)
        self.k = choose(self.state, self.config)

    def estimates(self) -> Estimates:
        return estimate(self.state, self.config)


SCHEDULES = {"constant": Constant, "heuristic": Heuristic, "auto": Auto}


def make_policy(schedule: str, k: int) -> Policy:
    """The policy named `schedule` (one of SCHEDULES), starting at `k`."""
    return SCHEDULES[schedule](k)


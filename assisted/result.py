"""What generate() returns: the output, why it stopped, and statistics of the run."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal

from assisted.policy.auto import Estimates

StopReason = Literal["eos", "final", "length", "closed", "stop_string", "criteria", "error"]


@dataclass(frozen=True)
class StepRecord:
    """One verification step."""

    k: int  # model-drafted tokens the policy asked for (0: plain decoding, only forced tokens drafted)
    drafted: int  # draft tokens the target verified (assistant, prompt lookup, forced point masses)
    accepted: int  # of those, accepted by the target
    forced_appended: int  # coalesced forced tokens committed without verification


@dataclass(frozen=True)
class Seconds:
    """Wall time split; `overhead` is the loop's own share (masks, guide, acceptance, bookkeeping)."""

    total: float
    target: float  # target forward passes
    assistant: float  # assistant forward passes
    fsm: float  # guide calls: mask, advance, forced, is_final
    capture: float = 0.0  # capturing CUDA graphs (paid once per model and width, before the first forward)
    assistant_tokenizer: float = 0.0  # of `assistant`: an assistant with another tokenizer respelling text

    @property
    def overhead(self) -> float:
        return self.total - self.target - self.assistant - self.capture


@dataclass(frozen=True)
class Stats:
    """Counters of one generate() call.

    `drafted`/`accepted` count tokens the target verified; forced tokens appended by coalescence are
    counted in `forced_tokens_appended` instead.
    """

    new_tokens: int
    target_forward_passes: int
    assistant_forward_passes: int
    drafted: int
    accepted: int
    drafted_by_source: dict[str, int]  # {"assistant": ..., "lookup": ..., "forced": ...}
    accepted_by_source: dict[str, int]
    forced_tokens_appended: int
    seconds: Seconds
    steps: tuple[StepRecord, ...]
    estimates: Estimates | None = None  # schedule="auto": final cost model and acceptance estimate
    prefill_tokens: int = 0  # prompt tokens the target ran (the rest came from a prefix cache)
    branches: int = 0  # generate(tree=True): steps whose draft had a side leaf
    leaves_taken: int = 0  # of those, steps that committed the leaf
    leaves_priced_out: int = 0  # schedule="auto": steps whose leaf was not verified, its row worth more than it
    cache: str = "dynamic"  # the KV caches decoded on: "dynamic", "static" or "static+graphs" (captured steps)
    cache_note: str | None = None  # on a CUDA target, why the default left static caches or graphs off
    budget_tightened: int = 0  # close_within_budget: committed positions whose mask the budget tightened
    target_kernels: str = ""  # what runs the target's Linears, e.g. "int4 (AVX-512 VNNI) x168, int8 (fbgemm) x29"
    assistant_head: str = ""  # the assistant's draft vocabulary, e.g. "draft vocabulary 32768 of 151936"; "": full

    @property
    def latency_seconds(self) -> float:
        """Wall time of this output: the call's, or in `generate_batch` from the row's admission to its finish."""
        return self.seconds.total

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def k_trace(self) -> tuple[int, ...]:
        """The k the policy chose at each step."""
        return tuple(step.k for step in self.steps)


@dataclass(frozen=True)
class GenerationResult:
    """The output of `assisted.generate`.

    Attributes
    ----------
    text : str
        The generated text (new tokens only, special tokens such as EOS left out).
    token_ids : list[int]
        The new token ids, including the EOS id when `stop_reason == "eos"`.
    value : Any
        The validated pydantic instance (schema was a pydantic class), the parsed JSON validated by
        `jsonschema` (JSON Schema), or None (regex, no constraint, or a text the guide does not accept as
        complete: cut by the token budget, stop reason "length"). Never a parsed prefix.
    stop_reason : {"eos", "final", "length", "closed", "stop_string", "criteria", "error"}
        EOS emitted; the guide reached a final state that allows nothing else; the budget ran out; the budget
        tightened the mask (`close_within_budget=True`, `stats.budget_tightened` positions) and the output closed
        complete; a stop string was completed; a stopping criterion said stop; or (`generate_batch` only) the row
        failed, see `error`.
    stats : Stats
        Forward passes, drafted/accepted tokens by source, timings and per-step records.
    error : str or None
        `generate_batch` only: why this row could not be generated (empty prompt, too long, bad schema); the
        other rows went on. None otherwise.
    batch : assisted.rows.batch_stats.BatchStats or None
        `generate_batch` only: the statistics of the whole batch run, one object shared by all its rows
        (final once the run has returned every row).
    """

    text: str
    token_ids: list[int]
    value: Any
    stop_reason: StopReason
    stats: Stats
    error: str | None = None
    batch: Any = None


class Recorder:
    """Mutable counters filled by the loop, frozen into `Stats` at the end."""

    def __init__(self, start: float | None = None) -> None:
        self.start = time.perf_counter() if start is None else start
        self.target_passes, self.target_seconds = 0, 0.0
        self.drafted = {"assistant": 0, "lookup": 0, "forced": 0}
        self.accepted = {"assistant": 0, "lookup": 0, "forced": 0}
        self.appended, self.steps = 0, []
        self.branches, self.leaves_taken, self.priced_out = 0, 0, 0
        self.cache, self.cache_note, self.capture_seconds = "dynamic", None, 0.0
        self.assistant_tokenizer = 0.0  # seconds an assistant with another tokenizer spent respelling text

    def caches(self, engine: str, note: str | None, capture_seconds: float) -> None:
        """Book the call's KV caches (`assisted.caching.CachePlan`) and what capturing their steps cost."""
        self.cache, self.cache_note, self.capture_seconds = engine, note, capture_seconds

    def forward(self, seconds: float) -> None:
        """Book a target forward the row took part in, and its share of the forward's seconds."""
        self.target_passes, self.target_seconds = self.target_passes + 1, self.target_seconds + seconds

    def respelled(self, seconds: float) -> None:
        """Book seconds an assistant with another tokenizer spent respelling text for the row."""
        self.assistant_tokenizer += seconds

    def step(self, k: int, sources: tuple[str, ...], n: int, coalesce: bool) -> None:
        """Book a step whose draft came from `sources` and whose first `n` tokens were accepted."""
        coalesced = [s == "forced" and coalesce for s in sources]
        verified = [(s, i < n) for i, s in enumerate(sources) if not coalesced[i]]
        for source, ok in verified:
            self.drafted[source] += 1
            self.accepted[source] += ok
        appended = sum(1 for i, c in enumerate(coalesced) if c and i < n)
        self.appended += appended
        self.steps.append(StepRecord(k, len(verified), sum(ok for _, ok in verified), appended))

    def branch(self, grown: bool, taken: bool, priced_out: bool = False) -> None:
        """Book whether the step's draft had a side leaf, whether the leaf was committed, and whether the policy
        priced a leaf out."""
        self.branches, self.leaves_taken = self.branches + grown, self.leaves_taken + taken
        self.priced_out += priced_out

    def freeze(self, new_tokens: int, assistant_passes: int, assistant_s: float, fsm_s: float,
               estimates: Estimates | None = None, prefill_tokens: int = 0) -> Stats:
        total = time.perf_counter() - self.start
        seconds = Seconds(total, self.target_seconds, assistant_s, fsm_s, self.capture_seconds,
                          self.assistant_tokenizer)
        return Stats(
            new_tokens=new_tokens,
            target_forward_passes=self.target_passes,
            assistant_forward_passes=assistant_passes,
            drafted=sum(self.drafted.values()),
            accepted=sum(self.accepted.values()),
            drafted_by_source=dict(self.drafted),
            accepted_by_source=dict(self.accepted),
            forced_tokens_appended=self.appended,
            seconds=seconds,
            steps=tuple(self.steps),
            estimates=estimates,
            prefill_tokens=prefill_tokens,
            branches=self.branches,
            leaves_taken=self.leaves_taken,
            leaves_priced_out=self.priced_out,
            cache=self.cache,
            cache_note=self.cache_note,
        )

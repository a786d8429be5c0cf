"""One row being decoded, set up once for one row (`assisted.generate`) or many (`assisted.generate_batch`): its
sequence, cursor, policy, generators, prompt lookup, stops and streamer, counters; and what the rows of one engine
share (`Setup`). What a row drafts, feeds, is judged and keeps in one step: `assisted.rows.step_records`.

`draft_sources` is where a row's draft sources are built (one place: a new source joins here).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from assisted.result import Recorder
from assisted.rows.row_inputs import RowInput
from assisted.stopping import Sink, Stops
from drafting.assistant import Asker, RowAsker
from drafting.foreign_drafter import ForeignAsker, ForeignDrafter
from drafting.lookup import PromptLookup
from drafting.proposal import Proposal
from drafting.sampling import Warp, make_generator


@dataclass(frozen=True)
class Setup:
    """What the rows of one engine share."""

    model: Any
    assistant_model: Any
    tokenizer: Any
    vocab_size: int
    warp: Warp  # greedy or sampling, the same for every row (seeds may differ)
    stops: Stops  # stop strings and criteria, checked; each row gets its own copy (`Stops.fresh`)
    tree: bool = False  # draft the assistant's runner-up where it is unsure
    caches: tuple[str, str | None, float] = ("dynamic", None, 0.0)  # engine, note, capture seconds (`Recorder.caches`)
    memory: str = "dynamic"  # the engine name learned costs are kept under (`assisted.policy.costs.memorize`)
    foreign: bool = False  # the assistant has another tokenizer: each row's `ForeignDrafter` asks it


@dataclass(frozen=True)
class Sources:
    """A row's draft sources besides the guide's forced runs and the engine's assistant."""

    lookup: PromptLookup | None  # copies of the prompt
    foreign: ForeignDrafter | None = None  # an assistant with another tokenizer: this row's text in its tokens


def draft_sources(inp: RowInput, tokenizer) -> Sources:
    """The row's own draft sources."""
    return Sources(PromptLookup(tokenizer, inp.ids) if inp.opts.prompt_lookup else None,
                   None if inp.foreign is None else inp.foreign.drafter())


class Row:
    """One row being decoded: the committed sequence (`seq`), its cursor and policy, its generators (seeded s: target
    s, assistant s + 1, as `generate(seed=s)`), its stops and streamer, and its counters."""

    def __init__(self, inp: RowInput, policy, sources: Sources, stops: Stops, target_device, helper_device):
        self.inp, self.opts, self.cursor, self.prompt, self.policy = inp, inp.opts, inp.cursor, inp.ids, policy
        self.start = inp.cursor.copy()  # the guide before the first token (`close_within_budget.outcome` walks it)
        self.seq, self.end = list(inp.ids), len(inp.ids) + inp.opts.max_new_tokens
        self.cached = 0  # target tokens cached (always seq[:cached])
        self.rec = Recorder(inp.began)  # stats.seconds.total: from the row's setup to its result
        self.sink = Sink(stops, inp.item.streamer, inp.ids)
        seed = self.opts.seed
        self.generator = make_generator(target_device, seed)
        self.helper_generator = None if helper_device is None else make_generator(
            helper_device, None if seed is None else seed + 1)
        self.sources = sources
        self.helper_passes, self.helper_seconds = 0, 0.0  # assistant forwards it took part in, its share of their time
        self.stop = None  # why it stopped, once it has
        self.prefilled = len(inp.ids)  # prompt tokens run by the target (the rest reused)

    def proposal(self, k: int, assisted: bool, sampling: bool, cut: Callable) -> Proposal:
        """This step's proposal from the committed state: up to `k` assistant tokens, prompt-lookup copies, forced
        runs, the policy's `cut` (`drafting.proposal.Proposal`)."""
        return Proposal(self.seq, self.cursor.copy(), k=k if assisted else 0,
                        lookup_k=min(self.policy.lookup_k, self.opts.lookup_tokens), limit=self.end - len(self.seq) - 1,
                        lookup=self.sources.lookup, use_forced=assisted or self.opts.coalesce,
                        coalesced=self.opts.coalesce, sampling=sampling, cut=cut)

    def asker(self, proposal: Proposal, warp: Warp) -> Asker:
        """This step's side of the engine's drafting rounds (`drafting.assistant.Assistant.rounds`)."""
        foreign = self.sources.foreign
        if foreign is not None:
            return ForeignAsker(proposal, foreign)
        return RowAsker(proposal, warp, self.helper_generator, self.opts.processors)

    @property
    def helper_seq(self) -> list[int]:
        """The row's context in the assistant's ids (its cache holds a prefix): the target's, or a foreign
        assistant's own prompt and text."""
        foreign = self.sources.foreign
        return self.seq if foreign is None else foreign.tokens

    def helper_valid(self, valid: int) -> int:
        """How many entries of the assistant's cache hold after a step whose first `valid` tokens stand: a foreign
        assistant's own count (its text is kept in step at its next draft)."""
        foreign = self.sources.foreign
        return valid if foreign is None else foreign.valid

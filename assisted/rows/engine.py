"""The decode engine: `assisted.generate` is this engine with one row, `assisted.generate_batch` the same with B rows
and refill. One row setup (`Engine.row`), one step (`Engine.step`), one result assembly (`Engine.finish`).

Per step: each row's policy says how many assistant tokens it may draft (`auto` rows are priced together by the
positions they add to the shared forward: `assisted.policy.prices.SharedPrices`); every row drafts by the proposal
rule (`drafting.proposal.Proposal`: forced runs, prompt-lookup copies, the cut), the assistant's tokens for every
asking row in one forward per round (`drafting.assistant.Assistant`); a draft tree's leaf where it pays; one target
forward verifies every row's `[uncached committed, *draft(, leaf)]` (`target_forward`); each row is accepted, commits,
streams and stops by the step rules (`assisted.steps`); both caches keep each row's committed prefix; the policies
learn. One host sync per drafting round and one per verification, for all rows. The caches are a
`drafting.row_kv.RowsKV`: one row's own (dynamic, static with captured steps, a kept prefix) or B rows'
(`drafting.batch_kv.BatchKV`). A row that stops leaves; the next waiting row takes its slot (prefilled, from a row or
a kept cache sharing its prompt's prefix where allowed); with none waiting the slot is dropped.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import Callable

import torch

from assisted.close_within_budget import outcome
from assisted.inputs import parse_value
from assisted.models.int4_models import linear_kernels
from assisted.policy.costs import StepCost, memorize
from assisted.result import GenerationResult, Recorder
from assisted.rows.row_inputs import RowError, RowInput
from assisted.rows.row import Row, RowStep, Setup, draft_alone, draft_sources
from assisted.rows.batch_stats import BatchStats
from assisted.steps import accept, commit, judge, needs_forward
from drafting.assistant import Assistant
from drafting.draft_head import describe
from drafting.base import DeviceMasks
from drafting.kv_cache import input_device, output_device
from drafting.row_kv import RowsKV
from drafting.tree import grow_branch


def target_forward(target: RowsKV, rows: list[Row], drafted: list[RowStep]) -> list[torch.Tensor | None]:
    """The step's one target forward: each row's logits after its committed tokens and each draft prefix, (k+1 (+1),
    V), None for a row that fed nothing."""
    keep = [len(d.draft.tokens) + 1 + (d.leaf is not None) for d in drafted]
    leaves = [(len(row.seq), d.leaf) if d.leaf is not None and d.feed else None for row, d in zip(rows, drafted)]
    return target.run([d.feed for d in drafted], keep, leaves if any(leaves) else None)


def verify(target: RowsKV, rows: list[Row], drafted: list[RowStep]) -> list[list[int] | None]:
    """The target forward and each row's acceptance test: [n, took, token] per row (None where it fed nothing), in
    the step's one host sync."""
    logits = target_forward(target, rows, drafted)
    found = [accept(x, row.seq, d.draft, d.leaf, row.opts, row.generator)
             for row, d, x in zip(rows, drafted, logits) if x is not None]  # (2,) [n, token] or (3,) on a tree
    flat = iter((found[0] if len(found) == 1 else torch.cat(found)).tolist())  # the step's one host sync
    return [None if x is None else [next(flat), next(flat) if d.leaf is not None else 0, next(flat)]
            for d, x in zip(drafted, logits)]


class Engine:
    """Rows on shared caches: `run(inputs)` yields (index, result) as rows finish, at most `batch_size` at once.

    `policy_for(opts)` builds a row's draft-length policy (with `prices` when it is `auto`); `prepare(item)` sets up
    an `assisted.rows.row_inputs.Item` (`prepared`); `verify` is the step's target verification (a seam: a test
    injects a failure); `batch`: results carry the run's `BatchStats`, and a row whose output fails validation gets its
    own error instead of raising.
    """

    def __init__(self, setup: Setup, target: RowsKV, helper: RowsKV | None, batch_size: int, policy_for: Callable,
                 prices=None, prefix_cache=None, share_prefix: bool = False, verify: Callable = verify,
                 batch: bool = True, prepare: Callable | None = None):
        self.setup, self.target, self.batch_size, self.policy_for, self.prices = setup, target, batch_size, \
            policy_for, prices
        self.prepare = prepare
        self.assistant = None if helper is None else Assistant(helper, setup.warp)
        self.prefix_cache, self.share_prefix, self.verify, self.batch = prefix_cache, share_prefix, verify, batch
        self.masks = DeviceMasks(output_device(setup.model))  # guide masks on the target's device
        self.kernels = linear_kernels(setup.model)  # named in every row's stats
        self.assistant_head = describe(setup.assistant_model)
        self.rows: list[Row] = []
        self.stats = BatchStats(batch_size)

    def run(self, inputs: Iterable[RowInput | RowError]) -> Iterator[tuple[int, GenerationResult]]:
        """Decode `inputs`, at most `batch_size` at once, refilling freed slots; yields rows as they finish."""
        pending = iter(inputs)
        free = [None] * self.batch_size  # slots to fill: a finished row's index into self.rows, or None: a new row
        try:
            while True:
                kept = []
                for slot in free:
                    yield from self._fill(slot, pending, kept)
                gone = [s for s in free if s is not None and s not in kept]
                if gone:
                    self._drop(gone)
                if not self.rows:
                    self.stats.tick()
                    return
                with torch.inference_mode():
                    done = self.step()
                self.stats.tick()
                for slot in done:
                    yield self.rows[slot].inp.item.index, self.finish(self.rows[slot], slot)
                free = done
        finally:
            for row in self.rows:
                row.sink.close()  # no reader waits on a row that will never finish

    def row(self, inp: RowInput) -> Row:
        """A prepared row's decoding state (its policy, draft sources, stops, generators)."""
        helper = None if self.assistant is None else output_device(self.setup.assistant_model)
        return Row(inp, self.policy_for(inp.opts), draft_sources(inp, self.setup.tokenizer), self.setup.stops.fresh(),
                   output_device(self.setup.model), helper)

    def _fill(self, slot: int | None, pending: Iterator, kept: list[int]) -> Iterator[tuple[int, GenerationResult]]:
        """Admit the next row that can be decoded into `slot`; yield the failed or finished-at-once rows on the way."""
        for inp in pending:
            if isinstance(inp, RowError):
                self.stats.errors += 1
                yield inp.index, self._error(inp.message)
                continue
            row = self.row(inp)
            row.sink.open()
            row.rec.caches(*self.setup.caches)
            if row.cursor.only_eos_left():  # the constraint allows nothing but EOS: done before any forward
                row.stop = "final"
                yield inp.item.index, self.finish(row)
                continue
            slot = len(self.rows) if slot is None else slot
            with torch.inference_mode():
                self._admit(slot, row)
            kept.append(slot)
            return

    def _admit(self, slot: int, row: Row) -> None:
        """Place the row's prompt (all but its last token) into `slot`: from a kept or shared prefix, the rest prefilled
        (by `place`, or by the row's first forward)."""
        refill = slot < len(self.rows)
        self.stats.rows, self.stats.refills = self.stats.rows + 1, self.stats.refills + refill
        ids, kept = row.prompt[:-1], None
        if self.prefix_cache is not None:  # (target cache, tokens, assistant cache, tokens) of a kept prefix
            kept = self.prefix_cache.take(self.setup.model, self.setup.assistant_model, row.prompt)
        helper = None if self.assistant is None else self.assistant.kv
        for kv, reused in ((self.target, kept and kept[:2]), (helper, kept and kept[2:])):
            if kv is None:
                continue
            shared, source = self._shared(kv, ids)
            if reused and reused[0] is not None and reused[1] >= shared:
                source, shared = reused
            kv.place(slot, ids, shared, source)
            if kv is self.target:
                row.prefilled = len(row.prompt) - shared
        self.stats.prefill_forwards += self.target.prefills * (len(row.prompt) > 1) * (1 + (self.assistant is not None))
        if refill:
            self.rows[slot] = row
        else:
            self.rows.append(row)
        row.cached = self.target.lengths[slot]

    def _shared(self, kv: RowsKV, ids: list[int]) -> tuple[int, int | None]:
        """(tokens, row): the row of `kv` that caches the longest prefix of `ids` (off unless `share_prefix`)."""
        best = (0, None)
        if not self.share_prefix:
            return best
        for r, (row, length) in enumerate(zip(self.rows, kv.lengths)):
            cached = row.seq[: min(length, len(ids))]
            same = next((i for i, (a, b) in enumerate(zip(cached, ids)) if a != b), len(cached))
            best = max(best, (same, r), key=lambda pair: pair[0])
        return best

    def _drop(self, gone: list[int]) -> None:
        keep = [s for s in range(len(self.rows)) if s not in gone]
        self.target.drop(keep)
        if self.assistant is not None:
            self.assistant.kv.drop(keep)
        self.rows = [self.rows[s] for s in keep]

    def step(self) -> list[int]:
        """One draft -> verify -> commit step for every row; returns the slots whose rows stopped."""
        rows = self.rows
        if self.prices is not None:
            self.prices.begin([row.policy for row in rows])
        drafted = self._draft(rows)  # 1. every row's draft: forced runs (free), copies, assistant tokens
        if self.prices is not None and self.setup.tree:  # a leaf is priced beside the other rows' feeds
            self.prices.feeds = [len(r.seq) - r.cached + len(d.draft.tokens) for r, d in zip(rows, drafted)]
        for row, d in zip(rows, drafted):  # 2. what the target runs for each row (a tree's leaf where it pays)
            self._feed(row, d)
        start = time.perf_counter()  # 3. one target forward over every row's feed, one host sync
        verdicts = self.verify(self.target, rows, drafted) if any(d.feed for d in drafted) else [None] * len(rows)
        seconds = time.perf_counter() - start
        self._book(rows, drafted, seconds)
        done = [slot for slot, (row, d, verdict) in enumerate(zip(rows, drafted, verdicts))
                if self._commit(slot, row, d, verdict)]  # 4. commit the accepted tokens, and what follows them
        self.target.crop_rows([row.cached for row in rows])  # each cache keeps its rows' committed prefixes
        for row, length in zip(rows, self.target.lengths):
            row.cached = length
        if self.assistant is not None:
            self.assistant.rollback([d.valid for d in drafted])
        self._learn(rows, drafted, seconds)  # 5. the policies learn what was accepted and what it cost
        return done

    def _draft(self, rows: list[Row]) -> list[RowStep]:
        """Every row's draft: its proposal, the assistant's tokens for all asking rows drafted together."""
        ks = [row.policy.k for row in rows]
        assisted, sampling = self.assistant is not None, self.setup.warp.do_sample
        proposals = [row.proposal(k, assisted, sampling) for row, k in zip(rows, ks)]
        if self.prices is not None:
            self.prices.proposals = proposals
        spent = [(row.rec.target_seconds, row.helper_passes, row.helper_seconds) for row in rows]
        self.rounds = (0, 0.0)  # this step's assistant forwards and their seconds
        if self.assistant is None:  # forced runs, copies, and an assistant with another tokenizer (row by row)
            self.rounds = draft_alone(rows, proposals)
            self.stats.assistant_forwards += self.rounds[0]
        else:
            before, rounds = self.assistant.seconds, self.assistant.forwards
            generators, processors = [r.helper_generator for r in rows], [r.opts.processors for r in rows]
            took = self.assistant.draft(proposals, generators, processors)
            self.rounds = (self.assistant.forwards - rounds, self.assistant.seconds - before)
            self.stats.assistant_forwards += self.rounds[0]
            share = self.rounds[1] / max(1, sum(took))
            for row, n in zip(rows, took):
                row.helper_passes, row.helper_seconds = row.helper_passes + n, row.helper_seconds + n * share
        device = output_device(self.setup.model) if self.assistant is None else input_device(self.setup.assistant_model)
        return [RowStep(k, p.draft(self.masks, self.setup.vocab_size, device), s)
                for k, p, s in zip(ks, proposals, spent)]

    def _feed(self, row: Row, d: RowStep) -> None:
        """The row's feed: its uncached committed tokens, its draft, and a tree's leaf where the policy says it pays."""
        feed = row.seq[row.cached :] + list(d.draft.tokens)
        if self.setup.tree:
            d.branch = grow_branch(d.draft, row.cursor, row.opts.coalesce, row.helper_generator, self.masks)
            pays = d.branch is not None and row.policy.leaf_pays(d.draft, d.branch, len(feed))
            d.leaf = d.branch if pays else None
            feed += [] if d.leaf is None else [d.leaf.token]
        d.feed = feed if needs_forward(d.draft, len(row.seq), row.end, row.opts.coalesce) else []

    def _book(self, rows: list[Row], drafted: list[RowStep], seconds: float) -> None:
        """Each row that fed the forward takes part in it and shares its seconds."""
        fed = [row for row, d in zip(rows, drafted) if d.feed]
        for row in fed:
            row.rec.target_passes += 1
            row.rec.target_seconds += seconds / len(fed)
        if fed:
            self.stats.verified([d.feed for d in drafted])

    def _commit(self, slot: int, row: Row, d: RowStep, verdict: list[int] | None) -> bool:
        """Commit the row's accepted drafts and the target's token (a taken leaf first); True when the row stops."""
        if verdict is None:  # only coalesced tokens up to the end: no forward
            d.n, d.took, d.after = len(d.draft.tokens), False, []
        else:
            d.n, d.took, token = verdict[0], bool(verdict[1]), verdict[2]
            d.after = [token] if not d.took else [d.leaf.token, *([token] if d.leaf.bonus else [])]
        d.valid, before = len(row.seq) + d.n, len(row.seq)
        if d.took:  # the leaf's entries move to its committed position (crops follow)
            self.target.move(slot, len(row.seq) + len(d.draft.tokens), len(row.seq) + d.leaf.at)
        row.stop = commit(row.seq, row.cursor, [*d.draft.tokens[: d.n], *d.after], row.end, row.sink)
        row.sink.put(row.seq[before:])
        row.cached = min(d.valid + d.took, len(row.seq) - 1)
        return row.stop is not None

    def _learn(self, rows: list[Row], drafted: list[RowStep], seconds: float) -> None:
        """Tell each row's policy what the target judged and what its step cost; book the step; price the forward."""
        for row, d in zip(rows, drafted):
            spent = d.spent
            cost = StepCost(len(d.feed), row.rec.target_seconds - spent[0], row.helper_passes - spent[1],
                            row.helper_seconds - spent[2])
            row.policy.update(*judge(d.draft.forced, d.n), cost, d.draft.model_confidence)
            if d.branch is not None and d.n == d.branch.at:  # did the target, rejecting the sibling, pick it?
                row.policy.observe_leaf(d.branch.confidence, d.after[0] == d.branch.token)
            row.rec.step(d.k, d.draft.sources, d.n, row.opts.coalesce)
            row.rec.branch(d.leaf is not None, d.took, priced_out=d.branch is not None and d.leaf is None)
        if self.prices is not None:
            width = len(rows) * max(len(d.feed) for d in drafted)  # positions in the forward, padding included
            cost = StepCost(width, seconds if width else 0.0, *self.rounds)
            self.prices.observe(cost, [(row.policy, d.draft.model_confidence) for row, d in zip(rows, drafted)
                                       if row.policy in self.prices.members])

    def finish(self, row: Row, slot: int | None = None) -> GenerationResult:
        """The row's result (its output validated), its caches kept for a prefix cache; closes its streamer.

        Raises ValueError where the guide accepted a text the schema rejects (a bug, never silent), unless `batch`:
        then that is the row's error."""
        row.sink.close()
        setup = self.setup
        if self.prefix_cache is not None and slot is not None:
            helper = None if self.assistant is None else self.assistant.kv.row_cache(slot)
            self.prefix_cache.put(setup.model, setup.assistant_model, row.seq, self.target.row_cache(slot), helper)
        memorize(setup.model, setup.assistant_model, row.policy.learned(), row.policy.calibration(), row.opts.warp,
                 setup.memory)
        new = row.seq[len(row.prompt) :]
        text = setup.tokenizer.decode(new, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        try:
            value = parse_value(row.inp.item.schema, text, row.cursor.accepting())
        except ValueError as error:
            if not self.batch:
                raise
            return self._error(str(error))
        stats = row.rec.freeze(len(new), row.helper_passes, row.helper_seconds, row.cursor.clock.seconds,
                               row.policy.estimates(), row.prefilled)
        tightened, stop = outcome(row.start, new, row.stop)
        batch = self.stats if self.batch else None
        stats = replace(stats, budget_tightened=tightened, target_kernels=self.kernels,
                        assistant_head=self.assistant_head)
        return GenerationResult(text, new, value, stop, stats, None, batch)

    def _error(self, message: str) -> GenerationResult:
        """A failed row's result; its error on one line (an output line of the CLI)."""
        message = " ".join(message.split("\n"))
        return GenerationResult("", [], None, "error", Recorder().freeze(0, 0, 0.0, 0.0), message, self.stats)

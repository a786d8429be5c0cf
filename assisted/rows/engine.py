"""The decode engine: `assisted.generate` is this engine with one row, `assisted.generate_batch` the same with B rows
and refill. One row setup (`Engine.row`), one step (`Engine.step`), one result assembly (`Engine.finish`).

Per step: each row's policy says how many assistant tokens it may draft (`auto` rows are priced together by the
positions they add to the shared forward: `assisted.policy.prices.SharedPrices`); every row drafts by the proposal rule
(`drafting.proposal.Proposal`: forced runs, prompt-lookup copies, the cut), the assistant's tokens for every asking row
in one forward per round (`drafting.assistant.Assistant`; an assistant of another tokenizer too, each row's text kept in
its ids by the row's `drafting.foreign_drafter.ForeignDrafter`); a draft tree's leaf where it pays; one target forward
verifies every row's `[uncached committed, *draft(, leaf)]` (`target_forward`); each row is accepted, commits, streams
and stops by the step rules (`assisted.steps`); both caches keep each row's committed prefix (a foreign assistant's:
what its drafter still holds); the policies learn. Each stage passes the next a frozen record per row
(`assisted.rows.step_records`: Proposed -> Feed -> Verdict -> Committed). One host sync per drafting round and one per
verification, for all rows. The caches are a `drafting.row_kv.RowsKV`: one row's own (dynamic, static with captured
steps, a kept prefix) or B rows' (`drafting.batch_kv.BatchKV`). A row that stops leaves; the next waiting row takes its
slot (prefilled, from a row or a kept cache sharing its prompt's prefix where allowed); with none waiting the slot is
dropped.
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
from assisted.policy.prices import row_cuts
from assisted.result import GenerationResult, Recorder
from assisted.rows.row_inputs import RowError, RowInput
from assisted.rows.row import Row, Setup, draft_sources
from assisted.rows.step_records import Committed, Feed, Proposed, Rounds, Verdict
from assisted.rows.batch_stats import BatchStats
from assisted.steps import accept, commit, judge, needs_forward, position_masks
from drafting.assistant import Assistant
from drafting.draft_head import describe
from drafting.base import DeviceMasks
from drafting.kv_cache import input_device, output_device
from drafting.masked_head import only_allowed
from drafting.proposal import Proposal
from drafting.row_kv import RowsKV
from drafting.tree import grow_branch


def target_forward(target: RowsKV, rows: list[Row], feeds: list[Feed]) -> list[torch.Tensor | None]:
    """The step's one target forward: each row's logits after its committed tokens and each draft prefix, (k+1 (+1),
    V), None for a row that fed nothing. Under the guides' masks the head computes only the blocks of columns they
    allow (`drafting.masked_head`): the masked logits are the same."""
    keep = [len(f.draft.tokens) + 1 + (f.leaf is not None) for f in feeds]
    leaves = [(len(row.seq), f.leaf) if f.leaf is not None and f.tokens else None for row, f in zip(rows, feeds)]
    with only_allowed(target.model, kept_masks(rows, feeds)):
        return target.run([list(f.tokens) for f in feeds], keep, leaves if any(leaves) else None)


def kept_masks(rows: list[Row], feeds: list[Feed]) -> list[torch.Tensor] | None:
    """The guide's mask at each position the forward keeps, (k+1 (+1), V) per row that feeds it; None where some row's
    logits are read unmasked (no guide, or logits processors that run before the mask)."""
    masks = []
    for row, f in zip(rows, feeds):
        if not f.tokens:
            continue
        mask = None if row.opts.processors else position_masks(f.draft, f.leaf)
        if mask is None:
            return None
        masks.append(mask)
    return masks


def verify(target: RowsKV, rows: list[Row], feeds: list[Feed]) -> list[Verdict]:
    """The target forward and each row's acceptance test, in the step's one host sync: a `Verdict` per row (a row that
    fed nothing commits its draft unasked)."""
    logits = target_forward(target, rows, feeds)
    found = [accept(x, row.seq, f.draft, f.leaf, row.opts, row.generator)
             for row, f, x in zip(rows, feeds, logits) if x is not None]  # (3,) [n, took, token] each
    results = iter([found[0].tolist()] if len(found) == 1 else torch.stack(found).tolist())  # the one host sync
    return [Verdict.unasked(f.draft) if x is None else Verdict.judged(f, *next(results)) for f, x in zip(feeds, logits)]


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
                    with self.stats.timed("admit"):
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
            with torch.inference_mode(), self.stats.timed("admit"):
                self._admit(slot, row)
            kept.append(slot)
            return

    def _admit(self, slot: int, row: Row) -> None:
        """Place the row's prompt (all but its last token) into `slot`: from a kept or shared prefix, the rest prefilled
        (by `place`, or by the row's first forward)."""
        refill = slot < len(self.rows)
        self.stats.rows, self.stats.refills = self.stats.rows + 1, self.stats.refills + refill
        kept = None
        if self.prefix_cache is not None:  # (target cache, tokens, assistant cache, tokens) of a kept prefix
            kept = self.prefix_cache.take(self.setup.model, self.setup.assistant_model, row.prompt)
        shared = self._place(self.target, slot, row.prompt, [r.seq for r in self.rows], kept and kept[:2])
        row.prefilled = len(row.prompt) - shared
        helper = None if self.assistant is None else self.assistant.kv
        if helper is not None:  # its own prompt (in its own ids, for an assistant of another tokenizer: none kept)
            reused = None if self.setup.foreign else kept and kept[2:]
            self._place(helper, slot, row.helper_seq, [r.helper_seq for r in self.rows], reused)
        ran = self.target.lengths[slot] > shared  # else the row's first forward feeds its rest (`BatchKV.defers`)
        prefilled = ran + (helper is not None and helper.prefills and len(row.prompt) > 1)  # a lazy cache's row waits
        self.stats.prefill_forwards += prefilled
        if refill:
            self.rows[slot] = row
        else:
            self.rows.append(row)
        row.cached = self.target.lengths[slot]
        self._tell_lag(slot, row)

    def _place(self, kv: RowsKV, slot: int, prompt: list[int], seqs: list[list[int]], reused) -> int:
        """Place `prompt` (all but its last token) into `slot` of `kv`, the longest prefix a row caches (`seqs`: each
        row's context in `kv`'s ids) or a kept cache (`reused`: (cache, tokens)) holds copied; returns its length."""
        ids = prompt[:-1]
        shared, source = self._shared(kv, ids, seqs)
        if reused and reused[0] is not None and reused[1] >= shared:
            source, shared = reused
        kv.place(slot, ids, shared, source)
        return shared

    def _tell_lag(self, slot: int, row: Row) -> None:
        """Tell the row's policy how many of its positions the assistant's cache lacks (it starts lazily)."""
        if self.assistant is not None:
            row.policy.assistant_behind(len(row.helper_seq) - self.assistant.kv.lengths[slot])

    def _shared(self, kv: RowsKV, ids: list[int], seqs: list[list[int]]) -> tuple[int, int | None]:
        """(tokens, row): the row of `kv` that caches the longest prefix of `ids` (off unless `share_prefix`); `seqs`:
        each row's context in `kv`'s ids."""
        best = (0, None)
        if not self.share_prefix:
            return best
        for r, (seq, length) in enumerate(zip(seqs, kv.lengths)):
            cached = seq[: min(length, len(ids))]
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
        """One draft -> verify -> commit step for every row; returns the slots whose rows stopped. Each stage hands the
        next one record per row (`assisted.rows.step_records`): Proposed -> Feed -> Verdict -> Committed."""
        rows, timed = self.rows, self.stats.timed
        with timed("draft"):
            proposed, rounds = self._draft(rows)  # 1. every row's draft: forced runs (free), copies, assistant tokens
        with timed("feed"):
            feeds = self._feeds(rows, proposed)  # 2. what the target runs for each row (a tree's leaf where it pays)
        start = time.perf_counter()  # 3. one target forward over every row's feed, one host sync
        with timed("verify"):
            verdicts = self.verify(self.target, rows, feeds) if any(f.tokens for f in feeds) else \
                [Verdict.unasked(f.draft) for f in feeds]
        seconds = time.perf_counter() - start
        with timed("commit"):
            committed = [self._commit(slot, row, f, v)  # 4. commit each verdict's tokens: stream, advance, stop
                         for slot, (row, f, v) in enumerate(zip(rows, feeds, verdicts))]
            self._keep(rows, committed)  # both caches keep each row's committed prefix
        with timed("learn"):
            self._learn(rows, feeds, verdicts, seconds, rounds)  # 5. the policies learn what was accepted, its cost
        return [slot for slot, c in enumerate(committed) if c.stop is not None]

    def _draft(self, rows: list[Row]) -> tuple[list[Proposed], Rounds]:
        """Every row's draft by its proposal, the assistant's tokens for all asking rows drafted together."""
        if self.prices is not None:
            self.prices.begin([row.policy for row in rows])  # this step's width decides the `auto` rows' caps
        ks = [row.policy.k for row in rows]
        assisted, sampling = self.assistant is not None, self.setup.warp.do_sample
        proposals: list[Proposal] = []  # slot order; complete before any cut is asked
        cuts = row_cuts([row.policy for row in rows], proposals, self.prices)  # auto rows priced together see them all
        proposals += [row.proposal(k, assisted, sampling, cut) for row, k, cut in zip(rows, ks, cuts)]
        spent, rounds = self._complete(rows, proposals)
        for row, (forwards, seconds) in zip(rows, spent):
            row.helper_passes, row.helper_seconds = row.helper_passes + forwards, row.helper_seconds + seconds
        same = self.assistant is not None and not self.setup.foreign  # q rows on its device; point masses: the target's
        device = input_device(self.setup.assistant_model) if same else output_device(self.setup.model)
        return [Proposed(k, p.draft(self.masks, self.setup.vocab_size, device), *s)
                for k, p, s in zip(ks, proposals, spent)], rounds

    def _complete(self, rows: list[Row], proposals: list[Proposal]) -> tuple[list[tuple[int, float]], Rounds]:
        """Complete every proposal: each row's assistant (forwards, seconds) and the step's `Rounds` (its forwards, and
        their seconds with the rows' own drafting work: a foreign assistant's respelling)."""
        if self.assistant is None:  # forced runs and copies
            for proposal in proposals:
                proposal.fill()
            return [(0, 0.0)] * len(rows), Rounds(0, 0.0)
        seconds, forwards, positions = self.assistant.seconds, self.assistant.forwards, self.assistant.positions
        askers = [row.asker(p, self.setup.warp) for row, p in zip(rows, proposals)]
        took = self.assistant.rounds(askers)
        ran = self.assistant.seconds - seconds
        self.stats.drafted(self.assistant.forwards - forwards, self.assistant.positions - positions, ran)
        share = ran / max(1, sum(took))  # each assistant token's share of the rounds' seconds
        for row, asker in zip(rows, askers):
            row.rec.respelled(asker.respelling)
        rounds = Rounds(self.assistant.forwards - forwards, ran + sum(a.seconds for a in askers))
        return [(n, n * share + a.seconds) for n, a in zip(took, askers)], rounds

    def _feeds(self, rows: list[Row], proposed: list[Proposed]) -> list[Feed]:
        """Each row's feed: its uncached committed tokens, its draft, and a tree's leaf where the policy says it pays
        (priced beside the other rows' chains)."""
        chains = [len(row.seq) - row.cached + len(p.draft.tokens) for row, p in zip(rows, proposed)]  # per slot
        return [self._feed(row, p, chain, chains) for row, p, chain in zip(rows, proposed, chains)]

    def _feed(self, row: Row, p: Proposed, chain: int, chains: list[int]) -> Feed:
        """One row's feed; `chain`: its tokens before a leaf, `chains`: every row's (slot order)."""
        tokens, branch, leaf = row.seq[row.cached :] + list(p.draft.tokens), None, None  # (chain,)
        if self.setup.tree:
            branch = grow_branch(p.draft, row.cursor, row.opts.coalesce, row.helper_generator, self.masks)
            if branch is not None and row.policy.leaf_pays(p.draft, branch, chain, chains):
                leaf, tokens = branch, tokens + [branch.token]
        asked = needs_forward(p.draft, len(row.seq), row.end, row.opts.coalesce)
        return Feed(p, branch, leaf, tuple(tokens) if asked else ())

    def _commit(self, slot: int, row: Row, feed: Feed, verdict: Verdict) -> Committed:
        """Commit the verdict's tokens (a taken leaf's cache entries moved first), stream them, advance the guide."""
        before = len(row.seq)
        if verdict.took:  # the leaf's entries move to its committed position (crops follow)
            self.target.move(slot, before + len(feed.draft.tokens), before + feed.leaf.at)
        row.stop = commit(row.seq, row.cursor, verdict.tokens, row.end, row.sink)
        row.sink.put(row.seq[before:])
        valid = before + verdict.accepted
        return Committed(valid, min(valid + verdict.took, len(row.seq) - 1), row.stop)

    def _keep(self, rows: list[Row], committed: list[Committed]) -> None:
        """Crop the target's cache to each row's `cached` tokens, the assistant's to its `valid` ones."""
        self.target.crop_rows([c.cached for c in committed])
        for row, length in zip(rows, self.target.lengths):
            row.cached = length
        if self.assistant is not None:
            self.assistant.rollback([row.helper_valid(c.valid) for row, c in zip(rows, committed)])

    def _learn(self, rows: list[Row], feeds: list[Feed], verdicts: list[Verdict], seconds: float, rounds: Rounds
               ) -> None:
        """Book the forward on the rows that fed it; tell each row's policy what the target judged and what its step
        cost; price the forward."""
        fed, computed = sum(bool(f.tokens) for f in feeds), self.target.positions([list(f.tokens) for f in feeds])
        if fed:
            self.stats.verified([f.tokens for f in feeds], computed)
        for row, f, v in zip(rows, feeds, verdicts):
            share = seconds / fed if f.tokens else 0.0  # each row that fed the forward shares its seconds
            if f.tokens:
                row.rec.forward(share)
            p = f.proposed
            row.policy.update(*judge(p.draft.forced, v.accepted), StepCost(len(f.tokens), share, p.forwards, p.seconds),
                              p.draft.model_confidence)
            if f.branch is not None and v.accepted == f.branch.at:  # did the target, rejecting the sibling, pick it?
                row.policy.observe_leaf(f.branch.confidence, v.after[0] == f.branch.token)
            row.rec.step(p.k, p.draft.sources, v.accepted, row.opts.coalesce)
            row.rec.branch(f.leaf is not None, v.took, priced_out=f.branch is not None and f.leaf is None)
        if self.prices is not None:
            cost = StepCost(computed, seconds if computed else 0.0, rounds.forwards, rounds.seconds)
            self.prices.observe(cost, [(row.policy, f.draft.model_confidence) for row, f in zip(rows, feeds)
                                       if row.policy in self.prices.members])
        for slot, row in enumerate(rows):
            self._tell_lag(slot, row)

    def finish(self, row: Row, slot: int | None = None) -> GenerationResult:
        """The row's result (its output validated), its caches kept for a prefix cache; closes its streamer.

        Raises ValueError where the guide accepted a text the schema rejects (a bug, never silent), unless `batch`:
        then that is the row's error."""
        with self.stats.timed("finish"):  # the row's caches kept, its costs memorized, its text decoded, checked
            row.sink.close()
            setup = self.setup
            if self.prefix_cache is not None and slot is not None:
                kept = self.assistant is not None and not setup.foreign  # a kept entry's tokens are the target's
                helper = self.assistant.kv.row_cache(slot) if kept else None
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

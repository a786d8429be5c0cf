"""The batched loop behind `assisted.generate_batch`: rows, their shared caches, and one step for all of them.

Per step: every row drafts by the single-row rule (`drafting.proposal.Proposal`: its own cursor, forced runs, prompt
lookup and draft length; `drafting.batch_draft.BatchAssistant` drafts for every asking row in one forward per
drafting step), the target verifies all rows' drafts in one forward over B x (longest feed) positions
(`drafting.batch_kv`), each row is accepted and commits by the single-row step rules (`assisted.steps`; one host
sync for the whole batch). A row that stops leaves; the next waiting row takes its slot (prefilled alone, copied
in); with none waiting the slot is dropped. The caches never hold more than `batch_size` rows."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import replace

import torch

from assisted.rows.batch_rows import Guides, Item, RowInput, prepare_row, token_bytes
from assisted.rows.batched_stats import BatchStats
from assisted.closing import outcome
from assisted.config import Settings, options
from assisted.inputs import parse_value
from assisted.policy.draft_policy import make_policy
from assisted.result import GenerationResult, Recorder
from assisted.steps import accept, commit, judge, needs_forward
from assisted.stopping import Sink, Stops
from drafting.base import DeviceMasks
from drafting.batch_draft import BatchAssistant
from drafting.batch_kv import BatchKV
from drafting.kv_cache import input_device, output_device
from drafting.lookup import PromptLookup
from drafting.proposal import Proposal
from drafting.sampling import make_generator


class Row:
    """One row being decoded: its sequence, cursor, policy, generators and counters."""

    def __init__(self, inp: RowInput, engine: Engine):
        self.inp, self.opts, self.cursor, self.prompt = inp, inp.opts, inp.cursor, inp.ids
        self.start = inp.cursor.copy()  # the guide before the first token (`assisted.closing.outcome` walks it)
        self.seq, self.end = list(inp.ids), len(inp.ids) + inp.opts.max_new_tokens
        self.cached = 0  # target tokens cached (always seq[:cached])
        self.policy = make_policy(self.opts.schedule, self.opts.num_assistant_tokens)
        self.rec = Recorder()  # started at admission: stats.seconds.total is the row's latency
        self.sink = Sink(Stops(engine.settings.stop_strings, None, engine.token_bytes, engine.device), None, inp.ids)
        seed = self.opts.seed
        self.generator = make_generator(output_device(engine.model), seed)
        self.helper_generator = None if engine.assistant is None else make_generator(
            output_device(engine.assistant.kv.model), None if seed is None else seed + 1)
        self.lookup = PromptLookup(engine.tokenizer, inp.ids) if self.opts.prompt_lookup else None
        self.helper_passes, self.helper_seconds = 0, 0.0
        self.stop = None
        self.prefilled = len(inp.ids)  # prompt tokens run by the target (the rest copied from a row sharing them)


class Engine:
    """The batch's caches and rows; `run(items)` yields (index, result) as rows finish."""

    def __init__(self, model, assistant_model, tokenizer, settings: Settings, logits_processor, guides: Guides,
                 batch_size: int, vocab_size: int, share_prefix: bool = False):
        self.model, self.tokenizer, self.settings, self.processors = model, tokenizer, settings, logits_processor
        self.guides, self.batch_size, self.vocab_size = guides, batch_size, vocab_size
        self.kv = BatchKV(model)
        self.assistant_model = assistant_model
        self.assistant = None if assistant_model is None else BatchAssistant(assistant_model, options(
            settings, 0, logits_processor).warp)
        self.device, self.token_bytes = input_device(model), token_bytes(tokenizer, vocab_size)
        self.masks = DeviceMasks(output_device(model))
        self.rows: list[Row] = []
        self.stats = BatchStats(batch_size)
        self.share_prefix = share_prefix  # prefill newcomers from a row caching the same prompt prefix

    def run(self, items: Iterable[Item]) -> Iterator[tuple[int, GenerationResult]]:
        """Decode `items`, at most `batch_size` at once, refilling freed slots; yields rows as they finish."""
        pending = iter(items)
        free = [None] * self.batch_size  # slots to fill: a finished row's index into self.rows, or None: a new row
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
                done = self._step()
            self.stats.tick()
            for slot in done:
                yield self.rows[slot].inp.item.index, self._result(self.rows[slot])
            free = done

    def _fill(self, slot: int | None, pending: Iterator[Item], kept: list[int]
              ) -> Iterator[tuple[int, GenerationResult]]:
        """Admit the next row that can be decoded into `slot`; yield the failed or finished-at-once rows on the way."""
        for item in pending:
            try:
                inp = prepare_row(item, self.model, self.assistant_model, self.tokenizer, self.vocab_size,
                                  self.settings, self.processors, self.guides)
            except (ValueError, TypeError) as error:
                self.stats.errors += 1
                yield item.index, self._error(str(error))
                continue
            row = Row(inp, self)
            if row.cursor.only_eos_left():  # the constraint allows nothing but EOS: done before any forward
                yield item.index, self._result(row, "final")
                continue
            slot = len(self.rows) if slot is None else slot
            with torch.inference_mode():
                self._admit(slot, row)
            kept.append(slot)
            return

    def _admit(self, slot: int, row: Row) -> None:
        """Prefill the row's prompt (all but its last token) alone and copy it into `slot`."""
        refill = slot < len(self.rows)
        self.stats.rows, self.stats.refills = self.stats.rows + 1, self.stats.refills + refill
        ids = row.prompt[:-1]
        source, shared = self._shared(self.kv, ids)
        self.kv.place(slot, ids, source, shared)
        row.prefilled = len(row.prompt) - shared
        if self.assistant is not None:
            self.assistant.kv.place(slot, ids, *self._shared(self.assistant.kv, ids))
        self.stats.prefill_forwards += (len(row.prompt) > 1) * (1 + (self.assistant is not None))
        row.cached = len(ids)
        if refill:
            self.rows[slot] = row
        else:
            self.rows.append(row)

    def _shared(self, kv: BatchKV, ids: list[int]) -> tuple[int | None, int]:
        """(row, tokens): the row of `kv` that caches the longest prefix of `ids` (off unless `share_prefix`)."""
        best = (None, 0)
        if not self.share_prefix:
            return best
        for r, (row, length) in enumerate(zip(self.rows, kv.lengths)):
            cached = row.seq[: min(length, len(ids))]
            same = next((i for i, (a, b) in enumerate(zip(cached, ids)) if a != b), len(cached))
            best = max(best, (r, same), key=lambda pair: pair[1])
        return best

    def _drop(self, gone: list[int]) -> None:
        keep = [s for s in range(len(self.rows)) if s not in gone]
        self.kv.drop(keep)
        if self.assistant is not None:
            self.assistant.kv.drop(keep)
        self.rows = [self.rows[s] for s in keep]

    def _step(self) -> list[int]:
        """One draft -> verify -> commit step for every row; returns the slots whose rows stopped."""
        ks = [row.policy.k for row in self.rows]
        built = self._drafts()
        forward = [needs_forward(d, len(r.seq), r.end, r.opts.coalesce) for r, d in zip(self.rows, built)]
        feeds = [r.seq[r.cached:] + list(d.tokens) if f else [] for r, d, f in zip(self.rows, built, forward)]
        verdicts = self._verify(feeds, built) if any(forward) else [None] * len(feeds)
        done, valid = [], []
        for slot, (row, draft, verdict) in enumerate(zip(self.rows, built, verdicts)):
            n, after = (len(draft.tokens), []) if verdict is None else (verdict[0], [verdict[1]])
            valid.append(len(row.seq) + n)
            stop = commit(row.seq, row.cursor, [*draft.tokens[:n], *after], row.end, row.sink)
            row.cached = min(valid[-1], len(row.seq) - 1)
            row.policy.update(*judge(draft.forced, n))
            row.rec.step(ks[slot], draft.sources, n, row.opts.coalesce)
            if stop is not None:
                row.stop = stop
                done.append(slot)
        self.kv.crop_rows([row.cached for row in self.rows])
        for row, length in zip(self.rows, self.kv.lengths):
            row.cached = length
        if self.assistant is not None:
            self.assistant.rollback(valid)
        return done

    def _drafts(self) -> list:
        """Every row's draft: its proposal, the assistant's tokens for all asking rows drafted together."""
        proposals = [self._proposal(row) for row in self.rows]
        if self.assistant is None:
            for proposal in proposals:
                proposal.fill()
        else:
            before, forwards = self.assistant.seconds, self.assistant.forwards
            took = self.assistant.draft(proposals, [r.helper_generator for r in self.rows],
                                        [r.opts.processors for r in self.rows])
            self.stats.assistant_forwards += self.assistant.forwards - forwards
            share = (self.assistant.seconds - before) / max(1, sum(took))
            for row, n in zip(self.rows, took):
                row.helper_passes, row.helper_seconds = row.helper_passes + n, row.helper_seconds + n * share
        device = None if self.assistant is None else self.assistant.kv.device
        return [p.draft(self.masks, self.vocab_size, device) for p in proposals]

    def _proposal(self, row: Row) -> Proposal:
        """The row's proposal from its committed state, as `CombinedSource.propose` builds it (no cut)."""
        assisted = self.assistant is not None
        return Proposal(row.seq, row.cursor.copy(), k=row.policy.k if assisted else 0,
                        lookup_k=min(row.policy.lookup_k, row.opts.lookup_tokens), limit=row.end - len(row.seq) - 1,
                        lookup=row.lookup, use_forced=assisted or row.opts.coalesce, coalesced=row.opts.coalesce,
                        sampling=self.settings.do_sample)

    def _verify(self, feeds: list[list[int]], drafts: list) -> list[list[int] | None]:
        """One target forward over every row's feed; each row's [n, token] (None for a row that fed nothing)."""
        start = time.perf_counter()
        logits = self.kv.forward(feeds)  # (B, m, V)
        self.stats.verified(feeds)
        outs = []
        for row, feed, draft, r in zip(self.rows, feeds, drafts, range(len(feeds))):
            if not feed:
                continue
            k = len(draft.tokens)
            rows = logits[r, len(feed) - k - 1 : len(feed)]  # (k+1, V): after each draft prefix
            outs.append(accept(rows, row.seq, draft, None, row.opts, row.generator))
        flat = iter(torch.stack(outs).tolist())  # the step's one host sync, for every row
        share = (time.perf_counter() - start) / len(outs)
        verdicts = []
        for row, feed in zip(self.rows, feeds):
            if feed:
                row.rec.target_passes += 1
                row.rec.target_seconds += share
            verdicts.append(next(flat) if feed else None)
        return verdicts

    def _result(self, row: Row, stop: str | None = None) -> GenerationResult:
        new = row.seq[len(row.prompt):]
        text = self.tokenizer.decode(new, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        try:
            value = parse_value(row.inp.item.schema, text, row.cursor.accepting())
        except ValueError as error:  # a guide that accepted what the schema rejects: this row's error, never silent
            return self._error(str(error))
        stats = row.rec.freeze(len(new), row.helper_passes, row.helper_seconds, row.cursor.clock.seconds,
                               None, row.prefilled)
        tightened, stop = outcome(row.start, new, stop or row.stop)
        return GenerationResult(text, new, value, stop, replace(stats, budget_tightened=tightened), None, self.stats)

    def _error(self, message: str) -> GenerationResult:
        """A failed row's result; its error on one line (an output line of the CLI)."""
        message = " ".join(message.split("\n"))
        return GenerationResult("", [], None, "error", Recorder().freeze(0, 0, 0.0, 0.0), message, self.stats)

"""Drafting for B rows at once: each row's forced runs and prompt-lookup copies on the host, the assistant's
tokens for every row that wants one from one forward per drafting step.

`RowDraft` is `CombinedSource.propose` without a `cut` (the batched loop runs the fixed schedules) turned into a
state machine: `fill()` appends free tokens until the row needs an assistant token (True) or its draft is done
(False); `give()` hands it the assistant's token. The order of tokens, sources and masks is that of the single-row
source, so each row drafts what it would draft alone.
"""

from __future__ import annotations

import math
import time

import torch

from drafting.base import Cursor, DeviceMasks, Draft
from drafting.batch_kv import BatchKV
from drafting.forced import ForcedTokens
from drafting.lookup import PromptLookup
from drafting.sampling import Warp, masked, probs, sample


class RowDraft:
    """One row's draft in progress, from its committed sequence `seq` and guide state `cursor` (advanced here)."""

    def __init__(self, seq: list[int], cursor: Cursor, k: int, limit: int, lookup_k: int,
                 lookup: PromptLookup | None, use_forced: bool, coalesced: bool, assisted: bool):
        self.seq, self.cursor, self.k, self.limit, self.lookup_k = seq, cursor, k, limit, lookup_k
        self.lookup, self.use_forced, self.coalesced, self.assisted = lookup, use_forced, coalesced, assisted
        self.tokens, self.sources, self.rows, self.masks = [], [], [], [cursor.mask()]
        self.run, self.copied, self.finished = ForcedTokens(), [], cursor.only_eos_left()

    @property
    def context(self) -> list[int]:
        return self.seq + self.tokens

    def tail(self, start: int) -> list[int]:
        """`context[start:]` without copying the committed sequence before `start`."""
        if start >= len(self.seq):
            return self.tokens[start - len(self.seq):]
        return self.seq[start:] + self.tokens

    def fill(self) -> bool:
        """Append forced and copied tokens; True when the next token must come from the assistant."""
        while len(self.tokens) <= self.limit and not self.finished:
            last = len(self.tokens) == self.limit  # the target's slot: only a coalesced forced token may take it
            if last and not self.coalesced:
                break
            token, source = (self.run.next(self.cursor) if self.use_forced else None), "forced"
            if last and token is None:
                break
            assisting = self.assisted and self.sources.count("assistant") < self.k
            if token is None and not assisting and (looked := self.sources.count("lookup")) < self.lookup_k:
                token, source = self._copy(self.lookup_k - looked), "lookup"
            if token is None and assisting:
                return True
            if token is None:
                break
            self._push(token, source)
        return False

    def give(self, token: int, q: torch.Tensor | None) -> None:
        """The assistant's token for this row and its q row (1, V) when sampling."""
        if q is not None:
            self.rows.append(q)
        self._push(token, "assistant")

    def _push(self, token: int, source: str) -> None:
        self.tokens.append(token)
        self.sources.append(source)
        ends = token in self.cursor.eos  # nothing follows EOS; the bonus row is never used
        if not ends:
            self.cursor.advance(token)
        self.masks.append(self.masks[-1] if ends else self.cursor.mask())
        self.finished = ends or self.cursor.only_eos_left()

    def _copy(self, room: int) -> int | None:
        """The next prompt-lookup token if the guide allows it (the rest of the copied run is kept)."""
        if self.lookup is None:
            return None
        self.copied = self.copied or self.lookup.continuation(self.context, room)
        mask = self.masks[-1]
        if not self.copied or (mask is not None and not bool(mask[self.copied[0]])):
            self.copied = []
            return None
        token, self.copied = self.copied[0], self.copied[1:]
        return token

    def draft(self, target_masks: DeviceMasks, sampling: bool, vocab_size: int, device) -> Draft:
        """The finished draft: masks (k+1, V) on the target's device, q (k, V) when sampling."""
        masks = None if self.masks[0] is None else torch.stack([target_masks(m) for m in self.masks])
        q = None
        if sampling:
            q = torch.zeros(len(self.tokens), vocab_size, device=device)  # (k, V); point masses one-hot
            points = [i for i, s in enumerate(self.sources) if s != "assistant"]
            q[points, [self.tokens[i] for i in points]] = 1.0
            if self.rows:
                q[[i for i, s in enumerate(self.sources) if s == "assistant"]] = torch.cat(self.rows)
        return Draft(tuple(self.tokens), tuple(self.sources), masks, q, (math.nan,) * len(self.tokens),
                     self.finished)


class BatchAssistant:
    """The assistant over a `BatchKV`: one forward drafts one token for every row that asks."""

    def __init__(self, model, warp: Warp):
        self.kv, self.warp = BatchKV(model), warp
        self.masks = DeviceMasks(self.kv.device)
        self.forwards, self.seconds = 0, 0.0

    def draft(self, drafts: list[RowDraft], generators: list, processors: list) -> list[int]:
        """Complete every row's draft; returns how many assistant forwards each row took part in.

        Row r's assistant cache holds a prefix of its context; each forward feeds every asking row what its cache
        lacks (the target's tokens since, and the last drafted token) and samples its next token with its own
        generator (`generators[r]`), after its logits processors and its guide's mask.
        """
        took = [0] * len(drafts)
        asking = [d.fill() for d in drafts]
        while any(asking):
            start = time.perf_counter()
            feeds = [d.tail(n) if ask else [] for d, ask, n in zip(drafts, asking, self.kv.lengths)]
            logits = self.kv.forward(feeds)  # (B, m, V)
            picks, qs = [], []
            for r in (r for r, ask in enumerate(asking) if ask):
                row = logits[r, len(feeds[r]) - 1][None]  # (1, V): after the whole context
                if processors[r]:
                    context = drafts[r].context
                    row = processors[r](context, row, len(context))
                mask = self.masks(drafts[r].masks[-1])
                row = masked(row.float(), None if mask is None else mask[None])  # (1, V)
                q = probs(row, None, self.warp) if self.warp.do_sample else None
                picks.append(sample(q, generators[r]) if q is not None else row.argmax(-1))  # (1,)
                qs.append(q)
                took[r] += 1
            tokens = torch.cat(picks).tolist()  # the drafting step's one host sync
            for r, token, q in zip([r for r, ask in enumerate(asking) if ask], tokens, qs):
                drafts[r].give(int(token), q)
            self.forwards += 1
            self.seconds += time.perf_counter() - start
            asking = [ask and d.fill() for d, ask in zip(drafts, asking)]
        return took

    def rollback(self, valid: list[int]) -> None:
        """Row r committed only the first `valid[r]` tokens of its last context."""
        self.kv.crop_rows(valid)

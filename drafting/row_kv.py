"""The rows interface of the engine's caches, and one row's `KV` behind it.

The engine (`assisted.rows.engine`) decodes one row or many on one interface, `RowsKV`: `run` feeds each row its new
tokens (a draft tree's leaf included) and returns the logits each row keeps, `positions` says how many positions such a
forward computes (the engine prices it by them), `crop_rows` keeps each row's committed prefix, `place` admits a row
(its prompt, or a kept prefix of it), `move` moves one cached position of a row (a taken leaf), `row_cache` hands out
a row's entries (`assisted.PrefixCache`), `drop` lets rows go. Two implementations: `drafting.batch_kv.BatchKV` (B
rows of different lengths on one physical cache, prompts prefilled at admission; ragged or padded forwards) and
`OneRow` here (one row on a `DynamicKV` or a static `StaticKV`, possibly captured; its first forward feeds the
prompt, as a single call always has).
"""

from __future__ import annotations

from typing import Protocol

import torch
from transformers import DynamicCache

from drafting.kv_cache import KV, DynamicKV
from drafting.tree import Branch, move_leaf, tree_forward

Leaf = tuple[int, Branch]  # (committed length of the row, the branch): the last token fed is the branch's leaf


class RowsKV(Protocol):
    """One model's cache for the engine's rows."""

    prefills: bool  # `place` runs a prompt's prefill (else the row's first forward feeds it)
    model: object  # the model its forwards run
    lengths: list[int]  # tokens cached per row

    def run(self, feeds: list[list[int]], keep: list[int], leaves: list[Leaf | None] | None = None
            ) -> list[torch.Tensor | None]:
        """Feed row r `feeds[r]` after its cached tokens (the last one a leaf where `leaves[r]`); row r's logits of its
        last `keep[r]` tokens, (keep[r], V), or None where it was fed nothing."""

    def positions(self, feeds: list[list[int]]) -> int:
        """How many positions a `run` over these feeds computes, padding included (0 where none feeds anything)."""

    def crop_rows(self, lengths: list[int]) -> None:
        """Keep at most `lengths[r]` cached tokens of row r."""

    def place(self, slot: int, ids: list[int], shared: int = 0, source: int | DynamicCache | None = None) -> None:
        """Admit a row into `slot` (== the number of rows: a new one) for the prompt `ids` (all but its last token),
        the first `shared` of them from `source`: another row, or a kept cache of them."""

    def move(self, row: int, source: int, target: int) -> None:
        """Copy row `row`'s cached entries at position `source` to `target`."""

    def row_cache(self, row: int) -> DynamicCache:
        """Row `row`'s cached entries as a cache of their own (kept by `assisted.PrefixCache`)."""

    def drop(self, keep: list[int]) -> None:
        """Keep only the rows `keep`, in this order."""


class OneRow:
    """One row's `KV` (a `DynamicKV`, a kept prefix, or a held `StaticKV`) behind `RowsKV`."""

    prefills = False

    def __init__(self, model, kv: KV | None = None):
        self.model, self.kv = model, kv if kv is not None else DynamicKV(model)

    @property
    def lengths(self) -> list[int]:
        return [self.kv.length]

    def run(self, feeds: list[list[int]], keep: list[int], leaves: list[Leaf | None] | None = None
            ) -> list[torch.Tensor | None]:
        if not feeds[0]:
            return [None]
        if leaves and leaves[0] is not None:  # trees run on dynamic caches only (`assisted.caching.plan_caches`)
            return [tree_forward(self.model, self.kv.cache, leaves[0][0], feeds[0], leaves[0][1])]  # (k+2, V)
        return [self.kv.run(feeds[0], keep[0])]  # (keep, V)

    def positions(self, feeds: list[list[int]]) -> int:
        return len(feeds[0])  # a captured static step pads to its bucket: priced by its feed, as its costs are kept

    def crop_rows(self, lengths: list[int]) -> None:
        self.kv.crop(lengths[0])

    def place(self, slot: int, ids: list[int], shared: int = 0, source: int | DynamicCache | None = None) -> None:
        if isinstance(source, DynamicCache):  # a kept prefix (`assisted.PrefixCache.take`), the rest fed lazily
            self.kv = DynamicKV(self.model, source)

    def move(self, row: int, source: int, target: int) -> None:
        move_leaf(self.kv.cache, source, target)

    def row_cache(self, row: int) -> DynamicCache:
        return self.kv.cache

    def drop(self, keep: list[int]) -> None:
        pass

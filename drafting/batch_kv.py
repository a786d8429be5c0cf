"""One physical KV cache for B rows of different lengths (the batched loop's target and assistant caches).

Every layer holds keys and values of shape (B, H, P, D). Row r's valid entries are always the prefix
[0, lengths[r]) of its columns; columns [lengths[r], P) are holes (padding, rejected drafts, what a shorter row
left behind), hidden from every query by the attention mask. `run` takes one of two paths:

- Ragged (a model with a `ragged_forward` attribute, whose attention is the row-invariant op: a 4-bit model whose
  decoder layers are all fused, `assisted.models.fused_layers`): every row's feed is packed end to end into N = sum
  of the feeds' lengths positions (`RaggedBatch`), run as one (N, hidden) matrix, no padding; each row's new keys
  and values are written straight to its columns [lengths[r], lengths[r] + len(feed)) (P grown first), and the
  head runs on the kept positions only. Nothing to move afterwards.
- Padded (any other model, `forward`): a forward appends m columns to every row (each row's feed, right-padded to
  the longest, m), then moves each row's real new entries left, to right after its valid prefix, and crops P to the
  longest row. The head runs on all B x m positions.

Either way holes never pile up in the middle of a row, and no full copy of the cache is made per step. `positions`
says how many positions a forward over given feeds computes (the engine prices the forward by it).

On the padded path, padded queries attend to their row's valid keys and to the new columns up to their own (they
always see themselves), so no query row is fully masked: every stored value is finite (a NaN in a hole would poison
later rows through 0 * NaN in the attention product). On the ragged path a padded query slot attends to nothing (the
op gives zeros) and is never stored. Positions are per row (`position_ids`), so a row's
entries are those of the row decoded alone. A row's feed may end in a draft tree's leaf: its query does not see the
chain from its sibling on, and it sits at its sibling's position (`drafting.tree`). This needs an attention that
applies a custom 4D mask (`structspec_ops.attention.MASKED_ATTENTIONS`) and a model without sliding-window layers.
`BatchKV` is the engine's `drafting.row_kv.RowsKV` for B rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from typing import Callable

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from drafting.kv_cache import cache_argument, input_device
from drafting.row_kv import Leaf
from structspec_ops.attention import ATTENTION, MASKED_ATTENTIONS

PAD = 0  # the id fed at padded positions (its entries are holes)


def check_batch_model(model, name: str = "model") -> None:
    """Raise ValueError unless `model` can run rows of different lengths on one cache (before any model call)."""
    config = model.config
    attention = getattr(config, "_attn_implementation", None)
    if attention not in MASKED_ATTENTIONS:
        raise ValueError(f"batched generation needs attn_implementation in {MASKED_ATTENTIONS} (a custom 4D mask); "
                         f"{name} has {attention!r}")
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    sliding = "sliding_attention" in (getattr(text, "layer_types", None) or ()) or (
        getattr(text, "use_sliding_window", False) and getattr(text, "sliding_window", None))
    if sliding:
        raise ValueError(f"batched generation does not support sliding-window attention ({name})")


@dataclass(frozen=True)
class RaggedBatch:
    """One ragged forward: every row's feed packed end to end, N positions in all, and where their keys, values and
    queries go (`BatchKV.run`'s fast path; the model's `ragged_forward` runs it)."""

    cache: DynamicCache  # the batch's: layers (B, H_kv, P, D), P wide enough for every row's new entries
    ids: torch.Tensor  # (N,) long: the fed tokens, row after row
    positions: torch.Tensor  # (N,) long: each token's position (a tree leaf: its sibling's)
    rows: torch.Tensor  # (N,) long: each token's row
    slots: torch.Tensor  # (N,) long: its index in its row's feed (its query row in a padded (B, m) block)
    columns: torch.Tensor  # (N,) long: its cache column, lengths[row] + slot
    mask: torch.Tensor  # (B, 1, m, P) bool: what each query slot attends to (a padded slot: nothing)
    kept: torch.Tensor  # (K,) long: the positions (indices into N) whose logits are kept, row after row

    def store(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write layer `layer`'s new keys and values (N, H_kv, D) to their rows' columns; returns all of that layer's,
        (B, H_kv, P, D) each. A layer the cache does not have yet (no row cached anything) is made, zeros."""
        if layer == len(self.cache.layers):
            batch, _, _, width = self.mask.shape
            shape = (batch, keys.shape[1], width, keys.shape[2])
            self.cache.layers.append(_layer(keys.new_zeros(shape), values.new_zeros(shape)))
        cached = self.cache.layers[layer]
        cached.keys[self.rows, :, self.columns] = keys
        cached.values[self.rows, :, self.columns] = values
        return cached.keys, cached.values

    def queries(self, q: torch.Tensor) -> torch.Tensor:
        """(N, H, D) -> (B, H, m, D): each query at its row and slot, zeros at padded slots."""
        batch, _, m, _ = self.mask.shape
        padded = q.new_zeros(batch, m, *q.shape[1:])  # (B, m, H, D)
        padded[self.rows, self.slots] = q
        return padded.transpose(1, 2)

    def packed(self, out: torch.Tensor) -> torch.Tensor:
        """The attention's output (B, m, H, D) -> (N, H D), row after row (padded slots left out)."""
        return out[self.rows, self.slots].reshape(len(self.rows), -1)


class BatchKV:
    """The cache of one model for B rows; `lengths[r]` tokens of row r are cached."""

    def __init__(self, model, lazy: bool = False, defer_after_prefix: bool = False):
        self.model, self.cache, self.lengths, self.lazy = model, DynamicCache(), [], lazy
        self.defer_after_prefix = defer_after_prefix
        self.device = input_device(model)
        dtype = model.get_input_embeddings().weight.dtype
        self.dtype = dtype if dtype.is_floating_point else torch.float32

    @property
    def prefills(self) -> bool:
        """Whether `place` runs a newcomer's prompt alone. A `lazy` cache on the ragged path only copies a shared
        prefix there: the row's first `run` feeds the rest of its context, packed beside the other rows' tokens (no
        padding, so a long feed widens no other row), and a row that never runs costs nothing (an assistant whose
        policy never drafts for it)."""
        return not self.defers(0)

    def defers(self, shared: int) -> bool:
        """Whether `place` leaves a newcomer's prompt past a copied prefix of `shared` entries to the row's first
        `run`: a `lazy` cache always; one made `defer_after_prefix` where it copies a prefix, so the rows that share an
        instruction feed their own rests packed into one forward (the weights read once, not once a row) while a row
        that shares nothing is prefilled at once, for the rows after it to copy. Only on the ragged path."""
        return (self.lazy or (self.defer_after_prefix and shared > 0)) and self.ragged() is not None

    @property
    def width(self) -> int:
        """P: the physical columns of every row."""
        return self.cache.get_seq_length()

    def run(self, feeds: list[list[int]], keep: list[int], leaves: list[Leaf | None] | None = None
            ) -> list[torch.Tensor | None]:
        """`drafting.row_kv.RowsKV.run`: one forward over every row's feed; row r's logits (keep[r], V), None where it
        was fed nothing. Ragged where the model has that path (`ragged`), else padded (`forward`)."""
        if not any(feeds):
            return [None] * len(feeds)
        fast = self.ragged()
        if fast is not None:
            logits = fast(self.model, self._pack(feeds, keep, leaves))  # (K, V)
            logits = logits.split([k if f else 0 for f, k in zip(feeds, keep)])
            self.lengths = [n + len(f) for n, f in zip(self.lengths, feeds)]
            return [x if f else None for f, x in zip(feeds, logits)]  # (keep[r], V) each
        logits = self.forward(feeds, leaves)  # (B, m, V)
        return [logits[r, len(f) - k : len(f)] if f else None for r, (f, k) in enumerate(zip(feeds, keep))]

    def ragged(self) -> Callable[[object, RaggedBatch], torch.Tensor] | None:
        """The model's `ragged_forward(model, RaggedBatch)` -> logits (K, V) where it applies (its attention is the
        row-invariant op), else None: then `run` pads."""
        fast = getattr(self.model, "ragged_forward", None)
        return fast if fast is not None and self.model.config._attn_implementation == ATTENTION else None

    def positions(self, feeds: list[list[int]]) -> int:
        """Positions a `run` over these feeds computes: the feeds' own on the ragged path, B rows x the longest feed
        on the padded one (0 where no row feeds anything)."""
        if not any(feeds):
            return 0
        return sum(map(len, feeds)) if self.ragged() is not None else len(feeds) * max(map(len, feeds))

    def forward(self, feeds: list[list[int]], leaves: list[Leaf | None] | None = None) -> torch.Tensor:
        """The padded path: run row r's `feeds[r]` (not yet cached) after its cached tokens; logits (B, m, V), m = the
        longest feed.

        Row r's logits are rows [0, len(feeds[r])) of its (m, V) block; after the call those tokens are cached.
        Where `leaves[r]` is given, row r's last token is that leaf of a draft tree.
        """
        b, m, past = len(feeds), max(1, max(map(len, feeds))), self.width
        assert b == len(self.lengths), "one feed per row"
        ids = torch.tensor([f + [PAD] * (m - len(f)) for f in feeds], dtype=torch.long, device=self.device)  # (B, m)
        positions = [[n + min(j, max(len(f) - 1, 0)) for j in range(m)] for n, f in zip(self.lengths, feeds)]
        mask = self._mask(past, m)  # (B, 1, m, past + m)
        for r, leaf in enumerate(leaves or ()):
            if leaf is not None:
                hidden, positions[r][len(feeds[r]) - 1] = self._leaf(r, past, len(feeds[r]), *leaf)
                mask[r, 0, len(feeds[r]) - 1, hidden] = torch.finfo(mask.dtype).min
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=torch.tensor(positions, device=self.device),
                         use_cache=True, logits_to_keep=m, **{cache_argument(type(self.model)): self.cache})
        self._compact(past, [len(f) for f in feeds])
        return out.logits  # (B, m, V)

    def _leaf(self, r: int, start: int, fed: int, committed: int, branch) -> tuple[slice, int]:
        """Row r's leaf, the last of its `fed` new tokens (the first at mask column `start`): the mask columns it must
        not see (chain[at:], from its sibling on) and its position (its sibling's)."""
        chain = committed - self.lengths[r]  # query index of chain[0]
        return slice(start + chain + branch.at, start + fed - 1), committed + branch.at

    def _pack(self, feeds: list[list[int]], keep: list[int], leaves: list[Leaf | None] | None) -> RaggedBatch:
        """The ragged path's layout of these feeds; P grown to hold every row's new entries."""
        assert len(feeds) == len(self.lengths), "one feed per row"
        fed = [len(f) for f in feeds]
        width = max(self.width, *(n + f for n, f in zip(self.lengths, fed)))
        if self.width < width:
            self._grow_width(width)
        rows = [r for r, f in enumerate(fed) for _ in range(f)]  # (N,)
        slots = [j for f in fed for j in range(f)]
        columns = [self.lengths[r] + j for r, j in zip(rows, slots)]
        starts = list(accumulate(fed, initial=0))  # each row's first index into N
        positions, mask = list(columns), self._ragged_mask(fed, width)
        for r, leaf in enumerate(leaves or ()):
            if leaf is not None:
                hidden, positions[starts[r] + fed[r] - 1] = self._leaf(r, self.lengths[r], fed[r], *leaf)
                mask[r, 0, fed[r] - 1, hidden] = False
        kept = [s + j for s, f, k in zip(starts, fed, keep) if f for j in range(f - k, f)]  # (K,)
        ids, positions, rows, slots, columns, kept = (torch.tensor(x, dtype=torch.long, device=self.device) for x in
                                                      (sum(feeds, []), positions, rows, slots, columns, kept))
        return RaggedBatch(self.cache, ids, positions, rows, slots, columns, mask, kept)

    def _ragged_mask(self, fed: list[int], width: int) -> torch.Tensor:
        """Bool (B, 1, m, P): row r's query j < fed[r] sees its keys [0, lengths[r] + j]; a padded query sees none."""
        m, device = max(fed), self.device
        query = torch.arange(m, device=device)[None]  # (1, m)
        last = torch.tensor(self.lengths, device=device)[:, None] + query  # (B, m): the last key each query sees
        last = last.masked_fill(query >= torch.tensor(fed, device=device)[:, None], -1)  # padded queries: none
        return (torch.arange(width, device=device)[None, None] <= last[..., None])[:, None]

    def _mask(self, past: int, m: int) -> torch.Tensor:
        """Additive (B, 1, m, past + m): row r's valid prefix, then causal over the new columns."""
        lengths = torch.tensor(self.lengths, device=self.device)  # (B,)
        cached = torch.arange(past, device=self.device)[None, :] < lengths[:, None]  # (B, past)
        causal = torch.ones(m, m, dtype=torch.bool, device=self.device).tril()  # (m, m)
        seen = torch.cat([cached[:, None, :].expand(-1, m, -1), causal[None].expand(len(self.lengths), -1, -1)], -1)
        low = torch.finfo(self.dtype).min
        return torch.zeros(seen.shape, dtype=self.dtype, device=self.device).masked_fill(~seen, low)[:, None]

    def _compact(self, past: int, fed: list[int]) -> None:
        """Move each row's `fed[r]` new entries (columns past, past + 1, ...) to right after its valid prefix."""
        rows = [r for r, n in enumerate(fed) for _ in range(n) if self.lengths[r] != past]
        if rows:
            src = [past + j for r, n in enumerate(fed) for j in range(n) if self.lengths[r] != past]
            dst = [self.lengths[r] + j for r, n in enumerate(fed) for j in range(n) if self.lengths[r] != past]
            r, s, d = (torch.tensor(x, device=self.device) for x in (rows, src, dst))
            for layer in self.cache.layers:
                layer.keys[r, :, d] = layer.keys[r, :, s]  # (N, H, D)
                layer.values[r, :, d] = layer.values[r, :, s]
        self.lengths = [n + f for n, f in zip(self.lengths, fed)]
        self._crop_width()

    def crop_rows(self, lengths: list[int]) -> None:
        """Keep at most `lengths[r]` cached tokens of row r."""
        self.lengths = [min(n, keep) for n, keep in zip(self.lengths, lengths)]
        self._crop_width()

    def _crop_width(self) -> None:
        extra = self.width - max(self.lengths, default=0)
        if extra > 0:
            for layer in self.cache.layers:
                layer.crop(-extra)

    def drop(self, keep: list[int]) -> None:
        """Keep only the rows `keep` (in this order): finished rows with no document to take their slot."""
        self.lengths = [self.lengths[r] for r in keep]
        index = torch.tensor(keep, dtype=torch.long, device=self.device)
        for layer in self.cache.layers:
            if layer.is_initialized:
                layer.keys, layer.values = layer.keys[index], layer.values[index]
        if not keep:
            self.cache = DynamicCache()
        self._crop_width()

    def place(self, slot: int, ids: list[int], shared: int = 0, source: int | DynamicCache | None = None) -> None:
        """Prefill `ids` alone (their own forward) into row `slot` (an existing row is replaced; `slot == B` adds one).

        With `source`, the first `shared` entries are copied from row `source`, which caches the same first `shared`
        tokens (a shared instruction), or from a cache holding them (`assisted.PrefixCache`), and only the rest of
        `ids` is run (not at all where `defers`: `lengths[slot]` then says what is cached). The caller never
        adds a row beyond its batch size: the cache holds at most that many rows.
        """
        prefix = None if source is None or shared <= 0 else self._prefix(source, shared)  # taken before `slot` goes
        if slot == len(self.lengths):
            self.lengths.append(0)
            self._grow_rows()
        self.lengths[slot] = 0
        if not ids:
            return self._crop_width()
        small = DynamicCache()
        small.layers.extend(_layer(keys, values) for keys, values in prefix or ())
        if self.defers(shared if prefix else 0):
            ids = ids[:shared] if prefix else []
            if not ids:
                return self._crop_width()
        rest = ids[shared:] if prefix else ids
        if rest:
            x = torch.tensor([rest], dtype=torch.long, device=self.device)  # (1, n - shared)
            self.model(input_ids=x, use_cache=True, logits_to_keep=1, **{cache_argument(type(self.model)): small})
        n = len(ids)
        if not self.cache.layers:
            self._create(small, n)
        if self.width < n:
            self._grow_width(n)
        for layer, new in zip(self.cache.layers, small.layers):
            layer.keys[slot, :, :n], layer.values[slot, :, :n] = new.keys[0], new.values[0]
        self.lengths[slot] = n
        self._crop_width()

    def _prefix(self, source: int | DynamicCache, shared: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(keys, values) (1, H, shared, D) per layer: row `source`'s first `shared` entries, or a kept cache's."""
        if isinstance(source, DynamicCache):
            return [(layer.keys[:, :, :shared], layer.values[:, :, :shared]) for layer in source.layers]
        rows = slice(source, source + 1)
        return [(layer.keys[rows, :, :shared].clone(), layer.values[rows, :, :shared].clone())
                for layer in self.cache.layers]

    def move(self, row: int, source: int, target: int) -> None:
        """Copy row `row`'s entries at position `source` to `target`, in every layer (a taken leaf)."""
        for layer in self.cache.layers:
            layer.keys[row, :, target] = layer.keys[row, :, source]
            layer.values[row, :, target] = layer.values[row, :, source]

    def row_cache(self, row: int) -> DynamicCache:
        """Row `row`'s cached entries, copied into a one-row `DynamicCache`."""
        out, n = DynamicCache(), self.lengths[row]
        out.layers.extend(_layer(layer.keys[row : row + 1, :, :n].clone(), layer.values[row : row + 1, :, :n].clone())
                          for layer in self.cache.layers)
        return out

    def _create(self, small: DynamicCache, n: int) -> None:
        for new in small.layers:
            layer = DynamicLayer()
            shape = (len(self.lengths), new.keys.shape[1], n, new.keys.shape[3])
            layer.lazy_initialization(new.keys, new.values)
            layer.keys, layer.values = new.keys.new_zeros(shape), new.values.new_zeros(shape)
            self.cache.layers.append(layer)

    def _grow_width(self, n: int) -> None:
        for layer in self.cache.layers:
            layer.keys, layer.values = _widened(layer.keys, n), _widened(layer.values, n)

    def _grow_rows(self) -> None:
        for layer in self.cache.layers:
            if layer.is_initialized:
                layer.keys, layer.values = (torch.cat([t, t.new_zeros((1, *t.shape[1:]))])
                                            for t in (layer.keys, layer.values))


def _widened(t: torch.Tensor, n: int) -> torch.Tensor:
    """(B, H, n, D): `t` (B, H, P, D), P <= n, with n - P more columns, as a view of a buffer with room to spare: of
    `t`'s own buffer where it has the room (nothing copied), else of a new one of 2n columns, zeros past P. The new
    columns are holes whatever they hold (zeros, or what a crop left: finite keys and values): every row's mask ends
    at its length, so the row-invariant attention skips them and a float model's weighs them 0. A step widens the
    cache without copying it."""
    b, h, p, d = t.shape
    viewed = t.stride(2) == d and t.stride(3) == 1 and t.stride(0) == h * t.stride(1) and t.storage_offset() == 0
    room = t.stride(1) // d if viewed else p  # columns of the buffer `t` views
    if n <= room and t.untyped_storage().nbytes() >= b * h * room * d * t.element_size():
        return t.as_strided((b, h, n, d), t.stride())
    buffer = t.new_zeros((b, h, 2 * n, d))
    buffer[:, :, :p] = t
    return buffer[:, :, :n]


def _layer(keys: torch.Tensor, values: torch.Tensor) -> DynamicLayer:
    """A cache layer holding these keys and values (1, H, n, D)."""
    layer = DynamicLayer()
    layer.lazy_initialization(keys, values)
    layer.keys, layer.values = keys, values
    return layer

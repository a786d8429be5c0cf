"""KV caches in one place: a forward over the tokens a cache has not seen, and the crop after commit.

Both the target and the assistant keep one cache for the whole generation, behind one interface (`KV`): `run(ids,
keep)` feeds tokens the cache has not seen and returns the logits of the last `keep`, `crop(length)` keeps the first
`length` positions, `length` is how many it holds. Two implementations: `DynamicKV`, transformers' `DynamicCache`
(transformers 5.x: `DynamicCache.crop(-n)` removes n positions) whose layers append into spare room
(`GrowingLayer`) instead of copying the whole cache at every step, and `drafting.static_cache.StaticKV` (pre-allocated,
its forwards possibly replayed from CUDA graphs; a crop moves its length). A cache is never rebuilt; the caller tracks
how many committed tokens each holds. The rows engine's `drafting.batch_kv.BatchKV` is the same for B rows (`run`
over one feed per row, ragged or padded, `crop_rows`). `forward` and `crop_to` serve code that holds a bare
`DynamicCache`.
"""

from __future__ import annotations

import functools
import inspect
import weakref
from typing import Protocol

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class KV(Protocol):
    """One model's cache for one row."""

    cache: object  # the transformers cache the model's forwards write
    length: int  # positions held

    def run(self, ids: list[int], keep: int) -> torch.Tensor:
        """Feed `ids` after the positions held; the logits of the last `keep` of them, (keep, V)."""

    def crop(self, length: int) -> None:
        """Keep the first `length` positions (no-op when it holds fewer)."""


class DynamicKV:
    """A `DynamicCache` of `model` behind the `KV` interface (an existing cache may be given: a kept prefix)."""

    def __init__(self, model, cache: DynamicCache | None = None):
        self._model = weakref.ref(model)  # a kept cache outlives no model
        self.cache = new_cache() if cache is None else cache

    @property
    def length(self) -> int:
        return self.cache.get_seq_length()

    def run(self, ids: list[int], keep: int) -> torch.Tensor:
        return forward(self._model(), self.cache, ids, keep)

    def crop(self, length: int) -> None:
        crop_to(self.cache, length)


def new_cache() -> DynamicCache:
    """An empty cache; layers (`GrowingLayer`) are created on the first forward."""
    cache = DynamicCache()
    cache.layer_class_to_replicate = GrowingLayer
    return cache


class GrowingLayer(DynamicLayer):
    """A `DynamicLayer` whose keys and values are the first L positions of larger buffers (B, H, capacity, D): a
    forward writes its n new positions into the room after them, and the buffers double when full, so a step copies
    n positions instead of the L + n that `torch.cat` copies (a long context's cache is no longer read and written
    at every step). The keys and values it holds and returns are bitwise the concatenation's; `crop` leaves shorter
    views of the same buffers. Keys or values set from outside are copied into new buffers at the next update."""

    _rooms: tuple[torch.Tensor, torch.Tensor] | None = None  # the buffers, (B, H, capacity, D) each
    _held: tuple[torch.Tensor, torch.Tensor] | None = None  # the views this layer last set as keys and values
    _inference = False  # the buffers are inference tensors (written to only in inference mode)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        length, n = self.get_seq_length(), key_states.shape[-2]
        if not (self._own() and length + n <= self._rooms[0].shape[-2]
                and (not self._inference or torch.is_inference_mode_enabled())):
            self._rooms = (_room(self.keys, key_states, length), _room(self.values, value_states, length))
            self._inference = torch.is_inference_mode_enabled()
        keys, values = self._rooms
        keys[..., length : length + n, :] = key_states
        values[..., length : length + n, :] = value_states
        self.keys, self.values = self._held = (keys[..., : length + n, :], values[..., : length + n, :])
        return self.keys, self.values

    def crop(self, tokens_to_remove: int) -> None:
        own = self._own()
        super().crop(tokens_to_remove)
        self._held = (self.keys, self.values) if own else None

    def _own(self) -> bool:
        """Whether the keys and values held are the views this layer set (nothing replaced them since)."""
        return self._held is not None and self.keys is self._held[0] and self.values is self._held[1]


def _room(held: torch.Tensor, new: torch.Tensor, length: int) -> torch.Tensor:
    """A buffer (B, H, 2 (length + n), D) whose first `length` positions are `held`'s."""
    room = new.new_empty((*new.shape[:2], 2 * (length + new.shape[-2]), new.shape[-1]))
    if length:
        room[..., :length, :] = held
    return room


def input_device(model: torch.nn.Module) -> torch.device:
    """Where the model's input ids must live (the embedding's device, also under device_map)."""
    device = model.get_input_embeddings().weight.device
    return model.device if device.type == "meta" else device  # offloaded: accelerate's execution device


def output_device(model: torch.nn.Module) -> torch.device:
    """Where the model's logits come out (the head's device, also under device_map)."""
    weight = _head_weight(model)
    return weight.device if weight is not None and weight.device.type != "meta" else input_device(model)


def logits_size(model: torch.nn.Module) -> int:
    """Length of the model's next-token logits (can exceed the tokenizer's length)."""
    weight = _head_weight(model)
    if weight is not None:
        return int(weight.shape[0])
    out_features = getattr(model.get_output_embeddings(), "out_features", None)  # e.g. an int8 (packed) head
    if isinstance(out_features, int):
        return out_features
    return int(model.config.get_text_config().vocab_size)


def forward(model, cache: DynamicCache, ids: list[int], keep: int) -> torch.Tensor:
    """Run `ids` (not yet in `cache`) through `model`; logits of the last `keep` positions, (keep, V).

    A model may carry a `one_row_forward(model, cache, ids, keep)` attribute (a fused 4-bit model does:
    `assisted.models.fused_layers.one_row_forward`) that computes the same logits in fewer calls, or returns None
    where it does not apply."""
    fast = getattr(model, "one_row_forward", None)
    logits = None if fast is None else fast(model, cache, ids, keep)
    if logits is not None:
        return logits
    x = torch.tensor([ids], dtype=torch.long, device=input_device(model))  # (1, m)
    out = model(input_ids=x, use_cache=True, logits_to_keep=keep, **{cache_argument(type(model)): cache})
    return out.logits[0, -keep:]


@functools.cache
def cache_argument(model_class: type) -> str:
    """The name of the forward's cache argument: `cache` from transformers 5.24, `past_key_values` before."""
    return "cache" if "cache" in inspect.signature(model_class.forward).parameters else "past_key_values"


def crop_to(cache: DynamicCache, length: int) -> None:
    """Drop every cached position at or after `length` (no-op when the cache is not longer)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


def _head_weight(model: torch.nn.Module) -> torch.Tensor | None:
    """The output head's weight tensor, if it has one (quantized heads keep theirs packed)."""
    weight = getattr(model.get_output_embeddings(), "weight", None)
    return weight if isinstance(weight, torch.Tensor) else None

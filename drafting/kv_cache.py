"""KV caches in one place: a forward over the tokens a cache has not seen, and the crop after commit.

Both the target and the assistant keep one cache for the whole generation: a `DynamicCache`, or a
`drafting.static_cache.StaticKV` (pre-allocated, its forwards possibly replayed from CUDA graphs), which runs
its own forwards. After each step it is cropped back to the committed length (transformers 5.x:
`DynamicCache.crop(-n)` removes n positions; a static cache moves its length); it is never rebuilt. The
caller tracks how many committed tokens each cache holds.
"""

from __future__ import annotations

import functools
import inspect

import torch
from transformers import DynamicCache


def new_cache() -> DynamicCache:
    """An empty cache; layers are created on the first forward."""
    return DynamicCache()


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


def forward(model, cache, ids: list[int], keep: int) -> torch.Tensor:
    """Run `ids` (not yet in `cache`) through `model`; logits of the last `keep` positions, (keep, V)."""
    if not isinstance(cache, DynamicCache):  # a StaticKV runs its own (possibly captured) forwards
        return cache.run(ids, keep)
    x = torch.tensor([ids], dtype=torch.long, device=input_device(model))  # (1, m)
    out = model(input_ids=x, use_cache=True, logits_to_keep=keep, **{cache_argument(type(model)): cache})
    return out.logits[0, -keep:]


@functools.cache
def cache_argument(model_class: type) -> str:
    """The name of the forward's cache argument: `cache` from transformers 5.24, `past_key_values` before."""
    return "cache" if "cache" in inspect.signature(model_class.forward).parameters else "past_key_values"


def crop_to(cache, length: int) -> None:
    """Drop every cached position at or after `length` (no-op when the cache is not longer)."""
    if not isinstance(cache, DynamicCache):
        return cache.crop(length)
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


def _head_weight(model: torch.nn.Module) -> torch.Tensor | None:
    """The output head's weight tensor, if it has one (quantized heads keep theirs packed)."""
    weight = getattr(model.get_output_embeddings(), "weight", None)
    return weight if isinstance(weight, torch.Tensor) else None

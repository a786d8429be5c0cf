"""The benchmark harness's model loading: the library's loader (`assisted.models.loading`, `assisted.models.sources`)
re-exported under the names the experiments and tests use, plus drafters made for experiments
(a truncated copy, a random model of the same vocabulary). Sources are prepared by `structspec prepare NAME ...`.
"""

from __future__ import annotations

import os

import torch

from assisted.models.loading import load_model, load_tokenizer
from assisted.models.sources import SOURCES, NotPreparedError, installed_gguf  # noqa: F401  (re-exported)


def load(source: str | os.PathLike, *, dtype: str | torch.dtype = "float32",
         device: str | torch.device = "cpu", device_map: str | dict | None = None):
    """(model, tokenizer) of `source`; see `assisted.models.loading.load_model`. The tokenizer loads first (clear
    errors)."""
    tokenizer = load_tokenizer(source)
    return load_model(source, dtype=dtype, device=device, device_map=device_map), tokenizer


def truncated(model, layers: int):
    """A copy of `model` keeping only its first `layers` decoder layers (an untrained, weak drafter)."""
    import copy
    small = copy.deepcopy(model)
    small.model.layers = small.model.layers[:layers]
    small.config.num_hidden_layers = layers
    if getattr(small.config, "layer_types", None):
        small.config.layer_types = small.config.layer_types[:layers]
    return small.eval()


def random_like(model, *, seed: int = 0, layers: int = 2, hidden: int = 128):
    """A tiny randomly initialized model with `model`'s architecture and vocabulary: a deliberately bad assistant.

    Its drafts are almost never accepted, so it shows what speculation costs when it cannot pay.
    """
    from transformers import AutoModelForCausalLM
    config = model.config.__class__.from_dict(model.config.to_dict())
    heads = max(1, hidden // 64)
    for name, value in (("num_hidden_layers", layers), ("hidden_size", hidden), ("intermediate_size", 2 * hidden),
                        ("num_attention_heads", heads), ("num_key_value_heads", heads), ("head_dim", hidden // heads)):
        if hasattr(config, name):
            setattr(config, name, value)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config).to(model.dtype).to(model.device).eval()


"""One row's forward through a fused model in a few calls a layer: `drafting.kv_cache.forward`'s fast path.

transformers' model forward wraps the layers in plumbing that a one-row decode step on a CPU pays for at every step:
decorators, a causal mask built and checked, output records, a module call and the attention interface's wrapper per
layer (about 5 ms of a 0.5B assistant's 17 ms step). For a model whose decoder layers are all `FusedDecoderLayer`s and
whose attention is the row-invariant op (which takes no mask: causal over the last n keys), `one_row_forward` runs the
same modules and ops directly: the embedding, the model's rotary embedding at the cache's next positions, each layer's
`run` with `DynamicCache.update`, the final norm and the head on the last `keep` positions. The same calls on the same
values: its logits are bitwise the model's (tested). `fuse_layers` attaches it as the model's `one_row_forward`
attribute; any other model, cache or attention gets None (the caller runs the model as usual).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from structspec_ops.attention import ATTENTION


def one_row_forward(model: torch.nn.Module, cache, ids: list[int], keep: int) -> torch.Tensor | None:
    """Logits (keep, V) of the last `keep` of `ids` (one row, not yet in `cache`, appended to it), or None where this
    path does not apply: a cache other than a `DynamicCache`, another attention, a layer not fused."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from assisted.models.fused_layers import FusedDecoderLayer

    inner = model.model
    if type(cache) is not DynamicCache or model.config._attn_implementation != ATTENTION or \
            any(getattr(layer, "is_sliding", False) for layer in cache.layers):
        return None
    layers = inner.layers[: model.config.num_hidden_layers]
    if not all(isinstance(layer, FusedDecoderLayer) for layer in layers):
        return None
    past = cache.get_seq_length()
    x = inner.embed_tokens(torch.tensor([ids], device=model.device))  # (1, n, hidden)
    positions = torch.arange(past, past + len(ids), device=x.device)[None]  # (1, n)
    cos, sin = (t.reshape(len(ids), -1).float().contiguous() for t in inner.rotary_emb(x, positions))  # (n, D)
    x = x[0].float().contiguous()  # (n, hidden)
    attention = ALL_ATTENTION_FUNCTIONS[ATTENTION]
    for layer in layers:
        x = layer.run(x, 1, cos, sin, lambda k, v, i=layer.layer_idx: cache.update(k, v, i), attention)
    return model.lm_head(inner.norm(x[None, -keep:]))[0]

"""Decoder layers as two C++ calls around the attention (`structspec_ops.decoder`), for 4-bit targets and assistants.

A decode step of a small model on a CPU is mostly not its weights: some 200 op calls a layer (module calls, RMSNorm,
rotary, SiLU, residual adds, views, the dispatcher) cost as much as the matmuls. `fuse_layers` replaces every Llama or
Qwen2 decoder layer whose Linears all run the project's 4-bit or 6-bit kernels (`Int4Linear`, `Q6KLinear`) by a
`FusedDecoderLayer`: one call for RMSNorm, q/k/v and rotary, transformers' cache update and the model's attention
(row-invariant), one call for o, the residuals, RMSNorm and the MLP. Row by row in a fixed order, so the model stays
row-invariant (one forward over n positions is bitwise n steps; a row in a batch bitwise the row alone). It is the
model as loaded: its logits differ from the unfused model's by float rounding (norm and SiLU are summed in another
order), as any other kernel choice would. Other layers run as they are; `fused_layer_count` says how many fused.

Where every layer is fused, two paths skip transformers' model forward and run the same modules and ops directly:
`one_row_forward` (one row's step) and `ragged_forward` (B rows' feeds packed end to end, no padding).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator

import torch
from transformers import DynamicCache

from assisted.models.huge_pages import into_huge_pages
from assisted.models.int4_linear import Int4Linear
from assisted.models.packed_linear import PackedLinear
from assisted.models.q6k_linear import Q6KLinear
from drafting.batch_kv import RaggedBatch
from drafting.kv_cache import GrowingLayer
from structspec_ops import attention, decoder
from structspec_ops.attention import ATTENTION

FAMILIES = ("LlamaDecoderLayer", "Qwen2DecoderLayer")  # RMSNorm, q/k/v (+ bias), rotary, o, gate/up/down SiLU MLP
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]  # q (N, H, D), k, v (N, H_kv, D) -> (N, HD)


def _weight(linear: torch.nn.Module) -> decoder.Weight:
    groups = linear.groups_per_block if isinstance(linear, Int4Linear) else decoder.Q6_K
    return decoder.Weight(linear.packed, linear.bias, linear.out_features, groups)


def _merged(*inputs: list[torch.nn.Module]) -> decoder.Weights:
    """The layer op's weights of `inputs` (lists of Linears that read one input), adjacent 4-bit ones merged
    (`decoder.merged`); each module then holds its packed bytes as a view into the merged tensor, so the model keeps
    one copy of them."""
    weights, views = decoder.merged(*([_weight(m) for m in linears] for linears in inputs))
    for linear, view in zip((m for linears in inputs for m in linears), views):
        linear.packed = view
    return decoder.Weights.of(*weights)


def fusable(layer: torch.nn.Module) -> bool:
    """Whether `layer` is a decoder layer of a known family whose seven Linears run the 4-bit or 6-bit kernels."""
    if type(layer).__name__ not in FAMILIES:
        return False
    attn, mlp = layer.self_attn, layer.mlp
    linears = (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)
    return (all(isinstance(m, (Int4Linear, Q6KLinear)) for m in linears) and attn.o_proj.bias is None
            and getattr(mlp.config, "hidden_act", "silu") == "silu" and getattr(attn, "sliding_window", None) is None)


class RotaryRows:
    """The model's rotary cos and sin as the layer ops take them, (B n, D) float32 rows, made once per forward: the
    model hands each of its layers the same `position_embeddings`, so the first fused layer makes the rows and the
    others reuse them; the last one lets them go, so the next forward makes its own."""

    def __init__(self):
        self._made: tuple = ()  # (cos, sin, batch, n, rows): holding cos and sin keeps their ids unique

    def rows(self, position_embeddings: tuple[torch.Tensor, torch.Tensor], batch: int, n: int, last: bool):
        cos, sin = position_embeddings  # (B or 1, n, D)
        if not (self._made and self._made[0] is cos and self._made[1] is sin and self._made[2:4] == (batch, n)):
            made = tuple(t.float().expand(batch, n, t.shape[-1]).reshape(batch * n, -1).contiguous()
                         for t in (cos, sin))
            self._made = (cos, sin, batch, n, made)
        made = self._made[4]
        if last:
            self._made = ()
        return made


class FusedDecoderLayer(torch.nn.Module):
    """A Llama / Qwen2 decoder layer in two C++ calls around its cache update and attention; same submodules (and
    state dict) as the layer it replaces."""

    def __init__(self, layer: torch.nn.Module, rotary: RotaryRows):
        super().__init__()
        self.self_attn, self.mlp = layer.self_attn, layer.mlp
        self.input_layernorm, self.post_attention_layernorm = layer.input_layernorm, layer.post_attention_layernorm
        attn, mlp, config = layer.self_attn, layer.mlp, layer.self_attn.config
        self.attention_type = getattr(layer, "attention_type", "full_attention")
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim, self.layer_idx, self.scaling = attn.head_dim, attn.layer_idx, attn.scaling
        self.ins = _merged([attn.q_proj, attn.k_proj, attn.v_proj])  # q|k|v, or q|k and v where v is Q6_K
        self.outs = _merged([attn.o_proj], [mlp.gate_proj, mlp.up_proj], [mlp.down_proj])  # o, gate|up, down
        self.norms = tuple((norm.weight, norm.variance_epsilon)  # the Parameters themselves: a loaded state dict
                           for norm in (layer.input_layernorm, layer.post_attention_layernorm))  # reaches them
        self.rotary, self.last = rotary, False  # `fuse_layers` marks the model's last fused layer
        self.cache_keyword = _cache_keyword(type(layer))
        self.__dict__["_replaced"] = layer  # not a submodule: it shares this one's submodules and state dict

    def unfused(self) -> torch.nn.Module:
        """The layer this one replaced (the same submodules, run op by op), for comparisons."""
        return self._replaced

    def forward(self, hidden_states: torch.Tensor, attention_mask=None, position_embeddings=None, **kwargs):
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        cache = kwargs.pop(self.cache_keyword, None)
        batch, n, hidden = hidden_states.shape
        x = hidden_states.reshape(-1, hidden).float().contiguous()  # (B n, hidden)
        cos, sin = self.rotary.rows(position_embeddings, batch, n, self.last)  # (B n, D) each
        update = None if cache is None else lambda k, v: self._update(cache, k, v, position_embeddings, kwargs)
        attention = ALL_ATTENTION_FUNCTIONS[self.self_attn.config._attn_implementation]
        y = self.run(x, cos, sin, self.over_rows(batch, update, attention, attention_mask, kwargs))  # (B n, hidden)
        return y.view(batch, n, hidden).to(hidden_states.dtype)

    def run(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Attend, keep: int | None = None
            ) -> torch.Tensor:
        """The layer on x (N, hidden) float32 with rotary rows cos, sin (N, D): `attend(q, k, v)` takes this forward's
        rotated queries (N or keep, H, D), keys and values (N, H_kv, D) and returns the attention's output (N or keep,
        H D) (`over_rows`, `over_ragged`). Returns the layer's output (N, hidden), or only its last `keep` rows: the
        other rows' keys and values are cached all the same (a model's last layer, where only the kept rows' logits
        are read)."""
        (first, first_eps), (second, second_eps) = self.norms
        heads, kv_heads, dim = self.heads, self.kv_heads, self.head_dim
        q, k, v = decoder.attention_in(x, first, first_eps, self.ins, cos, sin, heads, kv_heads, dim)
        if keep is not None:
            q, x = q[-keep:], x[-keep:]
        a = attend(q.view(-1, heads, dim), k.view(-1, kv_heads, dim), v.view(-1, kv_heads, dim))
        return decoder.attention_out(a, x, second, second_eps, self.outs)

    def over_rows(self, batch: int, update, attention, attention_mask=None, kwargs=None) -> Attend:
        """`run`'s attention over B rows of n positions each (x holds them row after row): `update(k, v)` appends this
        forward's keys and values (B, H_kv, n, D) to the cache and returns all of them (None: no cache), `attention` is
        a transformers attention function, `attention_mask` its mask."""
        def attend(q, k, v):  # q: the last m of each row's n positions (m = n but in a one-row forward's last layer)
            m, n = q.shape[0] // batch, k.shape[0] // batch
            q = q.view(batch, m, self.heads, self.head_dim).transpose(1, 2)  # (B, H, m, D)
            k, v = (t.view(batch, n, self.kv_heads, self.head_dim).transpose(1, 2) for t in (k, v))  # (B, H_kv, n, D)
            if update is not None:
                k, v = update(k, v)
            return self._attention(attention, q, k, v, attention_mask, kwargs).reshape(batch * m, -1).contiguous()
        return attend

    def over_growing(self, held: GrowingLayer) -> Attend:
        """`run`'s attention for one row whose cache layer is `held` (`one_row_forward`'s): this forward's keys and
        values go into the layer's room, and the queries attend by the row-invariant op called directly (causal over
        the last keys: the shapes are this layer's own, so transformers' cache and attention wrappers are skipped)."""
        def attend(q, k, v):  # q (m, H, D); k and v (n, H_kv, D)
            keys, values = held.update(k.transpose(0, 1)[None], v.transpose(0, 1)[None])  # (1, H_kv, L + n, D) each
            return attention.causal(q.transpose(0, 1)[None], keys, values, self.scaling).view(q.shape[0], -1)
        return attend

    def over_ragged(self, batch: RaggedBatch, attention) -> Attend:
        """`run`'s attention over the rows of `batch` packed end to end: the keys and values go straight into the
        batch's cache, each row's queries (set out as a padded (B, H, m, D)) attend to their own row's keys."""
        def attend(q, k, v):
            keys, values = batch.store(self.layer_idx, k, v)  # (B, H_kv, P, D) each
            return batch.packed(self._attention(attention, batch.queries(q), keys, values, batch.mask))  # (N, H D)
        return attend

    def _attention(self, attention, q, k, v, mask, kwargs=None) -> torch.Tensor:
        """q (B, H, n, D), k and v (B, H_kv, L, D) -> (B, n, H, D)."""
        return attention(self.self_attn, q, k, v, mask, dropout=0.0, scaling=self.scaling, **(kwargs or {}))[0]

    def _update(self, cache, k, v, position_embeddings, kwargs):
        if self.cache_keyword == "cache":  # transformers 5.24+: the cache finds its own positions
            return cache.update(k, v, self.layer_idx, kwargs=kwargs)
        cos, sin = position_embeddings
        return cache.update(k, v, self.layer_idx, {"sin": sin, "cos": cos,
                                                   "cache_position": kwargs.get("cache_position")})


@functools.cache
def _cache_keyword(layer_class: type) -> str:
    """The decoder layer's cache argument: `cache` from transformers 5.24, `past_key_values` before."""
    return "cache" if "cache" in inspect.signature(layer_class.forward).parameters else "past_key_values"


def one_row_forward(model: torch.nn.Module, cache, ids: list[int], keep: int) -> torch.Tensor | None:
    """Logits (keep, V) of the last `keep` of `ids` (one row, not yet in `cache`, appended to it), or None where this
    path does not apply: a cache other than a `DynamicCache`, another attention, a layer not fused.

    `drafting.kv_cache.forward`'s fast path. transformers' model forward wraps the layers in plumbing that a one-row
    step on a CPU pays at every step: decorators, a causal mask built and checked, output records, a module call and
    the attention interface's wrapper per layer. For a model whose decoder layers are all fused and whose attention
    is the row-invariant op (no mask: causal over the last n keys), this runs the same modules and ops directly: the
    embedding, the rotary embedding at the cache's next positions, each layer's `run` (over a `GrowingLayer` its keys
    and values written straight into the layer's room and the op called directly, `FusedDecoderLayer.over_growing`;
    else through `DynamicCache.update` and transformers' attention interface), the final norm and the head on the
    last `keep` positions; its logits are bitwise the model's (tested). `fuse_layers` attaches it as the model's
    `one_row_forward` attribute.
    """
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    layers = _fused_layers(model)
    if type(cache) is not DynamicCache or layers is None or any(getattr(layer, "is_sliding", False)
                                                                for layer in cache.layers):
        return None
    past = cache.get_seq_length()
    positions = torch.arange(past, past + len(ids), device=model.device)  # (n,)
    interface = ALL_ATTENTION_FUNCTIONS[ATTENTION]  # transformers' wrapper of the op, for caches of other layers
    direct = attention.built().ok and len(cache.layers) == len(layers)  # the op and every layer's cache there

    def attend(layer: FusedDecoderLayer) -> Attend:  # one row, appended to `cache`
        held = cache.layers[layer.layer_idx] if direct else None
        if isinstance(held, GrowingLayer) and held.is_initialized:
            return layer.over_growing(held)
        return layer.over_rows(1, lambda k, v: cache.update(k, v, layer.layer_idx), interface)

    x = _through_layers(model, layers, torch.tensor(ids, device=model.device), positions, attend, keep)  # (keep, H)
    return _head(model, x)


def ragged_forward(model: torch.nn.Module, batch: RaggedBatch) -> torch.Tensor:
    """Logits (K, V) at the positions `batch.kept`: every row's feed of `batch` run packed end to end.

    `drafting.batch_kv.BatchKV.run`'s fast path, for a model whose decoder layers are all fused and whose attention is
    the row-invariant op. The N positions of all rows are one (N, hidden) matrix through the layers, no padding: the
    embedding of the flat ids, the rotary embedding at each position's own position id, each layer's `run` (its
    linears and norms row by row, so a position's row is what it is alone) with `FusedDecoderLayer.over_ragged` (keys
    and values written straight into the batch's cache columns; each row's queries attend to its own keys, in
    ascending order, by the row-invariant op), then the final norm and the head on the K kept positions only. Each row's
    logits are bitwise that row's alone, and the padded forward's (tested). `fuse_layers` attaches it as the model's
    `ragged_forward` attribute.

    Raises
    ------
    ValueError
        Where a decoder layer is not fused or the attention is another (`BatchKV` asks only a model whose attention is
        the row-invariant op, and `fuse_layers` attaches this only where every layer is fused).
    """
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    layers = _fused_layers(model)
    if layers is None:
        fused, total = fused_layer_count(model)
        raise ValueError(f"ragged_forward needs every decoder layer fused and the {ATTENTION!r} attention; this model "
                         f"has {fused} of {total} fused and {model.config._attn_implementation!r}")
    attention = ALL_ATTENTION_FUNCTIONS[ATTENTION]
    x = _through_layers(model, layers, batch.ids, batch.positions, lambda layer: layer.over_ragged(batch, attention))
    return _head(model, x[batch.kept])  # (K, V)


def _fused_layers(model: torch.nn.Module) -> list[FusedDecoderLayer] | None:
    """The model's decoder layers where all are fused and its attention is the row-invariant op, else None."""
    layers = model.model.layers[: model.config.num_hidden_layers]
    fused = model.config._attn_implementation == ATTENTION and all(isinstance(m, FusedDecoderLayer) for m in layers)
    return list(layers) if fused else None


def _through_layers(model: torch.nn.Module, layers: list[FusedDecoderLayer], ids: torch.Tensor,
                    positions: torch.Tensor, attend: Callable[[FusedDecoderLayer], Attend], keep: int | None = None
                    ) -> torch.Tensor:
    """The hidden states (N, hidden) float32 after `layers` of the tokens `ids` (N,) at `positions` (N,): the
    embedding, the rotary embedding at each token's own position, each layer's `run` with `attend(layer)`; with
    `keep`, the last layer computes past its attention's keys and values only the last `keep` rows (keep, hidden)."""
    inner = model.model
    x = inner.embed_tokens(ids[None])  # (1, N, hidden)
    cos, sin = (t.reshape(len(ids), -1).float().contiguous() for t in inner.rotary_emb(x, positions[None]))  # (N, D)
    x = x[0].float().contiguous()  # (N, hidden)
    for i, layer in enumerate(layers):
        x = layer.run(x, cos, sin, attend(layer), keep if i == len(layers) - 1 else None)
    return x


def _head(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The final norm and the head on the hidden states x (K, hidden): logits (K, V)."""
    return model.lm_head(model.model.norm(x[None]))[0]


def fuse_layers(model: torch.nn.Module) -> torch.nn.Module:
    """Replace, in place, every decoder layer of `model` that `fusable` accepts by a `FusedDecoderLayer`. Where all
    are, the model also gets the row-invariant attention, `one_row_forward` (its `drafting.kv_cache.forward` fast path)
    and `ragged_forward` (`drafting.batch_kv.BatchKV.run`'s). Last, the packed weights move into huge pages
    (`assisted.models.huge_pages`)."""
    rotary, fused = RotaryRows(), []  # one RotaryRows for the model's layers
    for _, parent in list(model.named_modules()):
        for name, child in list(parent.named_children()):
            if fusable(child):
                fused.append(FusedDecoderLayer(child, rotary))
                setattr(parent, name, fused[-1])
    if fused:
        max(fused, key=lambda layer: layer.layer_idx).last = True
    if fused and fused_layer_count(model) == (len(fused), len(fused)) and hasattr(model, "lm_head"):
        model.set_attn_implementation(ATTENTION)  # a target's already; an assistant's copy's from sdpa
        attention.built()  # built once per machine now, not inside a timed forward
        model.one_row_forward = one_row_forward  # a function, not a bound method: a deep copy calls it on itself
        model.ragged_forward = ragged_forward  # `drafting.batch_kv.BatchKV.run`'s fast path, the same way
    into_huge_pages(packed_places(model))  # the packed weights, merged ones included, in one buffer of huge pages
    return model


def packed_places(model: torch.nn.Module) -> Iterator[tuple[torch.Tensor, Callable[[torch.Tensor], None]]]:
    """Every packed weight the kernels read, and how to put another tensor in its place: each `PackedLinear`'s
    buffer and each fused layer's (merged) weights."""
    for module in model.modules():
        if isinstance(module, PackedLinear):
            yield module.packed, lambda t, m=module: m._buffers.__setitem__("packed", t)
        if isinstance(module, FusedDecoderLayer):
            for weights in (module.ins, module.outs):
                for i, t in enumerate(weights.packed):
                    yield t, lambda new, held=weights.packed, i=i: held.__setitem__(i, new)


def fused_layer_count(model: torch.nn.Module) -> tuple[int, int]:
    """(fused decoder layers, all decoder layers) of `model`."""
    fused = sum(isinstance(m, FusedDecoderLayer) for m in model.modules())
    other = sum(type(m).__name__.endswith(("DecoderLayer", "Block")) and not isinstance(m, FusedDecoderLayer)
                for m in model.modules())
    return fused, fused + other

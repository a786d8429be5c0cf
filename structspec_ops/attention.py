"""Row-invariant attention: each query row computed against its own keys, whatever else the forward carries.

Verification is lossless only if a forward over n positions gives each position bitwise the logits a one-position
step gives it (docs/design.md, "Row invariance"). With quantized activations a rounding difference in attention can
flip a quantization step later on, so attention must be row-invariant too. `row_invariant_attention`, registered in
transformers' `AttentionInterface` as ``"row_invariant"``, computes every (batch row, head, query row) in one C++
call (``torch.ops.structspec.row_invariant_attention``, `structspec_ops/csrc/attention.cpp`) in one fixed reduction
order that depends on nothing but that row's query and attended keys; the one-position step runs the same op. Where the
op cannot build, the same contract is kept by a Python loop of one `scaled_dot_product_attention` call per query row
(`implementation()` says which one runs, and why).

    model.set_attn_implementation(ATTENTION)  # after `import structspec_ops.attention`
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from structspec_ops.build import Built, load

ATTENTION = "row_invariant"  # the C++ op (or the loop where it cannot build)
LOOP_ATTENTION = "row_invariant_loop"  # always the Python loop: the reference the op is measured against
MASKED_ATTENTIONS = ("sdpa", "eager", ATTENTION, LOOP_ATTENTION)  # attentions that apply a custom 4D mask as given
_UNSUPPORTED = ("softcap", "s_aux", "position_bias")  # keyword arguments that would change the math: refused


@functools.cache
def built() -> Built:
    """The C++ attention library, built once per machine on first use (`structspec_ops.build.load`)."""
    return load("attention", ("attention.cpp",), ("-ffp-contract=off", "-fopenmp"))


def implementation() -> str:
    """Which implementation ``"row_invariant"`` runs here: ``"op"``, or ``"loop: <why the op did not build>"``."""
    return "op" if built().ok else f"loop: {built().reason}"


def row_invariant_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Attention with each query row computed alone, in one call for every row.

    Parameters
    ----------
    module : torch.nn.Module
        The attention layer (unused; transformers' interface passes it).
    query : torch.Tensor
        (B, H, n, D) float32 on the CPU.
    key, value : torch.Tensor
        (B, H_kv, L, D) float32; H a multiple of H_kv (query heads grouped over key/value heads, GQA).
    attention_mask : torch.Tensor or None
        (B or 1, 1, n, L): bool (True attends) or additive float (0 attends; -inf or the dtype's min hides). None:
        causal over the last n of the L keys.
    scaling : float, optional
        Score scale; 1 / sqrt(D) when None.

    Returns
    -------
    (torch.Tensor, None)
        (B, n, H, D) and no attention weights, as transformers' attentions return. Each (b, h, i) is bitwise the
        same whatever other rows, positions or threads the call has; a query row that attends to no key (a padded
        query) gives zeros, as torch's sdpa does.

    Raises
    ------
    ValueError
        On dropout, a keyword that changes the math (softcap, attention sinks, a position bias), a float mask with
        a bias other than 0 or -inf, or shapes and dtypes the op does not take.
    """
    mask = _checked(query, key, value, attention_mask, dropout, kwargs)
    if not built().ok:
        return _loop(query, key, value, mask, scaling), None
    scale = query.shape[-1] ** -0.5 if scaling is None else float(scaling)
    return torch.ops.structspec.row_invariant_attention(query, key, value, mask, scale), None


def causal(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float) -> torch.Tensor:
    """The op itself for a caller whose shapes are right by construction (`row_invariant_attention` without its
    checks): query (B, H, n, D) causal over the last n of key's and value's L positions (B, H_kv, L, D), float32 ->
    (B, n, H, D). Only where `built().ok`."""
    return torch.ops.structspec.row_invariant_attention(query, key, value, None, scale)


def loop_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """`row_invariant_attention`'s contract by a Python loop: one `scaled_dot_product_attention` call per (batch row,
    query row), the call a decode step makes, over that row's keys (the fallback, and the reference for the op)."""
    mask = _checked(query, key, value, attention_mask, dropout, kwargs)
    return _loop(query, key, value, mask, scaling), None


def _checked(query, key, value, attention_mask, dropout, kwargs) -> torch.Tensor | None:
    """The mask as bool (B or 1, n, L), after refusing what the op does not compute (one ValueError each)."""
    if dropout:
        raise ValueError("row_invariant attention has no dropout (it is an inference kernel)")
    refused = [name for name in _UNSUPPORTED if kwargs.get(name) is not None]
    if refused:
        raise ValueError(f"row_invariant attention does not apply {', '.join(refused)}")
    _check_shapes(query, key, value)
    return None if attention_mask is None else _bool_mask(attention_mask, query, key)


def _check_shapes(query, key, value) -> None:
    if query.dim() != 4 or key.dim() != 4 or key.shape != value.shape:
        raise ValueError(f"row_invariant attention needs query (B, H, n, D) and key, value (B, H_kv, L, D); got "
                         f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}")
    (batch, heads, _, dim), (kv_batch, kv_heads, _, kv_dim) = query.shape, key.shape
    if kv_batch != batch or kv_dim != dim or kv_heads == 0 or heads % kv_heads:
        raise ValueError(f"row_invariant attention: key/value {tuple(key.shape)} do not fit query "
                         f"{tuple(query.shape)} (same B and D, H a multiple of H_kv)")
    dtypes = {t.dtype for t in (query, key, value)}
    if dtypes != {torch.float32} or {t.device.type for t in (query, key, value)} != {"cpu"}:
        raise ValueError(f"row_invariant attention runs on float32 CPU tensors, not {sorted(map(str, dtypes))} on "
                         f"{sorted({str(t.device) for t in (query, key, value)})}")


def _bool_mask(mask: torch.Tensor, query, key) -> torch.Tensor:
    """(B or 1, 1, n, L) bool or additive float -> (B or 1, n, L) bool, True where a query attends."""
    batch, _, n, _ = query.shape
    if mask.dim() != 4 or mask.shape[0] not in (1, batch) or mask.shape[1] != 1 or mask.shape[2:] != (n, key.shape[2]):
        raise ValueError(f"row_invariant attention needs a mask (B or 1, 1, n, L) = (.., 1, {n}, {key.shape[2]}), "
                         f"got {tuple(mask.shape)}")
    if mask.dtype == torch.bool:
        return mask[:, 0]
    allowed = mask[:, 0] == 0
    if not (allowed | (mask[:, 0] <= torch.finfo(mask.dtype).min)).all():
        raise ValueError("row_invariant attention takes additive masks of 0 and -inf only (no attention bias)")
    return allowed


def _loop(query, key, value, mask, scale) -> torch.Tensor:
    """(B, n, H, D): one `scaled_dot_product_attention` call per (batch row, query row) over its own keys."""
    batch, heads, n, dim = query.shape
    groups = heads // key.shape[1]
    keys = _attended_keys(mask, batch, n, key.shape[2])
    out = query.new_empty(batch, n, heads, dim)
    for b in range(batch):
        for i in range(n):
            k, v = _select(key[b], keys[b][i]), _select(value[b], keys[b][i])  # (H_kv, m, D)
            q = query[b, :, i].reshape(key.shape[1], groups, dim)  # (H_kv, groups, D): a decode step's GQA packing
            out[b, i] = F.scaled_dot_product_attention(q, k, v, scale=scale).reshape(heads, dim)
    return out


def _attended_keys(mask, batch: int, n: int, length: int) -> list[list]:
    """Per batch row and query row: an int m (keys 0..m-1) or a LongTensor of key indices (a mask with holes)."""
    if mask is None:
        return [[length - n + i + 1 for i in range(n)] for _ in range(batch)]
    allowed = mask.expand(batch, n, length)  # (B, n, L)
    counts = allowed.sum(-1)  # (B, n)
    prefix = allowed.int().cumprod(-1).sum(-1) == counts  # (B, n): the attended keys are a prefix
    return [[int(c) if p else allowed[b, i].nonzero().flatten() for i, (c, p) in enumerate(zip(cs, ps))]
            for b, (cs, ps) in enumerate(zip(counts.tolist(), prefix.tolist()))]


def _select(states: torch.Tensor, keys) -> torch.Tensor:
    """(H_kv, L, D) -> (H_kv, m, D): a prefix view, or the gathered rows of a mask with holes."""
    return states[:, :keys] if isinstance(keys, int) else states.index_select(1, keys)


def _never_skipped_mask(*args, **kwargs):
    """transformers' boolean sdpa mask, never skipped: a static cache's keys run past the valid ones, so the keys a
    query attends to are read from the mask, not from the key length."""
    kwargs["allow_is_causal_skip"] = False
    return sdpa_mask(*args, **kwargs)


for _name, _attention in ((ATTENTION, row_invariant_attention), (LOOP_ATTENTION, loop_attention)):
    AttentionInterface.register(_name, _attention)
    AttentionMaskInterface.register(_name, _never_skipped_mask)

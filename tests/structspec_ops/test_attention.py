"""structspec_ops.attention: every query row against its own keys in one call, bitwise the row alone.

Row invariance is tested with torch.equal, never a tolerance: a query row alone against the same row among 2..16
rows, a batch row with left padding and a hole against the row alone, one thread against two. The math (masks, GQA,
scaling) is checked against a float64 reference within a bound derived from float32 rounding
(`tests.helpers_rounding.attention_bound`: the op and the loop add in different orders, and torch picks its CPU
kernels by the CPU's features, so they are never compared with each other within a fixed tolerance), and stock sdpa
is the control that fails the bitwise test. The whole-model identities (n positions in one forward against n steps,
dynamic and static caches, Llama and GPT-2; a padded batch row) are in tests/assisted/test_int8.py, whose int8
models run this attention.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import structspec_ops.attention as attention
from structspec_ops.attention import (ATTENTION, LOOP_ATTENTION, MASKED_ATTENTIONS, implementation, loop_attention,
                               row_invariant_attention)
from structspec_ops.build import Built
from tests.helpers_models import threads
from tests.helpers_rounding import assert_within, attention_bound

IMPLEMENTATIONS = pytest.mark.parametrize("attend", [row_invariant_attention, loop_attention], ids=["op", "loop"])
needs_op = pytest.mark.skipif(implementation() != "op", reason=implementation())


def _qkv(batch=1, heads=4, kv_heads=2, n=5, length=9, dim=16, seed=0):
    """query (B, H, n, D), key and value (B, H_kv, L, D), with rows of very different scales."""
    torch.manual_seed(seed)
    scales = torch.logspace(-1, 1, n)[None, None, :, None]
    return (torch.randn(batch, heads, n, dim) * scales, torch.randn(batch, kv_heads, length, dim),
            torch.randn(batch, kv_heads, length, dim))


def _run(attend, query, key, value, mask=None, scaling=None):
    return attend(None, query, key, value, mask, scaling=scaling)[0]  # (B, n, H, D)


def _reference(query, key, value, allowed, scaling=None) -> torch.Tensor:
    """(B, n, H, D) in float64: softmax(scale * q k^T over the allowed keys) v, key/value heads repeated (GQA)."""
    groups = query.shape[1] // key.shape[1]
    k, v = (t.double().repeat_interleave(groups, 1) for t in (key, value))
    scores = query.double() @ k.transpose(-1, -2) * (scaling or query.shape[-1] ** -0.5)  # (B, H, n, L)
    weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1).nan_to_num(0.0)
    return (weights @ v).transpose(1, 2)


def _causal(n: int, length: int) -> torch.Tensor:
    return torch.ones(n, length, dtype=torch.bool).tril(length - n)  # (n, L): query i sees keys 0 .. L - n + i


# ------------------------------------------------------------------------------------------------ row invariance


@IMPLEMENTATIONS
@pytest.mark.parametrize("masked", [False, True], ids=["causal", "bool-mask"])
def test_a_query_row_alone_is_bitwise_the_row_among_others(attend, masked):
    """n rows after 20 cached keys, computed in one call, against each row alone over its own prefix (n = 2..16); a
    bool mask also hides 7 trailing keys (a static cache's unused slots, filled with garbage)."""
    for n in range(2, 17):
        length = 20 + n + (7 if masked else 0)
        query, key, value = _qkv(n=n, length=length, seed=n)
        key[:, :, 20 + n :] = 1e4  # slots no query attends to
        mask = torch.ones(n, length, dtype=torch.bool).tril(20)[None, None] if masked else None
        together = _run(attend, query, key, value, mask)
        for i in range(n):
            alone = _run(attend, query[:, :, i : i + 1], key[:, :, : 21 + i], value[:, :, : 21 + i])
            assert torch.equal(alone, together[:, i : i + 1]), f"n={n}, row {i}"


def test_stock_sdpa_is_not_row_invariant():
    """The control for the test above: torch's sdpa over the same n rows differs from the row alone."""
    differs = []
    for n in range(2, 17):
        query, key, value = _qkv(n=n, length=20 + n, seed=n)
        key, value = (t.repeat_interleave(2, 1) for t in (key, value))
        together = F.scaled_dot_product_attention(query, key, value, attn_mask=_causal(n, 20 + n))
        differs.append(any(not torch.equal(F.scaled_dot_product_attention(
            query[:, :, i : i + 1], key[:, :, : 21 + i], value[:, :, : 21 + i]), together[:, :, i : i + 1])
            for i in range(n)))
    assert any(differs)


@IMPLEMENTATIONS
@pytest.mark.parametrize("float_mask", [False, True], ids=["bool", "additive"])
def test_a_batch_row_with_left_padding_and_a_hole_is_bitwise_the_row_alone(attend, float_mask):
    """Row 0 of 3 has 5 padded slots on the left and 2 in the middle (a rejected draft's), filled with garbage; its
    valid queries equal the row computed alone on its 12 keys. Padded queries attend to nothing and give zeros."""
    query, key, value = _qkv(batch=3, n=19, length=19, dim=24, seed=3)
    valid = torch.tensor([False] * 5 + [True] * 7 + [False] * 2 + [True] * 5)  # (19,)
    key[0, :, ~valid], value[0, :, ~valid] = 1e4, -1e4
    allowed = torch.ones(3, 19, 19, dtype=torch.bool).tril()
    allowed[0] &= valid[None, :]
    mask = allowed[:, None]  # (3, 1, 19, 19)
    if float_mask:
        mask = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    out = _run(attend, query, key, value, mask)
    alone = _run(attend, query[:1, :, valid], key[:1, :, valid], value[:1, :, valid])
    assert torch.equal(out[:1, valid], alone)
    assert torch.equal(out[0, :5], torch.zeros_like(out[0, :5]))  # no key: zeros, as sdpa gives
    assert torch.equal(out[1:], _run(attend, query[1:], key[1:], value[1:]))  # the other rows: as if alone


@needs_op
@pytest.mark.parametrize("heads, kv_heads", [(12, 2), (14, 2), (9, 1), (3, 3)])  # groups of 6, 7, 9 and 1 heads
@pytest.mark.parametrize("dim", [8, 64, 72])
def test_a_query_head_is_bitwise_the_head_alone(heads, kv_heads, dim):
    """The op computes a group's query heads side by side (each key row read once for several); each head must still
    be what it is alone, with its key head, whichever run of heads it falls in."""
    query, key, value = _qkv(batch=2, heads=heads, kv_heads=kv_heads, n=4, length=9, dim=dim, seed=heads + dim)
    holes = _causal(4, 9)[None].expand(2, 4, 9) & (torch.rand(2, 4, 9) > 0.3)
    for mask in (None, holes):
        out = torch.ops.structspec.row_invariant_attention(query, key, value, mask, 0.3)  # (B, n, H, D)
        for h in range(heads):
            kv = slice(h // (heads // kv_heads), h // (heads // kv_heads) + 1)
            alone = torch.ops.structspec.row_invariant_attention(query[:, h : h + 1], key[:, kv], value[:, kv], mask,
                                                                 0.3)
            assert torch.equal(out[:, :, h : h + 1], alone), (h, mask is None)


@needs_op
def test_the_op_does_not_depend_on_the_number_of_threads():
    query, key, value = _qkv(batch=2, heads=8, kv_heads=2, n=33, length=40, dim=64, seed=4)
    with threads(1):
        one = _run(row_invariant_attention, query, key, value)
    with threads(2):
        two = _run(row_invariant_attention, query, key, value)
    assert torch.equal(one, two)


# ------------------------------------------------------------------------------------------------ the math


@IMPLEMENTATIONS
@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (8, 2), (6, 1)])
@pytest.mark.parametrize("dim", [8, 64, 72])  # below one 16-lane block, whole blocks, blocks and a tail
@pytest.mark.parametrize("scaling", [None, 0.3])
def test_the_attention_is_the_float64_softmax_within_rounding(attend, heads, kv_heads, dim, scaling):
    query, key, value = _qkv(batch=2, heads=heads, kv_heads=kv_heads, n=6, length=11, dim=dim, seed=dim)
    causal = _causal(6, 11)[None, None]
    holes = causal & (torch.rand(2, 1, 6, 11) > 0.3)
    holes[..., 0] = True  # every query sees at least one key
    for mask, allowed in ((None, causal), (causal, causal), (holes, holes)):
        out = _run(attend, query, key, value, mask, scaling)
        assert_within(out, _reference(query, key, value, allowed, scaling),
                      attention_bound(query, key, value, allowed, scaling), "attention")
    additive = torch.zeros(holes.shape).masked_fill(~holes, float("-inf"))
    assert torch.equal(_run(attend, query, key, value, additive, scaling), _run(attend, query, key, value, holes,
                                                                                 scaling))


@needs_op
def test_the_op_and_the_loop_are_each_float64_within_rounding():
    """Both compute the same attention in different orders (the op's fixed one, sdpa's by CPU): each is held to the
    float64 softmax within float32's rounding bound, not to the other within a fixed tolerance (which failed on a
    Xeon whose sdpa kernels add otherwise). The bound is tight enough to fail on a wrong mask (the control)."""
    query, key, value = _qkv(batch=2, heads=9, kv_heads=3, n=17, length=30, dim=64, seed=7)
    allowed = _causal(17, 30)[None, None]
    reference, bound = _reference(query, key, value, allowed), attention_bound(query, key, value, allowed)
    for name, attend in (("op", row_invariant_attention), ("loop", loop_attention)):
        assert_within(_run(attend, query, key, value), reference, bound, name)
    one_more = torch.ones(17, 30, dtype=torch.bool).tril(30 - 17 + 1)[None, None]  # and the next key: wrong
    with pytest.raises(AssertionError, match="beyond their rounding bound"):
        assert_within(_run(row_invariant_attention, query, key, value, one_more), reference, bound, "control")


def test_where_the_op_cannot_build_the_loop_runs_and_says_why(monkeypatch):
    monkeypatch.setattr(attention, "built", lambda: Built("attention", False, "no compiler here"))
    assert implementation() == "loop: no compiler here"
    query, key, value = _qkv(seed=8)
    assert torch.equal(_run(row_invariant_attention, query, key, value), _run(loop_attention, query, key, value))


def test_both_names_are_registered_as_attentions_that_take_a_4d_mask():
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    for name in (ATTENTION, LOOP_ATTENTION):
        assert name in MASKED_ATTENTIONS and name in AttentionInterface._global_mapping
        assert name in AttentionMaskInterface._global_mapping


# ------------------------------------------------------------------------------------------------ refusals


@IMPLEMENTATIONS
@pytest.mark.parametrize("change, message", [
    (lambda q, k, v, m: (q[0], k, v, m, {}), "query \\(B, H, n, D\\)"),
    (lambda q, k, v, m: (q, k[:1], v[:1], m, {}), "do not fit"),
    (lambda q, k, v, m: (q, k[:, :1].expand(-1, 3, -1, -1), v[:, :1].expand(-1, 3, -1, -1), m, {}), "do not fit"),
    (lambda q, k, v, m: (q, k, v[..., :8], m, {}), "key, value"),
    (lambda q, k, v, m: (q.double(), k.double(), v.double(), m, {}), "float32"),
    (lambda q, k, v, m: (q, k, v.bfloat16(), m, {}), "float32"),
    (lambda q, k, v, m: (q, k, v, m[..., :-1], {}), "mask"),
    (lambda q, k, v, m: (q, k, v, m.float() * 0.5, {}), "0 and -inf"),
    (lambda q, k, v, m: (q, k, v, m, {"dropout": 0.1}), "dropout"),
    (lambda q, k, v, m: (q, k, v, m, {"softcap": 30.0}), "softcap"),
], ids=["3d-query", "batch", "heads", "value-shape", "float64", "bfloat16", "mask-shape", "bias", "dropout", "softcap"])
def test_bad_inputs_are_refused_with_a_clear_error(attend, change, message):
    query, key, value = _qkv(batch=2, seed=9)
    query, key, value, mask, options = change(query, key, value, _causal(5, 9)[None, None].expand(2, 1, 5, 9))
    with pytest.raises(ValueError, match=message):
        attend(None, query, key, value, mask, **options)


@needs_op
def test_the_op_called_directly_checks_its_inputs():
    query, key, value = _qkv(seed=10)
    with pytest.raises(RuntimeError, match="float32"):
        torch.ops.structspec.row_invariant_attention(query.double(), key, value, None, 0.25)
    with pytest.raises(RuntimeError, match="L >= n"):
        torch.ops.structspec.row_invariant_attention(query, key[:, :, :3], value[:, :, :3], None, 0.25)
    with pytest.raises(RuntimeError, match="mask"):
        torch.ops.structspec.row_invariant_attention(query, key, value, torch.ones(1, 5, 8, dtype=torch.bool), 0.25)

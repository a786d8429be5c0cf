"""structspec_ops.decoder: a decoder layer's two calls against their pieces.

Inputs are chosen so that RMSNorm is exact in any summation order (every entry +-c, c a power of two): the op's
q, k, v are then bitwise the linears of the exact normalised row, rotated as transformers rotates (two products,
their sum); o plus the residual is bitwise the linear plus x. The MLP's SiLU(gate) * up goes through exp, so the
layer's output is held to a float64 evaluation within the down linear's int8 activation step plus float32 rounding.
Invariance: a row alone against the row among many, bitwise.
"""

from __future__ import annotations

import pytest
import torch

from structspec_ops import decoder, int4, q6k
from tests.helpers_models import threads
from tests.helpers_rounding import assert_within, gamma

pytestmark = pytest.mark.skipif(not int4.built().ok, reason=f"the kernels are unavailable: {int4.built().reason}")
HIDDEN, HEADS, KV_HEADS, DIM, INTER = 256, 4, 2, 64, 512


def _int4(out_features: int, in_features: int, seed: int, bias: bool = False) -> tuple[decoder.Weight, int4.Packed]:
    torch.manual_seed(seed)
    packed = int4.pack(int4.quantize(torch.randn(out_features, in_features) * 0.05, 8))
    b = torch.randn(out_features) * 0.1 if bias else None
    return decoder.Weight(packed.data, b, out_features, 8), packed


def _q6(out_features: int, in_features: int, seed: int) -> tuple[decoder.Weight, q6k.Packed]:
    torch.manual_seed(seed)
    packed = q6k.pack(q6k.quantize(torch.randn(out_features, in_features) * 0.05))
    return decoder.Weight(packed.data, None, out_features, decoder.Q6_K), packed


def _signs(n: int, width: int, seed: int, c: float = 0.5) -> torch.Tensor:
    """(n, width) entries +-c: a sum of squares exact in any order."""
    generator = torch.Generator().manual_seed(seed)
    return (torch.randint(0, 2, (n, width), generator=generator).float() * 2 - 1) * c


def _rotary(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    angles = torch.arange(n)[:, None] * (1e-2 * torch.arange(DIM // 2))[None]  # (n, D / 2)
    angles = torch.cat([angles, angles], -1)
    return angles.cos(), angles.sin()


def _rotated(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int) -> torch.Tensor:
    """transformers' apply_rotary_pos_emb on (n, heads * D): x * cos + rotate_half(x) * sin."""
    x = x.view(x.shape[0], heads, DIM)
    turned = torch.cat([-x[..., DIM // 2 :], x[..., : DIM // 2]], -1)
    return (x * cos[:, None] + turned * sin[:, None]).reshape(x.shape[0], -1)


def test_attention_in_is_norm_then_the_linears_then_rotary_bitwise():
    (wq, pq), (wk, pk), (wv, pv) = _int4(HEADS * DIM, HIDDEN, 1, True), _int4(KV_HEADS * DIM, HIDDEN, 2, True), \
        _q6(KV_HEADS * DIM, HIDDEN, 3)
    x, norm, (cos, sin) = _signs(5, HIDDEN, 4), torch.rand(HIDDEN) + 0.5, _rotary(5)
    q, k, v = decoder.attention_in(x, norm, 1e-6, decoder.Weights.of(wq, wk, wv), cos, sin, HEADS, KV_HEADS, DIM)
    h = norm * (x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6))  # exact: every x^2 is c^2
    assert torch.equal(q, _rotated(int4.linear(h, pq, wq.bias), cos, sin, HEADS))
    assert torch.equal(k, _rotated(int4.linear(h, pk, wk.bias), cos, sin, KV_HEADS))
    assert torch.equal(v, q6k.linear(h, pv))


def _out_weights(zero_down: bool = False):
    (wo, po), (wg, pg), (wu, pu), (wd, pd) = (_int4(HIDDEN, HEADS * DIM, 5), _int4(INTER, HIDDEN, 6),
                                              _int4(INTER, HIDDEN, 7), _q6(HIDDEN, INTER, 8))
    if zero_down:  # every scale 0: the MLP adds exact zeros
        groups = q6k.unpack(pd)
        pd = q6k.pack(q6k.Groups(groups.codes, torch.zeros_like(groups.sc), groups.d))
        wd = decoder.Weight(pd.data, None, HIDDEN, decoder.Q6_K)
    return decoder.Weights.of(wo, wg, wu, wd), (po, pg, pu, pd)


def test_attention_out_adds_o_to_the_residual_bitwise():
    weights, (po, *_) = _out_weights(zero_down=True)
    a, x = torch.randn(3, HEADS * DIM), torch.randn(3, HIDDEN)
    assert torch.equal(decoder.attention_out(a, x, torch.ones(HIDDEN), 1e-6, weights), int4.linear(a, po) + x)


def test_attention_out_s_mlp_is_its_math_within_the_activation_step():
    """a = 0 (o adds exact zeros) and x of +-c: the MLP's input norm is exact, gate and up bitwise the linears."""
    weights, (_, pg, pu, pd) = _out_weights()
    x, norm = _signs(3, HIDDEN, 9), torch.rand(HIDDEN) + 0.5
    y = decoder.attention_out(torch.zeros(3, HEADS * DIM), x, norm, 1e-6, weights)
    h = norm * (x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6))
    gate, up = (int4.linear(h, p).double() for p in (pg, pu))
    m = gate / (1 + torch.exp(-gate)) * up  # (n, inter) float64; the op's is within a few float32 ulps (exp)
    wd = q6k.unpack(pd).dequantize().double()
    reference = x.double() + m @ wd.T
    # the down linear rounds each row to int8 codes of its max-abs step: half a step per input, plus the op's
    # float32 m (8 ulps for exp, division and products) and the float32 sums
    step = m.abs().amax(1, keepdim=True) / 127
    bound = (0.5 * step + gamma(8) * (m.abs() + step)) @ wd.abs().T
    bound = bound + gamma(INTER + 4) * (m.abs() @ wd.abs().T + x.double().abs())
    assert_within(y, reference, bound, "attention_out's MLP against float64")


def test_the_activation_is_silu_within_a_few_ulps_and_the_same_in_every_lane():
    """The layer's SiLU(gate) * up against float64: exp within an ulp, then 1 + e, the division and the product,
    each rounded once (gamma(4)); below exp's clamp (gate < -87: silu under 1e-36) an absolute 1e-30. Each element
    is what it is alone (a row's tail is padded into a full vector, lanes never mix)."""
    generator = torch.Generator().manual_seed(3)
    gate = torch.cat([torch.linspace(-120, 100, 4001), torch.randn(999, generator=generator) * 8])[None]  # (1, 5000)
    up = torch.randn(gate.shape, generator=generator)
    got = decoder.silu_times(gate, up)
    g, u = gate.double(), up.double()
    reference = g * torch.sigmoid(g) * u
    assert_within(got, reference, gamma(4) * reference.abs() + 1e-30, "silu(gate) * up against float64")
    alone = torch.cat([decoder.silu_times(gate[:, j:j + 1], up[:, j:j + 1]) for j in range(0, 5000, 37)], 1)
    assert torch.equal(alone, got[:, ::37])
    assert torch.equal(decoder.silu_times(gate[:, :21], up[:, :21]), got[:, :21])  # a row of 16 + 5


def test_the_mlp_bound_fails_a_wrong_activation():
    """Control: gelu in place of SiLU is far outside the bound above."""
    weights, (_, pg, pu, pd) = _out_weights()
    x, norm = _signs(3, HIDDEN, 9), torch.rand(HIDDEN) + 0.5
    y = decoder.attention_out(torch.zeros(3, HEADS * DIM), x, norm, 1e-6, weights)
    h = norm * (x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6))
    gate, up = (int4.linear(h, p).double() for p in (pg, pu))
    m = torch.nn.functional.gelu(gate) * up
    wd = q6k.unpack(pd).dequantize().double()
    step = m.abs().amax(1, keepdim=True) / 127
    bound = (0.5 * step + gamma(8) * (m.abs() + step)) @ wd.abs().T + gamma(INTER + 4) * (m.abs() @ wd.abs().T)
    with pytest.raises(AssertionError):
        assert_within(y, x.double() + m @ wd.T, bound, "control")


def test_a_row_is_bitwise_the_same_among_other_rows():
    (wq, _), (wk, _), (wv, _) = _int4(HEADS * DIM, HIDDEN, 1, True), _int4(KV_HEADS * DIM, HIDDEN, 2, True), \
        _q6(KV_HEADS * DIM, HIDDEN, 3)
    weights, ins = _out_weights()[0], decoder.Weights.of(wq, wk, wv)
    torch.manual_seed(10)
    x, a, norm, (cos, sin) = torch.randn(11, HIDDEN), torch.randn(11, HEADS * DIM), torch.rand(HIDDEN), _rotary(11)
    with threads(2):
        together = decoder.attention_in(x, norm, 1e-6, ins, cos, sin, HEADS, KV_HEADS, DIM)
        out = decoder.attention_out(a, x, norm, 1e-6, weights)
        for i in (0, 5, 10):
            alone = decoder.attention_in(x[i : i + 1], norm, 1e-6, ins, cos[i : i + 1], sin[i : i + 1],
                                         HEADS, KV_HEADS, DIM)
            assert all(torch.equal(s, t[i : i + 1]) for s, t in zip(alone, together)), i
            assert torch.equal(decoder.attention_out(a[i : i + 1], x[i : i + 1], norm, 1e-6, weights), out[i : i + 1])


def test_shapes_that_do_not_fit_are_refused():
    (wq, _), (wk, _), (wv, _) = _int4(HEADS * DIM, HIDDEN, 1), _int4(KV_HEADS * DIM, HIDDEN, 2), \
        _int4(KV_HEADS * DIM, HIDDEN, 3)
    cos, sin = _rotary(2)
    with pytest.raises(RuntimeError, match="do not fit"):
        decoder.attention_in(torch.randn(2, HIDDEN), torch.ones(HIDDEN), 1e-6, decoder.Weights.of(wq, wk, wv), cos,
                             sin, HEADS + 1, KV_HEADS, DIM)


def _all_int4_layer():
    """q, k, v and o, gate, up, down, every one 4-bit (as in the assistant's copy)."""
    ins = [_int4(HEADS * DIM, HIDDEN, 1, True)[0], _int4(KV_HEADS * DIM, HIDDEN, 2, True)[0],
           _int4(KV_HEADS * DIM, HIDDEN, 3, True)[0]]
    outs = [_int4(HIDDEN, HEADS * DIM, 5)[0], _int4(INTER, HIDDEN, 6)[0], _int4(INTER, HIDDEN, 7)[0],
            _int4(HIDDEN, INTER, 8)[0]]
    return ins, outs


def test_merged_weights_give_bitwise_the_same_layer():
    ins, outs = _all_int4_layer()
    merged_ins, in_views = decoder.merged(ins)
    merged_outs, out_views = decoder.merged(outs[:1], outs[1:3], outs[3:])
    assert [w.out_features for w in merged_ins] == [(HEADS + 2 * KV_HEADS) * DIM]  # q|k|v
    assert [w.out_features for w in merged_outs] == [HIDDEN, 2 * INTER, HIDDEN]  # o, gate|up, down
    assert all(torch.equal(v, w.packed) for v, w in zip(in_views + out_views, ins + outs))  # each module's bytes
    torch.manual_seed(11)
    x, a, norm, (cos, sin) = torch.randn(7, HIDDEN), torch.randn(7, HEADS * DIM), torch.rand(HIDDEN) + 0.5, _rotary(7)
    for n in (1, 7):
        separate = decoder.attention_in(x[:n], norm, 1e-6, decoder.Weights.of(*ins), cos[:n], sin[:n], HEADS,
                                        KV_HEADS, DIM)
        together = decoder.attention_in(x[:n], norm, 1e-6, decoder.Weights.of(*merged_ins), cos[:n], sin[:n], HEADS,
                                        KV_HEADS, DIM)
        assert all(torch.equal(s, t) for s, t in zip(separate, together))
        assert torch.equal(decoder.attention_out(a[:n], x[:n], norm, 1e-6, decoder.Weights.of(*outs)),
                           decoder.attention_out(a[:n], x[:n], norm, 1e-6, decoder.Weights.of(*merged_outs)))


def test_only_weights_of_one_kind_merge():
    (wq, _), (wk, _), (wv, _) = _int4(HEADS * DIM, HIDDEN, 1, True), _int4(KV_HEADS * DIM, HIDDEN, 2, True), \
        _q6(KV_HEADS * DIM, HIDDEN, 3)
    assert [w.out_features for w in decoder.merged([wq, wk, wv])[0]] == [(HEADS + KV_HEADS) * DIM, KV_HEADS * DIM]
    (no_bias, _), (ragged, _) = _int4(KV_HEADS * DIM, HIDDEN, 2), _int4(40, HIDDEN, 4)  # 40: a part-filled block
    assert len(decoder.merged([wq, no_bias])[0]) == 2  # a bias and none
    assert len(decoder.merged([ragged, no_bias])[0]) == 2  # the first's last block is part padding
    assert len(decoder.merged([no_bias, ragged])[0]) == 1  # the last may end mid-block
    assert len(decoder.merged([no_bias], [ragged])[0]) == 2  # two inputs never merge


def test_a_merged_gate_up_of_odd_width_is_refused():
    ins, outs = _all_int4_layer()
    o, gate, up, down = outs
    odd = decoder.Weight(gate.packed, None, gate.out_features - 1, gate.groups_per_block)
    with pytest.raises(RuntimeError):
        decoder.attention_out(torch.randn(1, HEADS * DIM), torch.randn(1, HIDDEN), torch.ones(HIDDEN), 1e-6,
                              decoder.Weights.of(o, odd, down))

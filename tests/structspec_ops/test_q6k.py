"""structspec_ops.q6k: a GGUF's Q6_K groups times per-row int8 activations, row-invariant by construction.

The file's blocks are decoded, not de-quantized: decoding then encoding gives the file's bytes back, and the decoded
groups de-quantize bitwise to what gguf's own numpy de-quantizer gives. The op is tested against a float64 evaluation
of its math (exact int sums per super-block, scaled) within float32's rounding bound; invariance bitwise (a row
alone against the row among many, 1 and 2 threads); every path this CPU runs against every other, bitwise; and a
pinned checksum of one call's output bytes that every x86 CPU must reproduce.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

from structspec_ops import int4, q6k
from tests.helpers_models import threads
from tests.helpers_rounding import U, assert_within, gamma
from tests.structspec_ops.column_blocks import assert_blocks_are_the_full_calls_columns

pytestmark = pytest.mark.skipif(not q6k.built().ok, reason=f"Q6_K kernel unavailable: {q6k.built().reason}")


def _raw_blocks(rows: int, in_features: int, seed: int = 0) -> torch.Tensor:
    """(rows, bytes) random Q6_K blocks with finite fp16 d of unlike magnitudes."""
    generator = np.random.default_rng(seed)
    blocks = generator.integers(0, 256, (rows, in_features // 256, 210), dtype=np.uint8)
    d = (generator.uniform(0.5, 2.0, (rows, in_features // 256)) * 10.0 ** generator.integers(-5, -1, (rows, 1)))
    blocks[..., 208:210] = d.astype(np.float16)[..., None].view(np.uint8)
    return torch.from_numpy(blocks.reshape(rows, -1))


def _groups(out_features: int, in_features: int, seed: int = 0) -> q6k.Groups:
    return q6k.from_blocks(_raw_blocks(out_features, in_features, seed))


def _rows(n: int, in_features: int, seed: int = 1) -> torch.Tensor:
    torch.manual_seed(seed)
    return torch.randn(n, in_features) * torch.logspace(-3, 3, n)[:, None]  # rows of very different ranges


def _reference(x: torch.Tensor, groups: q6k.Groups, bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The op's math in float64 and its float32 rounding bound, (n, out) each: the row's codes as the op rounds them,
    per super-block the exact int sum of sc * (q - 32) * a, times d, summed over super-blocks and scaled by
    max|x| / 127. The op rounds each super-block's int sum to float32, adds super-blocks with one fma each, then
    scales and adds the bias: gamma(2 supers + 3) times the magnitudes summed."""
    n, k = x.shape
    top = x.abs().amax(1, keepdim=True)
    codes = torch.round(x * (127 / top)).to(torch.int64)  # (n, in), rounded in float32 as the op rounds
    q = groups.codes.to(torch.int64) - 32  # (out, in)
    dots = torch.einsum("ngt,ogt->nog", codes.reshape(n, -1, 16), q.reshape(-1, k // 16, 16))  # (n, out, groups)
    isum = (dots * groups.sc.to(torch.int64)).reshape(n, -1, k // 256, 16).sum(-1)  # (n, out, supers), exact
    terms = isum.double() * groups.d.double()
    row_scale = (top / 127).double()
    y = terms.sum(-1) * row_scale
    bound = gamma(2 * (k // 256) + 3) * terms.abs().sum(-1) * row_scale
    if bias is not None:
        y, bound = y + bias.double(), bound + U * bias.double().abs()
    return y, bound


def test_decoding_real_layout_round_trips_to_the_file_bytes():
    raw = _raw_blocks(9, 512)
    assert torch.equal(q6k.to_blocks(q6k.from_blocks(raw)), raw)


def test_decoded_groups_dequantize_bitwise_as_gguf_does():
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    raw = _raw_blocks(7, 768, seed=3)
    theirs = dequantize(raw.numpy(), GGMLQuantizationType.Q6_K)
    assert np.array_equal(q6k.from_blocks(raw).dequantize().numpy(), theirs)


@pytest.mark.parametrize("shape", [(48, 256), (37, 512), (5, 768)])
def test_pack_and_unpack_are_inverse(shape):
    groups = _groups(*shape)
    back = q6k.unpack(q6k.pack(groups))
    for name in ("codes", "sc", "d"):
        assert torch.equal(getattr(back, name), getattr(groups, name)), name


@pytest.mark.parametrize("n", [1, 3, 4, 5, 9])
@pytest.mark.parametrize("with_bias", [False, True])
def test_the_op_is_its_math_within_float32_rounding(n, with_bias):
    groups, x = _groups(37, 512), _rows(n, 512)
    bias = torch.randn(37) if with_bias else None
    y = q6k.linear(x, q6k.pack(groups), bias)
    reference, bound = _reference(x, groups, bias)
    assert_within(y, reference, bound, "q6k.linear against its float64 math")


def test_the_reference_fails_a_wrong_layout():
    """Control: swapping two code vectors of every group (a layout bug) is far outside the bound."""
    groups, x = _groups(16, 256), _rows(2, 256)
    swapped = groups.codes.reshape(16, -1, 4, 4)[:, :, [1, 0, 2, 3]].reshape(16, 256)
    y = q6k.linear(x, q6k.pack(q6k.Groups(swapped, groups.sc, groups.d)))
    with pytest.raises(AssertionError):
        assert_within(y, *_reference(x, groups, None), "control")


def test_the_op_is_x_times_the_file_weights_within_the_activations_step():
    """Against x @ W^T with W the file's de-quantized weights: each row errs by its int8 rounding (half a step
    of max|x| / 127 per input) times |W|, plus float rounding."""
    groups, x = _groups(40, 512, seed=5), _rows(4, 512, seed=6)
    weight = groups.dequantize().double()
    step = x.abs().amax(1, keepdim=True).double() / 127
    bound = 0.5 * step * weight.abs().sum(1) + gamma(512 + 40) * (x.double().abs() @ weight.abs().T)
    assert_within(q6k.linear(x, q6k.pack(groups)), x.double() @ weight.T, bound, "q6k.linear against x W^T")


@pytest.mark.parametrize("threads_count", [1, 2])
def test_a_row_is_bitwise_the_same_among_other_rows(threads_count):
    groups = _groups(70, 512, seed=2)
    packed, bias = q6k.pack(groups), torch.randn(70)
    x = _rows(17, 512)
    with threads(threads_count):
        together = q6k.linear(x, packed, bias)
        for i in (0, 4, 5, 16):
            assert torch.equal(q6k.linear(x[i : i + 1], packed, bias), together[i : i + 1]), i
        assert torch.equal(q6k.linear(x[3:8], packed, bias), together[3:8])


def test_a_subset_of_columns_is_bitwise_those_of_the_full_call():
    out_features = 100  # 7 blocks of 16, the last one of 4 columns
    packed, bias = q6k.pack(_groups(out_features, 512, seed=3)), torch.randn(out_features)
    x = _rows(5, 512)
    assert_blocks_are_the_full_calls_columns(lambda blocks: q6k.linear(x, packed, bias, blocks), out_features, 7)
    with pytest.raises(RuntimeError, match="column block 7 out of range"):
        q6k.linear(x, packed, bias, torch.tensor([7]))


@pytest.mark.parametrize("n", [1, 2, 5, 17])
def test_every_path_gives_bitwise_the_same_output(n):
    groups, x, bias = _groups(50, 768, seed=7), _rows(n, 768), torch.randn(50)
    packed = q6k.pack(groups)
    outputs = {}
    for name in int4.paths():
        with int4.forced_path(name):
            outputs[name] = q6k.linear(x, packed, bias)
            assert torch.equal(q6k.linear(x, packed, bias, torch.tensor([3, 0])),
                               torch.cat([outputs[name][:, 48:50], torch.zeros(n, 14), outputs[name][:, :16]], 1))
    best = int4.paths()[0]
    for name, y in outputs.items():
        assert torch.equal(y, outputs[best]), f"{name} differs from {best}"


@pytest.mark.parametrize("sign", [1, -1])
def test_the_extremes_of_codes_scales_and_activations_are_exact_on_every_path(sign):
    """Codes 0 and 63, scales -128 and 127, activations +-127: the int16 pair sums and int32 group sums of the vector
    paths at their bounds (4 * 63 * 127 < 2^15), in one-row, few-row and many-row calls (whose tiles unpack a block
    once for all rows). Every path equals the float64 evaluation of the math within float32 rounding, and the others."""
    out_features, k = 40, 512
    lane = torch.arange(out_features)[:, None]
    codes = torch.where((lane + torch.arange(k)[None] // 64) % 2 == 0, 63, 0).to(torch.uint8)
    sc = torch.where((lane + torch.arange(k // 16)[None]) % 3 == 0, -128, 127).to(torch.int8)
    d = torch.full((out_features, k // 256), 2.0**-10)
    groups = q6k.Groups(codes, sc, d)
    packed = q6k.pack(groups)
    x = sign * torch.where(torch.arange(k) % 5 == 0, -1.0, 1.0).repeat(11, 1) * torch.arange(1, 12)[:, None]
    expected, bound = _reference(x, groups, None)
    outputs = {}
    for name in int4.paths():
        with int4.forced_path(name):
            outputs[name] = torch.cat([q6k.linear(rows, packed) for rows in (x[:1], x[1:4], x[4:])])
        assert_within(outputs[name], expected, bound, f"{name} at the extremes")
    for name, y in outputs.items():
        assert torch.equal(y, outputs["portable"]), f"{name} differs from portable"


def test_a_pinned_checksum_holds_on_every_cpu():
    """Inputs from integers only (no random generator whose vector paths differ by CPU): the output bytes of one
    call, pinned. Computed on a Zen 4 (vnni, avx2 and portable alike); every path of every CPU must give it."""
    idx = torch.arange(48 * 512)
    codes = (idx * 7 % 64).to(torch.uint8).reshape(48, 512)
    sc = ((torch.arange(48 * 32) * 13) % 255 - 127).to(torch.int8).reshape(48, 32)
    d = (1.0 + (torch.arange(48 * 2) % 5).float() / 8).half().float().reshape(48, 2) / 1024
    x = ((torch.arange(3 * 512) * 11 % 41).float() - 20).reshape(3, 512) / 8
    packed = q6k.pack(q6k.Groups(codes, sc, d))
    for name in int4.paths():
        with int4.forced_path(name):
            y = q6k.linear(x, packed, ((torch.arange(48) % 9).float() - 4) / 4)
        assert hashlib.sha256(y.numpy().tobytes()).hexdigest()[:16] == PINNED, name


PINNED = "0a1bf6f9319eb7e1"


def test_quantize_is_close_to_the_weight():
    torch.manual_seed(0)
    weight = torch.randn(32, 512)
    groups = q6k.quantize(weight)
    back = groups.dequantize().reshape(32, -1, 16)
    # each weight is rounded to its group's scale d * sc (half a step), unless it lies past the codes' ends, where
    # it is clamped to -32 or 31 steps; plus float32 rounding of the products
    scale = (groups.d.repeat_interleave(16, 1) * groups.sc.float())[..., None].abs()  # (32, groups, 1)
    w = weight.reshape(32, -1, 16)
    past = (w.abs() - 31 * scale).clamp_min(0)
    assert ((back - w).abs() <= 0.5 * scale + past + 64 * 2.0**-24 * w.abs()).all()


def test_bad_inputs_are_refused():
    packed = q6k.pack(_groups(16, 256))
    with pytest.raises(ValueError, match="features"):
        q6k.linear(torch.randn(2, 512), packed)
    with pytest.raises(ValueError, match="multiple of 256"):
        q6k.quantize(torch.randn(4, 100))

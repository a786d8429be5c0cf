"""structspec_ops.int4: 4-bit groups times per-row int8 activations, row-invariant by construction.

Invariance is tested bitwise (torch.equal): a row alone against the same row among 2..16 rows, on one and two
threads, and a subset of output columns against the full call. Every path this CPU runs (vnni, avx2, portable) gives
bitwise the same output as every other, and a pinned checksum of one call's output bytes holds on every x86 CPU. The
arithmetic is tested against a float64 evaluation of the same math (codes times the row's int8 codes, per group,
scaled) within float32's rounding bound, and against x @ W^T within the error of 8-bit activations. The layout round
trip (pack, unpack) and the quantizer are tested exactly.
"""

from __future__ import annotations

import pytest
import torch

from structspec_ops import int4
from tests.helpers_models import threads
from tests.helpers_rounding import U, assert_within, gamma
from tests.structspec_ops.column_blocks import assert_blocks_are_the_full_calls_columns

pytestmark = pytest.mark.skipif(not int4.built().ok, reason=f"int4 kernel unavailable: {int4.built().reason}")


def _groups(out_features: int, in_features: int, per_block: int, seed: int = 0) -> int4.Groups:
    torch.manual_seed(seed)
    weight = torch.randn(out_features, in_features) * torch.linspace(0.1, 2.0, in_features)  # groups of unlike ranges
    return int4.quantize(weight, per_block)


def _rows(n: int, in_features: int, seed: int = 1) -> torch.Tensor:
    torch.manual_seed(seed)
    return torch.randn(n, in_features) * torch.logspace(-3, 3, n)[:, None]  # rows of very different ranges


def _reference(x: torch.Tensor, groups: int4.Groups, bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The op's math in float64 and its float32 rounding bound, (n, out) each: each row's codes
    round(x * 127 / max|x|) (as the op rounds them, in float32), each group's exact int sum times the group's scale,
    plus its offset times the row's code sum, scaled back by max|x| / 127. The op adds 2 terms a group in float32 and
    then scales and adds the bias: gamma(2 groups + 3) times the magnitudes summed (`tests.helpers_rounding`)."""
    top = x.abs().amax(1, keepdim=True)
    codes = torch.round(x * (127 / top)).double()  # (n, in)
    scale, offset = (t.double() for t in groups.scale_offset())  # (out, in / 32), rounded in float32 as in the op
    n, k = x.shape
    dots = torch.einsum("ngt,ogt->nog", codes.reshape(n, -1, 32), groups.codes.double().reshape(-1, k // 32, 32))
    sums = codes.reshape(n, -1, 32).sum(-1)  # (n, groups)
    row_scale = (top / 127).double()  # float32 max|x| / 127, as the op computes it
    terms = dots * scale + sums[:, None] * offset  # (n, out, groups)
    magnitude = (dots * scale).abs().sum(-1) + (sums[:, None] * offset).abs().sum(-1)
    y, bound = terms.sum(-1) * row_scale, gamma(2 * (k // 32) + 3) * magnitude * row_scale
    if bias is not None:
        y, bound = y + bias.double(), bound + U * bias.double().abs()
    return y, bound


@pytest.mark.parametrize("shape, per_block", [((48, 256), 8), ((37, 512), 8), ((20, 96), 1), ((5, 32), 1)])
def test_pack_and_unpack_are_inverse(shape, per_block):
    groups = _groups(*shape, per_block)
    back = int4.unpack(int4.pack(groups))
    for name in ("codes", "d", "dmin", "sc", "m"):
        assert torch.equal(getattr(back, name), getattr(groups, name)), name


@pytest.mark.parametrize("shape, per_block", [((48, 256), 8), ((37, 512), 8), ((20, 96), 1), ((19, 224), 7)])
@pytest.mark.parametrize("bias", [True, False])
def test_the_op_computes_its_math(shape, per_block, bias):
    groups = _groups(*shape, per_block)
    b = torch.randn(shape[0]) if bias else None
    x = _rows(9, shape[1])
    y = int4.linear(x, int4.pack(groups), b)
    expected, bound = _reference(x, groups, b)
    assert y.shape == (9, shape[0]) and y.dtype == torch.float32
    assert_within(y, expected, bound, "int4_linear")
    assert torch.equal(int4.linear(torch.zeros(2, shape[1]), int4.pack(groups), b),
                       (b if bias else torch.zeros(shape[0])).expand(2, -1))  # an all-zero row: the bias


def test_the_op_is_x_times_the_dequantized_weight_to_the_activations_step():
    groups = _groups(40, 256, 8)
    x = _rows(6, 256)
    weight = groups.dequantize()
    step = x.abs().amax(1, keepdim=True).double() / 127 / 2  # half an activation code
    exact = x.double() @ weight.double().T
    _, rounding = _reference(x, groups, None)
    assert_within(int4.linear(x, int4.pack(groups)), exact, step * weight.double().abs().sum(1) + rounding, "step")


@pytest.mark.parametrize("shape, per_block", [((100, 512), 8), ((24, 96), 1), ((40, 672), 7)])
@pytest.mark.parametrize("n_threads", [1, 2])
def test_a_row_alone_is_bitwise_the_same_row_among_others(shape, per_block, n_threads):
    packed, bias = int4.pack(_groups(*shape, per_block)), torch.randn(shape[0])
    x = _rows(16, shape[1])
    with threads(n_threads):
        together = int4.linear(x, packed, bias)
        for count in range(2, 17):  # every row tile and remainder: 4 + ... + 1..3
            assert torch.equal(int4.linear(x[:count], packed, bias), together[:count]), count
        for i in range(16):
            assert torch.equal(int4.linear(x[i : i + 1], packed, bias), together[i : i + 1]), i
        assert torch.equal(int4.linear(x[5:12], packed, bias), together[5:12])
        many = _rows(37, shape[1])  # two tiles of 16 rows (on AMX) and 5 more
        assert torch.equal(torch.cat([int4.linear(row[None], packed, bias) for row in many]),
                           int4.linear(many, packed, bias))
    with threads(3 - n_threads):  # the other thread count splits the columns otherwise
        assert torch.equal(int4.linear(x, packed, bias), together)


def test_a_subset_of_columns_is_bitwise_those_of_the_full_call():
    out_features = 100  # 7 blocks of 16, the last one of 4 columns
    packed, bias = int4.pack(_groups(out_features, 256, 8)), torch.randn(out_features)
    x = _rows(5, 256)
    assert_blocks_are_the_full_calls_columns(lambda blocks: int4.linear(x, packed, bias, blocks), out_features, 7)


def test_row_invariance_has_a_control_that_fails():
    """The same groups through a float matmul of per-call quantized activations (one scale for the whole call, as
    torch.ao's dynamic kernels do) do change a row with its neighbours: the bitwise checks above can fail."""
    groups = _groups(32, 256, 8)
    weight, x = groups.dequantize(), _rows(8, 256)

    def per_call(rows):
        scale = rows.abs().max() / 127
        return torch.round(rows / scale) * scale @ weight.T

    assert not torch.equal(per_call(x[:1]), per_call(x)[:1])


def test_quantize_keeps_each_weight_within_half_a_step_of_its_group():
    torch.manual_seed(0)
    weight = torch.randn(32, 512)
    weight[3, :5] = 20.0  # an outlier: a coarse step in its group, coarse 6-bit scales in its super-block
    groups = int4.quantize(weight, 8)
    scale, offset = groups.scale_offset()  # (out, groups)
    error = (groups.dequantize() - weight).abs().reshape(32, -1, 32)
    slack = scale[..., None] / 2 + weight.abs().reshape(32, -1, 32).amax(-1, keepdim=True) / 63  # 6-bit sc and m
    assert (error <= slack).all()
    assert error[3, 0].max() > 2 * error[3, 8:].max()  # the row's other super-blocks keep their fine steps
    assert int(groups.codes.max()) <= 15 and int(groups.sc.max()) <= 63 and int(groups.m.max()) <= 63


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="multiple of 256"):
        int4.quantize(torch.randn(4, 96), 8)
    with pytest.raises(ValueError, match="groups_per_block 9 is not in 1..8"):
        int4.quantize(torch.randn(4, 288), 9)
    packed = int4.pack(_groups(16, 64, 1))
    with pytest.raises(ValueError, match="64"):
        int4.linear(torch.randn(2, 32), packed)
    with pytest.raises(RuntimeError, match="out of range"):
        int4.linear(torch.randn(2, 64), packed, None, torch.tensor([1]))


# ----------------------------------------------------------------------------------------------- one model, any CPU


def _exact_inputs(n: int, in_features: int, out_features: int) -> tuple[torch.Tensor, int4.Groups, torch.Tensor]:
    """Inputs built from integers only (no random generator, whose vectorised paths differ by CPU): x, the groups of
    a weight and a bias, every value exactly representable."""
    i = torch.arange(n * in_features, dtype=torch.float64).reshape(n, in_features)
    x = (((i * 37) % 101 - 50) / 16 * (1 + (i % 7))).float()  # (n, in)
    o = torch.arange(out_features * in_features).reshape(out_features, in_features)
    blocks = in_features // 256
    j = torch.arange(out_features * blocks, dtype=torch.float64).reshape(out_features, blocks)
    g = torch.arange(out_features * in_features // 32).reshape(out_features, -1)  # (out, groups)
    groups = int4.Groups(codes=((o * 13 + o // 7) % 16).to(torch.uint8), d=((j % 5 + 1) / 640).float(),
                         dmin=((j % 3) / 1280).float(), sc=((g * 11 + g // 5) % 63 + 1).to(torch.uint8),
                         m=((g * 5 + g // 3) % 64).to(torch.uint8))
    bias = ((torch.arange(out_features) % 9 - 4) / 8).float()
    return x, groups, bias


# sha256 of the float32 output bytes of int4.linear on `_exact_inputs(7, 512, 40)`, with and without the bias: the
# same on every path and every x86 CPU (computed on the avx2 and portable paths of an AMD EPYC, 2026-11-29).
PINNED = {True: "77d24a297392fd65d7a9be4baccf6a23e87985496854a6fb0dc43a07048c9396",
          False: "001fc99b6b1fc519b34a9f5b02d12e81b177b62617292afb309e7bd5cbc192a7"}


@pytest.mark.parametrize("bias", [True, False])
def test_every_path_gives_the_pinned_output(bias):
    import hashlib

    x, groups, b = _exact_inputs(7, 512, 40)
    packed = int4.pack(groups)
    for name in int4.paths():
        with int4.forced_path(name):
            y = int4.linear(x, packed, b if bias else None)
        assert hashlib.sha256(y.numpy().tobytes()).hexdigest() == PINNED[bias], name


@pytest.mark.parametrize("shape, per_block", [((100, 512), 8), ((24, 96), 1), ((7, 256), 8), ((33, 896), 7)])
@pytest.mark.parametrize("n_threads", [1, 2])
def test_every_path_is_bitwise_the_best_path(shape, per_block, n_threads):
    """Each path this CPU runs against the best one, bitwise: every row count 1..17 (every register tile) and 32, 37
    (AMX tiles of 16 and the rest), with and without bias, a subset of columns, 1 and 2 threads. On a CPU with AMX this
    compares amx, vnni, avx2 and portable."""
    packed, bias = int4.pack(_groups(*shape, per_block)), torch.randn(shape[0])
    x = _rows(37, shape[1])
    counts = [*range(1, 18), 32, 37]
    blocks = torch.tensor([(shape[0] - 1) // 16, 0])
    with threads(n_threads):
        best = [int4.linear(x[:n], packed, b) for n in counts for b in (bias, None)]
        best_subset = int4.linear(x, packed, bias, blocks)
        for name in int4.paths()[1:]:
            with int4.forced_path(name):
                other = [int4.linear(x[:n], packed, b) for n in counts for b in (bias, None)]
                assert all(torch.equal(a, c) for a, c in zip(best, other, strict=True)), name
                assert torch.equal(int4.linear(x, packed, bias, blocks), best_subset), name
    assert int4.paths()[-1] == "portable"


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_the_largest_group_sums_do_not_saturate_on_any_path(sign):
    """Every code 15 against activations of one sign at full scale (+-127 each), the avx2 path's largest int16 pair
    sums (2 * 15 * 127 a pair, 7620 for a vector's two pairs): every path stays within the op's rounding of the exact
    math."""
    out_features, in_features = 32, 256
    groups = int4.Groups(codes=torch.full((out_features, in_features), 15, dtype=torch.uint8),
                         d=torch.full((out_features, 1), 1 / 64), dmin=torch.zeros(out_features, 1),
                         sc=torch.ones(out_features, 8, dtype=torch.uint8),
                         m=torch.zeros(out_features, 8, dtype=torch.uint8))
    x = torch.full((3, in_features), sign)
    expected, bound = _reference(x, groups, None)
    for name in int4.paths():
        with int4.forced_path(name):
            y = int4.linear(x, int4.pack(groups))
        assert_within(y, expected, bound, name)


def test_a_path_is_chosen_by_name_or_refused():
    assert int4.path() == int4.paths()[0]
    with int4.forced_path("portable"):
        assert int4.path() == "portable" and int4.kernel_name() == "int4 (portable C++)"
    assert int4.path() == int4.paths()[0]
    with pytest.raises(ValueError, match="unknown int4 path 'sse'"):
        with int4.forced_path("sse"):
            pass
    missing = [name for name in int4.PATHS if name not in int4.paths()]
    for name in missing:
        with pytest.raises(ValueError, match=f"cannot run the int4 path '{name}'"):
            with int4.forced_path(name):
                pass
    with pytest.raises(RuntimeError, match="unknown path"):
        torch.ops.structspec.int4_linear(torch.zeros(1, 32), int4.pack(_groups(16, 32, 1)).data, None, 16, 1, None,
                                         "sse")

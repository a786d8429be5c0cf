"""assisted.models.packing: packed Linear forwards agree with the dense ones, speculation on a packed target stays
greedy-identical to plain decoding of the unpacked model, and unpackable models are refused."""

from __future__ import annotations

import pytest
import torch

from assisted import generate
from assisted.models import packing
from assisted.models.packing import CALIBRATION_ROWS, pack_linear_weights, smallest_winning_rows
from tests.helpers_models import smollm2_tokenizer, tiny_llama
from tests.helpers_rounding import assert_same_function, float64_copy

pytestmark = [pytest.mark.usefixtures("one_thread")]

V = 49152


def test_packed_linear_agrees_with_dense_and_keeps_the_dense_kernel_below_min_rows():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.Linear(96, 32, bias=False))
    xs = {rows: torch.randn(1, rows, 64) for rows in (1, 2, 3, 7)}  # (batch, rows, in)
    exact = float64_copy(model)
    with torch.inference_mode():
        dense = {rows: model(x) for rows, x in xs.items()}
        packed = pack_linear_weights(model, min_rows=3)
        out = {rows: model(x) for rows, x in xs.items()}
    for rows, x in xs.items():
        assert out[rows].shape == dense[rows].shape == (1, rows, 32)
        assert_same_function({"packed": out[rows]}, exact(x.double()), dense[rows])
    assert torch.equal(out[1], dense[1]) and torch.equal(out[2], dense[2])  # below min_rows: the same kernel
    assert all("forward" in m.__dict__ for m in model)
    with packed.dense():
        assert not any("forward" in m.__dict__ for m in model)
    assert all("forward" in m.__dict__ for m in model)
    packed.unpack()
    assert not any("forward" in m.__dict__ for m in model)


@pytest.mark.parametrize("packed, expected", [
    ({2: 0.9, 4: 0.5, 8: 0.6}, 2),  # wins everywhere
    ({2: 1.2, 4: 1.0, 8: 1.0}, 4),  # the Xeon's shape: dense is as cheap up to 3 rows
    ({2: 0.5, 4: 2.1, 8: 2.0}, 8),  # a loss above a win: only the top counts
    ({2: 0.5, 4: 0.5, 8: 3.1}, None),  # loses at the largest count: never packed
    ({2: 0.99, 4: 1.9, 8: 2.9}, None),  # within the 5% margin is no win
])
def test_packing_starts_at_the_smallest_row_count_it_wins_from(packed, expected):
    dense = {2: 1.0, 4: 2.0, 8: 3.0}
    assert smallest_winning_rows(dense, packed) == expected


def test_measured_thresholds_are_per_shape_and_shapes_left_dense_keep_their_forward(monkeypatch):
    """The measurement is scripted (one threshold per weight shape, timed once per shape), so the verdict never
    follows the machine's timings: a shape that wins from 4 rows is packed, one that never wins stays dense."""
    scripted = {(512, 256): 4, (256, 512): None}
    timed = []

    def measure(module, packed_weight):
        timed.append(tuple(module.weight.shape))
        return scripted[tuple(module.weight.shape)]

    monkeypatch.setattr(packing, "_measure_min_rows", measure)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.Linear(512, 256), torch.nn.Linear(256, 512))
    x = torch.randn(1, 16, 256)  # (batch, rows, in)
    with torch.inference_mode():
        dense = model(x)
        exact = float64_copy(model)(x.double())
        packed = pack_linear_weights(model)
        assert_same_function({"packed": model(x)}, exact, dense)
    assert packed.min_rows == scripted and sorted(timed) == sorted(scripted)  # each shape timed once
    assert ["forward" in m.__dict__ for m in model] == [True, False, True]
    packed.unpack()
    assert not any("forward" in m.__dict__ for m in model)


def test_the_measured_threshold_is_the_smallest_winning_row_count(monkeypatch):
    """`_measure_min_rows` times both kernels at CALIBRATION_ROWS and hands the seconds to smallest_winning_rows
    (a stand-in stopwatch: dense costs `rows`, packed half of that from 4 rows up)."""
    calls = iter(seconds for rows in CALIBRATION_ROWS for seconds in (rows, rows / 2 if rows >= 4 else rows))
    monkeypatch.setattr(packing, "_median_seconds", lambda call, repeats: next(calls))
    module = torch.nn.Linear(8, 8)
    assert packing._measure_min_rows(module, module.weight) == min(r for r in CALIBRATION_ROWS if r >= 4)


@pytest.mark.parametrize("assistant_seed", [0, 1], ids=["itself", "other"])
def test_speculation_on_a_packed_target_is_greedy_identical_to_the_unpacked_model(plain_reference, assistant_seed):
    tok = smollm2_tokenizer()
    target, assistant = tiny_llama(V, seed=0, init=0.2), tiny_llama(V, seed=assistant_seed, init=0.2)
    kw = dict(tokenizer=tok, prompt="Describe a hero:", max_new_tokens=40)
    reference = plain_reference(target, **kw)
    packed = pack_linear_weights(target, min_rows=2)
    try:
        out = generate(target, assistant, **kw)
    finally:
        packed.unpack()
    assert out.token_ids == reference.token_ids
    if assistant_seed == 0:  # drafting for itself: every draft accepted, multi-token (packed) verifications
        assert out.stats.target_forward_passes < reference.stats.target_forward_passes


@pytest.mark.parametrize("model, message", [
    (torch.nn.Sequential(torch.nn.Linear(4, 4).half()), "0.weight is torch.float16"),
    (torch.nn.Sequential(torch.nn.ReLU()), "no torch.nn.Linear"),
])
def test_unpackable_models_are_refused_with_the_module_named(model, message):
    with pytest.raises(ValueError, match=message):
        pack_linear_weights(model)
    assert not any("forward" in m.__dict__ for m in model.modules())


def test_costs_measured_on_the_dense_model_do_not_carry_to_the_packed_one():
    from assisted.policy.costs import CostTable, memorize, recall

    target, assistant = tiny_llama(256, seed=0), tiny_llama(256, seed=1)
    memorize(target, assistant, CostTable().with_target(1, 0.5, 0.9))
    assert recall(target, assistant) is not None
    packed = pack_linear_weights(target, min_rows=2)
    assert recall(target, assistant) is None  # another weight layout: other costs
    with packed.dense():
        assert recall(target, assistant) is not None
    packed.unpack()
    assert recall(target, assistant) is not None


def test_a_packed_model_computes_the_same_logits_and_comes_off_again(smol_tokenizer):
    model, tok = tiny_llama(len(smol_tokenizer), seed=0), smol_tokenizer  # (moved from tests/experiments)
    ids = torch.tensor([tok("The cat sat on the mat and looked around").input_ids])  # (1, n)
    with torch.inference_mode():
        dense, single = model(input_ids=ids).logits, model(input_ids=ids[:, :1]).logits
        exact = float64_copy(model)(input_ids=ids).logits
        packed = pack_linear_weights(model, min_rows=2)
        try:
            assert_same_function({"packed": model(input_ids=ids).logits}, exact, dense)  # oneDNN rows
            assert torch.equal(model(input_ids=ids[:, :1]).logits, single)  # one row: the dense kernel
        finally:
            packed.unpack()
    assert all("forward" not in m.__dict__ for m in model.modules())

"""assisted.models.int4 (group-wise 4-bit) and assisted.models.loading.int8_copy: quantized copies of an assistant;
drafting with one stays lossless."""

from __future__ import annotations

import pytest
import torch

from assisted import generate
from assisted.models.int4 import KERNEL_ROWS, Int4Linear, int4_copy
from assisted.models.loading import int8_copy, set_eos
from tests.helpers_models import threads, tiny_llama


def _linear(out_features: int, in_features: int, bias: bool = True, seed: int = 0) -> torch.nn.Linear:
    torch.manual_seed(seed)
    linear = torch.nn.Linear(in_features, out_features, bias=bias)
    with torch.no_grad():
        linear.weight[3, :5] = 4.0  # an outlier spoils only its own group
    return linear


@pytest.mark.parametrize("group_size", [32, 64])
def test_weights_round_to_within_half_a_step_of_their_group(group_size):
    linear = _linear(48, 128)
    quantized = Int4Linear(linear, group_size)
    weight = linear.weight.detach().reshape(48, 128 // group_size, group_size)
    step = (weight.amax(-1, keepdim=True) - weight.amin(-1, keepdim=True)) / 15  # (out, groups, 1)
    error = (quantized.dequantized().reshape_as(weight) - weight).abs()
    # half a step of rounding, plus the bfloat16 rounding of each group's scale and zero
    assert (error <= step * 0.5 + weight.abs().amax(-1, keepdim=True) * 2**-7).all()
    assert error[3].max() > error[4].max()  # row 3 holds the outlier: its groups are coarser
    assert error[3, 1:].max() < error[3, 0].max()  # ... in its first group only


def test_forward_is_the_input_times_the_dequantized_weight():
    linear = _linear(32, 64)
    quantized = Int4Linear(linear, 32)
    x = torch.randn(2, 3, 64)
    expected = x.to(torch.bfloat16).float() @ quantized.dequantized().T + linear.bias.detach()
    got = quantized(x)
    assert got.shape == (2, 3, 32) and got.dtype == torch.float32
    assert torch.allclose(got, expected, rtol=2e-2, atol=2e-2)


def test_long_inputs_take_the_dense_path_over_the_same_weights():
    quantized = Int4Linear(_linear(64, 96), 32)
    assert torch.equal(quantized.dense.float(), quantized.dequantized())  # the kernel's weights, exactly
    x = torch.randn(KERNEL_ROWS + 5, 96)
    few = torch.cat([quantized(x[i : i + 1]) for i in range(len(x))])  # (n, 64) one row at a time: the kernel
    assert torch.allclose(quantized(x), few, rtol=1e-2, atol=1e-2)  # all rows at once: the dense path


def test_copy_replaces_the_linears_that_fit_and_leaves_the_model_alone():
    model = tiny_llama(vocab_size=40, seed=0, hidden=64)  # head: 40 rows, not a multiple of 16
    copy = int4_copy(model, group_size=32)
    kinds = {name: type(m) for name, m in copy.named_modules()}
    assert kinds["model.layers.0.mlp.down_proj"] is Int4Linear  # 128 inputs: four groups of 32
    assert kinds["lm_head"] is torch.nn.Linear  # 40 outputs do not fit: kept in float
    assert all(type(m) is not Int4Linear for m in model.modules())
    with pytest.raises(ValueError, match="one of"):
        int4_copy(model, group_size=48)
    with pytest.raises(ValueError, match="CPU"):
        int4_copy(tiny_llama(40, seed=0).to("meta"))
    with pytest.raises(ValueError, match="no Linear"):
        int4_copy(torch.nn.Sequential(torch.nn.Linear(10, 10)))


def test_greedy_drafts_from_an_int4_copy_give_the_target_s_text(smol_tokenizer, plain_reference):
    target = tiny_llama(len(smol_tokenizer), seed=3, hidden=64, init=0.2)
    assistant = int4_copy(target)
    options = dict(tokenizer=smol_tokenizer, prompt="Once upon", max_new_tokens=24, coalesce=False)
    ref = plain_reference(target, **options)
    out = generate(target, assistant, schedule="constant", num_assistant_tokens=4, **options)
    assert out.token_ids == ref.token_ids
    assert out.stats.accepted > 0 and out.stats.accepted < out.stats.drafted  # drafts taken, and some rejected


def test_int8_copy_drafts_losslessly(smol_tokenizer):
    model, tok = tiny_llama(len(smol_tokenizer), seed=0), smol_tokenizer  # (moved from tests/experiments)
    set_eos(tok, model)
    helper = int8_copy(model)
    assert helper is not model and isinstance(model.model.layers[0].mlp.up_proj, torch.nn.Linear)  # target untouched
    assert not isinstance(helper.model.layers[0].mlp.up_proj, torch.nn.Linear)  # int8 weights
    kw = dict(tokenizer=tok, prompt="The cat", max_new_tokens=12)
    with threads(1):
        out, ref = generate(model, helper, **kw), generate(model, **kw)
    assert out.token_ids == ref.token_ids and out.stats.drafted > 0

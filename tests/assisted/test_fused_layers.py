"""Fused decoder layers: which layers are fused, what the model reports, and that fusing keeps the model's function.

Row invariance of the fused models (n positions against n steps, a padded batch row against the row alone, static
and dynamic caches, Llama and Qwen2) is tested with the other int4 models in `tests/assisted/test_int4.py`, and
greedy and sampled generation over them there too: every int4 Llama there runs fused layers.
"""

from __future__ import annotations

import pytest
import torch

import assisted.models.int4_models as int4_models
from assisted.models.fused_layers import FusedDecoderLayer, fused_layer_count
from assisted.models.int4_models import int4_copy, linear_kernels, quantize_int4
from structspec_ops import int4
from tests.helpers_models import tiny_gpt2, tiny_llama, tiny_qwen2

pytestmark = pytest.mark.skipif(not int4.built().ok, reason=f"the kernels are unavailable: {int4.built().reason}")


@pytest.mark.parametrize("family", [tiny_llama, tiny_qwen2])
def test_llama_and_qwen2_layers_are_fused_and_said_so(family):
    model = quantize_int4(family(300, seed=0, layers=3, hidden=64))
    assert all(isinstance(layer, FusedDecoderLayer) for layer in model.model.layers)
    assert fused_layer_count(model) == (3, 3) and linear_kernels(model).endswith("; decoder layers fused 3/3")
    assistant = int4_copy(family(300, seed=1, layers=2, hidden=64))
    assert fused_layer_count(assistant) == (2, 2)


def test_a_family_it_does_not_know_runs_as_before_and_says_so():
    model = quantize_int4(tiny_gpt2(300, seed=0, layers=2, hidden=64))
    assert fused_layer_count(model) == (0, 2) and "fused" not in linear_kernels(model)


def test_layers_with_other_kernels_are_left_as_they_are(monkeypatch):
    """An int8 Linear in a layer (a GGUF's Q8_0 tensor, say): that layer runs unfused, the others fused."""
    from assisted.models.fused_layers import fuse_layers
    from assisted.models.int8 import Int8Linear

    monkeypatch.setattr(int4_models, "fuse_layers", lambda model: model)
    model = quantize_int4(tiny_llama(300, seed=0, layers=2, hidden=64))
    attention = model.model.layers[1].self_attn
    attention.v_proj = Int8Linear(torch.nn.Linear(64, attention.v_proj.out_features))
    fuse_layers(model)
    assert isinstance(model.model.layers[0], FusedDecoderLayer) and fused_layer_count(model) == (1, 2)


@pytest.mark.parametrize("family", [tiny_llama, tiny_qwen2])
def test_the_fused_model_is_the_unfused_model_up_to_activation_rounding(family, monkeypatch):
    """Fused and unfused compute the same layer; their norms and SiLU round differently, which can move an int8
    activation code by one step. On a model with peaky logits the greedy choice agrees at nearly every position."""
    fused = quantize_int4(family(300, seed=4, layers=2, hidden=64, init=0.2))
    monkeypatch.setattr(int4_models, "fuse_layers", lambda model: model)
    plain = quantize_int4(family(300, seed=4, layers=2, hidden=64, init=0.2))
    assert fused_layer_count(plain) == (0, 2)
    ids = torch.randint(0, 300, (1, 80), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        a, b = fused(ids).logits[0], plain(ids).logits[0]
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() >= 0.95
    assert ((a - b).abs().amax(-1) <= 0.05 * b.abs().amax(-1)).all()


def test_the_rotary_rows_are_made_once_a_forward_and_let_go_by_the_last_layer():
    """Every layer of a forward gets the same cos and sin: the first fused layer makes their rows, the others reuse
    them, and the last lets them go, so a forward at other positions (new cos and sin) gets rows of its own."""
    from assisted.models.fused_layers import RotaryRows

    rotary, (cos, sin) = RotaryRows(), (torch.randn(1, 3, 8), torch.randn(1, 3, 8))
    first = rotary.rows((cos, sin), 2, 3, last=False)
    assert rotary.rows((cos, sin), 2, 3, last=False)[0] is first[0]  # reused
    assert torch.equal(first[0], cos.expand(2, 3, 8).reshape(6, 8)) and torch.equal(first[1][3:], sin[0])
    assert rotary.rows((cos.clone(), sin), 2, 3, last=False)[0] is not first[0]  # another cos: made anew
    last = rotary.rows((cos, sin), 2, 3, last=True)
    assert rotary.rows((cos, sin), 2, 3, last=False)[0] is not last[0]  # let go after the last layer


def test_a_model_s_last_fused_layer_is_marked():
    model = quantize_int4(tiny_llama(300, seed=0, layers=3, hidden=64))
    assert [layer.last for layer in model.model.layers] == [False, False, True]
    assert len({id(layer.rotary) for layer in model.model.layers}) == 1


@pytest.mark.parametrize("family", [tiny_llama, tiny_qwen2])
@pytest.mark.parametrize("growing", [False, True])
def test_the_one_row_forward_is_bitwise_the_model_s_forward(family, growing):
    """`drafting.kv_cache.forward`'s fast path against the model called as transformers calls it: a prefill,
    one-position steps and a verify of several positions, logits and cached keys bitwise equal; over transformers'
    layers and over `GrowingLayer`s (where the op is called directly)."""
    from transformers import DynamicCache

    from assisted.models.fused_layers import one_row_forward
    from drafting.kv_cache import GrowingLayer, cache_argument, new_cache

    model = quantize_int4(family(300, seed=2, layers=2, hidden=64))
    assert model.one_row_forward is one_row_forward
    fast, slow = new_cache() if growing else DynamicCache(), DynamicCache()
    ids = torch.randint(0, 300, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.inference_mode():
        for start, stop, keep in ((0, 20, 1), (20, 21, 1), (21, 22, 1), (22, 27, 5), (27, 40, 3)):
            got = one_row_forward(model, fast, ids[start:stop], keep)
            out = model(input_ids=torch.tensor([ids[start:stop]]), use_cache=True, logits_to_keep=keep,
                        **{cache_argument(type(model)): slow})
            assert torch.equal(got, out.logits[0]), (start, stop)
    assert all(torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
               for a, b in zip(fast.layers, slow.layers))
    assert all(isinstance(layer, GrowingLayer) == growing for layer in fast.layers)


def test_the_one_row_forward_steps_aside_where_it_does_not_apply():
    from transformers import DynamicCache

    from assisted.models.fused_layers import one_row_forward

    model = quantize_int4(tiny_llama(300, seed=2, layers=2, hidden=64))
    assert one_row_forward(model, object(), [1, 2], 1) is None  # another cache
    model.set_attn_implementation("sdpa")
    assert one_row_forward(model, DynamicCache(), [1, 2], 1) is None  # another attention
    assert not hasattr(quantize_int4(tiny_gpt2(300, seed=0, layers=2, hidden=64)), "one_row_forward")


def test_an_assistant_s_fused_copy_runs_the_row_invariant_attention_and_the_fast_path():
    from structspec_ops.attention import ATTENTION

    assistant = int4_copy(tiny_qwen2(300, seed=1, layers=2, hidden=64))
    assert assistant.config._attn_implementation == ATTENTION and hasattr(assistant, "one_row_forward")

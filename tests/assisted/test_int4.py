"""assisted.models.int4_models: a row-invariant 4-bit target, the assistant's 4-bit copy, and the int8 fallback.

Row invariance is tested bitwise (torch.equal): one forward over n positions against n one-token steps (dynamic and
static caches), a row of a padded batch with a hole against the row alone. The identity tests compare generate()
and generate_batch() over an int4 target with the plain loop of tests/helpers_reference.py over the same int4
model; sampling is checked against the exact distribution of plain sampling of that model. The GGUF side (groups
kept exactly) is in test_int4_gguf.py.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from assisted import generate
from assisted.models import int4_models
from assisted.models.int4_models import int4_copy, linear_kernels, quantize_int4
from assisted.models.int4_linear import Int4Linear
from assisted.models.int8 import Int8Linear
from assisted.models.loading import load_pair, set_eos
from structspec_ops import int4
from structspec_ops.attention import ATTENTION
from structspec_ops.build import Built
from tests.assisted.test_int8 import (SCHEMA, padded_row_is_the_row_alone, steps_equal_one_forward,
                                      stock_attention_is_not_row_invariant)
from tests.helpers_models import threads, tiny_gpt2, tiny_llama, tiny_qwen2

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.skipif(not int4.built().ok, reason=f"int4 kernel unavailable: {int4.built().reason}")]


def int4_llama(vocab_size: int, seed: int, **kw):
    return quantize_int4(tiny_llama(vocab_size, seed, **kw))


# ------------------------------------------------------------------------------------------------ the Linear


def test_a_linear_multiplies_by_its_groups():
    torch.manual_seed(0)
    linear = torch.nn.Linear(512, 48)
    layer = Int4Linear.quantized(linear)
    assert layer.groups_per_block == 8
    # rows that 8 groups do not divide share d and dmin over the largest count that does (896 inputs: 7 groups)
    assert [Int4Linear.quantized(torch.nn.Linear(k, 8)).groups_per_block for k in (896, 96, 224, 32)] == [7, 3, 7, 1]
    groups = int4.quantize(linear.weight, 8)
    assert torch.equal(layer.dequantized(), groups.dequantize())
    x = torch.randn(2, 3, 512)
    y = layer(x)
    assert y.shape == (2, 3, 48) and torch.equal(y.reshape(6, 48), int4.linear(x.reshape(6, 512), int4.pack(groups),
                                                                               linear.bias.detach()))
    assert torch.equal(layer(x.requires_grad_()), y)  # runs where autograd is on (an inference kernel)


def test_quantize_int4_replaces_every_linear_and_sets_the_attention():
    model = int4_llama(300, seed=0, layers=2, hidden=64)
    assert model.config._attn_implementation == ATTENTION
    assert not any(type(m) is torch.nn.Linear for m in model.modules())
    assert type(model.get_output_embeddings()) is Int8Linear  # the head stays int8, as Q4_K_M keeps it in Q6_K
    assert type(model.model.layers[0].mlp.down_proj) is Int4Linear
    assert linear_kernels(model) == f"{int4.kernel_name()} x14, int8 (fbgemm) x1; decoder layers fused 2/2"
    gpt2 = quantize_int4(tiny_gpt2(300, seed=0))
    assert {type(m).__name__ for m in gpt2.modules()} & {"Linear", "Conv1D"} == set()


# ------------------------------------------------------------------------------------------------ the forward


@pytest.mark.parametrize("cache_kind", ["dynamic", "static"])
@pytest.mark.parametrize("make", [lambda: int4_llama(300, seed=0, layers=3, hidden=64),
                                  lambda: int4_llama(300, seed=0, layers=2, hidden=256),
                                  lambda: quantize_int4(tiny_qwen2(300, seed=0, layers=2, hidden=256)),
                                  lambda: quantize_int4(tiny_gpt2(300, seed=0, layers=2, hidden=64))],
                         ids=["llama-groups", "llama-superblocks", "qwen2-biases", "gpt2"])
def test_one_forward_over_n_positions_is_bitwise_n_single_steps(make, cache_kind):
    model = make()
    torch.manual_seed(5)
    ids = torch.randint(0, 300, (40,)).tolist()
    with torch.inference_mode():
        for n in range(1, 17):
            steps_equal_one_forward(model, ids[: 20 + n], 20, cache_kind)


def test_the_stock_attention_over_int4_linears_is_not_row_invariant():
    stock_attention_is_not_row_invariant(int4_llama(300, seed=0, layers=3, hidden=64))


@pytest.mark.parametrize("family", [tiny_llama, tiny_qwen2])
def test_a_row_of_a_padded_batch_is_bitwise_the_row_alone(family):
    padded_row_is_the_row_alone(quantize_int4(family(300, seed=1, layers=2, hidden=64)))


# ------------------------------------------------------------------------------------------------ generate


@pytest.fixture(scope="module")
def int4_pair(smol_tokenizer):
    """An int4 target with peaky logits, an int4 copy of a partly agreeing model and a float model that disagrees."""
    vocab = len(smol_tokenizer)
    target = int4_llama(vocab, seed=3, layers=2, hidden=64, init=0.2)
    near = tiny_llama(vocab, seed=3, layers=2, hidden=64, init=0.2)
    with torch.no_grad():
        for p in near.parameters():
            p.add_(0.02 * torch.randn_like(p))  # close to the target's float weights: accepts some drafts
    far = tiny_llama(vocab, seed=11, hidden=64, init=0.2)
    set_eos(smol_tokenizer, target, near, far)
    return target, int4_copy(near), far


@pytest.mark.parametrize("coalesce", [True, False], ids=["coalesced", "verified-forced"])
@pytest.mark.parametrize("schema", [None, SCHEMA], ids=["free", "schema"])
@pytest.mark.parametrize("helper", ["none", "itself", "int4-near", "float-far"])
def test_greedy_over_an_int4_target_is_its_plain_decoding(smol_tokenizer, int4_pair, plain_reference, every_cache,
                                                           helper, schema, coalesce):
    target, near, far = int4_pair
    assistant = {"none": None, "itself": target, "int4-near": near, "float-far": far}[helper]
    options = dict(tokenizer=smol_tokenizer, prompt="Once upon a time", max_new_tokens=24, schema=schema,
                   coalesce=coalesce)
    ref = plain_reference(target, **options)
    out = generate(target, assistant, schedule="constant", num_assistant_tokens=4, **options)
    assert out.token_ids == ref.token_ids and out.stop_reason == ref.stop_reason
    assert out.stats.target_kernels == linear_kernels(target) and "int4" in out.stats.target_kernels
    if helper == "itself" and schema is None:  # a perfect assistant: all it drafts is accepted
        assert out.stats.accepted_by_source["assistant"] == out.stats.drafted_by_source["assistant"] > 0
    if helper == "int4-near" and schema is None:  # drafts taken, and some rejected
        assert 0 < out.stats.accepted_by_source["assistant"] < out.stats.drafted_by_source["assistant"]


def test_sampling_over_an_int4_target_keeps_the_plain_distribution(monkeypatch):
    """Whole outputs of coalesced sampling over an int4 target, with a disagreeing int4 assistant, against the exact
    distribution of plain sampling of the same int4 model (the float32 test's check)."""
    from tests.assisted.test_generate_sampling import COALESCED, COALESCED_DRAWS, PROMPT, matches, whole_outputs
    from tests.drafting.test_sampling import hf_probs
    from tests.helpers_clock import pin_clock
    from tests.helpers_models import tiny_tokenizer
    from tests.helpers_reference import plain_distribution

    pin_clock(monkeypatch)
    tok = tiny_tokenizer()
    target = int4_llama(8, seed=3, hidden=32, init=0.3, eos=0)
    assistant = int4_copy(tiny_llama(8, seed=0, hidden=32, init=0.3, eos=0))
    assert "int4" in linear_kernels(target) and "int4" in linear_kernels(assistant)
    expected = plain_distribution(target, tok, PROMPT, 12, lambda lg, m: hf_probs(lg, m, temperature=1.0),
                                  regex=COALESCED, coalesce=True)
    counts = whole_outputs(tok, target, assistant, COALESCED_DRAWS, None)
    ok, numbers = matches(counts, expected, COALESCED_DRAWS, any_cpu=True)
    assert ok, numbers


@pytest.mark.parametrize("helper", ["none", "itself", "other"])
@pytest.mark.parametrize("constraint", [{}, {"schema": "POINT"}], ids=["free", "schema"])
def test_rows_of_a_batch_over_an_int4_target_are_each_row_alone(plain_reference, helper, constraint):
    """Greedy rows of generate_batch over an int4 target (padding, holes after rejections, refills) equal the plain
    loop of each row alone over the same int4 model, token for token."""
    from assisted import generate_batch
    from tests.assisted.test_generate_batch import POINT, PROMPTS, V, references, same_rows
    from tests.helpers_models import smollm2_tokenizer

    tok = smollm2_tokenizer()
    target = int4_llama(V, seed=0, hidden=64)
    assistant = {"none": None, "itself": target, "other": int4_copy(tiny_llama(V, seed=1, layers=2, hidden=64))}[helper]
    kw = dict(max_new_tokens=24, **({"schema": POINT} if constraint else {}))
    refs = references(plain_reference, target, tok, PROMPTS, **kw)
    out = generate_batch(target, assistant, tokenizer=tok, prompts=PROMPTS, batch_size=3, **kw)
    same_rows(out, refs)


# ------------------------------------------------------------------------------------------------ the assistant copy


def test_the_copy_replaces_the_linears_that_fit_and_leaves_the_model_alone():
    model = tiny_llama(40, seed=0, hidden=64)
    model.lm_head = torch.nn.Linear(64, 40, bias=False)
    model.model.layers[0].mlp.down_proj = torch.nn.Linear(100, 64)  # 100 inputs: no groups of 32
    helper = int4_copy(model)
    kinds = {name: type(m) for name, m in helper.named_modules()}
    assert kinds["model.layers.0.mlp.up_proj"] is Int4Linear and kinds["lm_head"] is Int4Linear  # the head too
    assert kinds["model.layers.0.mlp.down_proj"] is torch.nn.Linear  # kept in float
    assert helper.config._attn_implementation == model.config._attn_implementation  # attention untouched
    assert all(type(m) is not Int4Linear for m in model.modules())
    with pytest.raises(ValueError, match="CPU"):
        int4_copy(tiny_llama(40, seed=0).to("meta"))
    with pytest.raises(ValueError, match="no Linear"):
        int4_copy(torch.nn.Sequential(torch.nn.Linear(10, 10)))


def test_the_model_is_the_same_on_every_path_this_cpu_runs(smol_tokenizer):
    """The int4 target's logits and its greedy output on each kernel path (vnni, avx2, portable) bitwise those of the
    best path: `quantize_target="int4"` is one model on every x86 CPU, whatever its instruction set."""
    model = int4_llama(len(smol_tokenizer), seed=0, layers=2, hidden=256)
    ids = torch.tensor([smol_tokenizer("The cat sat on the mat").input_ids])  # (1, n)
    with torch.inference_mode():
        best = model(input_ids=ids).logits
    best_out = generate(model, tokenizer=smol_tokenizer, prompt="Once", max_new_tokens=6).token_ids
    for name in int4.paths()[1:]:
        with int4.forced_path(name), torch.inference_mode():
            assert torch.equal(model(input_ids=ids).logits, best), name
        with int4.forced_path(name):
            assert generate(model, tokenizer=smol_tokenizer, prompt="Once", max_new_tokens=6).token_ids == best_out


# ------------------------------------------------------------------------------------------------ fallback, refusals


@pytest.fixture
def no_kernel(monkeypatch):
    """The int4 library as on a machine where it cannot build."""
    monkeypatch.setattr(int4, "built", lambda: Built("int4", False, "no C++ compiler here"))


def test_without_the_kernel_the_target_runs_int8_and_says_so(no_kernel, smol_tokenizer):
    with pytest.warns(UserWarning, match=r"^int4 kernel unavailable \(no C\+\+ compiler here\); the target runs "
                                         r"the int8 kernel instead: another model, whose outputs differ from the "
                                         r"int4 model's$"):
        model = int4_llama(len(smol_tokenizer), seed=0, hidden=64)
    assert linear_kernels(model) == "int8 (fbgemm) x8" and model.config._attn_implementation == ATTENTION
    out = generate(model, tokenizer=smol_tokenizer, prompt="Once", max_new_tokens=2)
    assert out.stats.target_kernels == "int8 (fbgemm) x8"  # the result says which kernel ran
    with pytest.warns(UserWarning, match="the assistant copy runs the int8 kernel"):
        helper = int4_copy(tiny_llama(300, seed=1, hidden=64))
    assert linear_kernels(helper) == "int8 (fbgemm) x8"
    with pytest.raises(RuntimeError, match=r"no C\+\+ compiler"):
        int4.linear(torch.randn(1, 64), int4.pack(int4.quantize(torch.randn(16, 64), 1)))


def test_with_the_kernel_nothing_is_said():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert "int4" in linear_kernels(int4_llama(300, seed=0, hidden=64))
    assert int4_models.unavailable() is None


def test_an_int4_target_from_a_float_folder(tmp_path, plain_reference):
    from tests.helpers_models import save_tiny_llama

    folder = save_tiny_llama(tmp_path / "tiny", ["a", "b", "c", "d"], hidden_size=64, intermediate_size=256,
                             eos_token_id=1)
    model, tokenizer, assistant = load_pair(str(folder), str(folder), quantize_target="int4")
    assert assistant is model
    assert linear_kernels(model) == f"{int4.kernel_name()} x7, int8 (fbgemm) x1; decoder layers fused 1/1"
    ref = plain_reference(model, tokenizer=tokenizer, prompt="a", max_new_tokens=6, coalesce=False)
    assert generate(model, assistant, tokenizer=tokenizer, prompt="a", max_new_tokens=6).token_ids == ref.token_ids


@pytest.mark.parametrize("options, message", [
    ({"quantize_target": "int3"}, "one of \\['int4', 'int8'\\]"),
    ({"quantize_target": "int4", "pack": True}, "pack"),
    ({"quantize_target": "int4", "dtype": "bfloat16"}, "float32"),
    ({"quantize_target": "int4", "device": "meta"}, "CPU"),
])
def test_load_pair_refuses_an_int4_target_it_cannot_honour_before_loading(options, message):
    with pytest.raises(ValueError, match=message):
        load_pair("no/such-model", **options)  # refused before the (missing) model is looked up


def test_a_target_without_the_attention_interface_is_refused_before_its_weights_load(tmp_path):
    from transformers import BloomConfig

    from tests.helpers_models import save_tiny_llama

    folder = save_tiny_llama(tmp_path / "tiny", ["a", "b"], hidden_size=32, intermediate_size=64, eos_token_id=1)
    BloomConfig(vocab_size=8, hidden_size=32, n_layer=1, n_head=4).save_pretrained(folder)  # llama weights stay
    with pytest.raises(ValueError, match="attention interface"):
        load_pair(str(folder), quantize_target="int4")


def test_threads_do_not_change_a_forward():
    model = int4_llama(300, seed=2, layers=2, hidden=256)
    ids = torch.arange(3, 40)[None]
    with torch.inference_mode():
        with threads(1):
            one = model(ids).logits
        with threads(2):
            two = model(ids).logits
    assert torch.equal(one, two)


def test_the_command_takes_an_int4_target_and_reports_its_kernels(tmp_path, capsys):
    import json

    from assisted.cli import main
    from tests.helpers_models import save_tiny_llama

    folder = save_tiny_llama(tmp_path / "tiny", ["a", "b", "c", "d"], hidden_size=64, intermediate_size=256,
                             eos_token_id=1)
    assert main(["generate", "--model", str(folder), "--quantize-target", "int4", "--prompt", "a b",
                 "--max-new-tokens", "4", "--stats"]) == 0
    stats = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert stats["target_kernels"] == f"{int4.kernel_name()} x7, int8 (fbgemm) x1; decoder layers fused 1/1"


def test_a_library_that_cannot_build_says_why():
    from structspec_ops.build import load

    broken = load("int4_missing", ("no_such_file.cpp",))
    assert not broken.ok and broken.reason.startswith("the C++ op library 'int4_missing' did not build")

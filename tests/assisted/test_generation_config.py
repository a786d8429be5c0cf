"""generate() as transformers' generate: generation configs and model defaults, logits processors and repetition
penalty (lossless), stop strings and stopping criteria, streamers, and refusals of what cannot be honoured."""

from __future__ import annotations

import importlib
from collections import Counter

import pytest
import torch
from transformers import GenerationConfig, LogitsProcessor, StoppingCriteria, TextIteratorStreamer

from assisted import generate
from assisted.config import resolve
from tests.assisted.test_acceptance import compare, sampling_noise_tv
from tests.helpers_models import smollm2_tokenizer, tiny_llama, tiny_tokenizer

pytestmark = [pytest.mark.usefixtures("one_thread")]
V = 49152


class BanLastAndPreferParity(LogitsProcessor):
    """A processor that depends on the prefix: bans repeating the last token, and lifts ids of the prefix length's
    parity."""

    def __call__(self, input_ids, scores):
        scores = scores.clone()
        scores[:, input_ids[0, -1]] = -float("inf")
        lift = torch.zeros(scores.shape[-1], device=scores.device)
        lift[input_ids.shape[-1] % 2 :: 2] = 1.5
        return scores + lift


@pytest.fixture(scope="module")
def tok():
    return smollm2_tokenizer()


@pytest.fixture(scope="module")
def models():
    return {"target": tiny_llama(V, seed=0, layers=2, init=0.3), "other": tiny_llama(V, seed=1, init=0.3)}


def hf_greedy(model, tok, prompt, **kwargs) -> list[int]:
    """transformers' own greedy generate: the independent reference for processors and penalties."""
    ids = tok(prompt)["input_ids"]
    out = model.generate(torch.tensor([ids]), do_sample=False, **kwargs)
    return out[0, len(ids):].tolist()


@pytest.mark.parametrize("helper", ["other", "target"])
@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.parametrize("penalty", [{"repetition_penalty": 1.4}, {"no_repeat_ngram_size": 2},
                                     {"logits_processor": "prefix"}])
def test_greedy_with_processors_equals_transformers_plain_decoding(tok, models, helper, k, penalty):
    penalty = {"logits_processor": [BanLastAndPreferParity()]} if penalty.get("logits_processor") else penalty
    expected = hf_greedy(models["target"], tok, "Once", max_new_tokens=24, **penalty)
    out = generate(models["target"], models[helper], tokenizer=tok, prompt="Once", max_new_tokens=24, coalesce=False,
                   num_assistant_tokens_schedule="constant", num_assistant_tokens=k, **penalty)
    assert out.token_ids == expected
    assert out.stats.accepted > 0 or helper == "other"


def test_the_models_generation_config_is_honoured_by_default(tok, models):
    target = tiny_llama(V, seed=0, layers=2, init=0.3)
    plain = generate(target, tokenizer=tok, prompt="Once", max_new_tokens=24).token_ids
    target.generation_config = GenerationConfig(repetition_penalty=3.0, max_new_tokens=24)
    expected = hf_greedy(target, tok, "Once")  # transformers reads the same config
    out = generate(target, models["other"], tokenizer=tok, prompt="Once")
    assert out.token_ids == expected != plain and out.stop_reason == "length"
    target.generation_config.eos_token_id = expected[5]
    out = generate(target, models["other"], tokenizer=tok, prompt="Once")
    assert out.token_ids == expected[:6] and out.stop_reason == "eos"
    target.generation_config = GenerationConfig(do_sample=True, temperature=0.7, top_k=20, top_p=0.8, max_length=40)
    settings = resolve(target, None, {"top_p": 0.5})
    assert (settings.do_sample, settings.temperature, settings.top_k, settings.top_p) == (True, 0.7, 20, 0.5)
    # passed config wins
    assert settings.max_length == 40 and resolve(target, GenerationConfig(), {}).do_sample is False
    sampled = generate(target, tokenizer=tok, prompt="Once", seed=1)
    assert len(sampled.token_ids) == 40 - len(tok("Once")["input_ids"])  # max_length bounds prompt + output


def test_our_defaults_where_nothing_is_set_and_custom_entries_for_our_knobs(tok, models):
    settings = resolve(models["target"], GenerationConfig(coalesce=False), {})
    assert (settings.max_new_tokens, settings.top_k, settings.num_assistant_tokens, settings.coalesce) == (256, None, 5,
                                                                                                          False)
    assert resolve(models["target"], None, {"num_assistant_tokens_schedule": "heuristic_transient"}
                   ).num_assistant_tokens_schedule == "heuristic"


def test_sampling_with_a_prefix_dependent_processor_keeps_the_reference_distribution():
    tok = tiny_tokenizer()
    target = tiny_llama(8, seed=3, hidden=16, init=0.3, eos=0)
    assistant = tiny_llama(8, seed=0, hidden=16, init=0.3, eos=0)
    processor, prompt, draws = BanLastAndPreferParity(), [1, 3], 1000

    def probs(ids):
        with torch.no_grad():
            logits = target(torch.tensor([ids])).logits[0, -1:]
        return processor(torch.tensor([ids]), logits).softmax(-1)[0]

    expected = {}
    for t1, p1 in enumerate(probs(prompt).tolist()):
        if p1 > 0:
            for t2, p2 in enumerate([1.0] if t1 == 0 else probs(prompt + [t1]).tolist()):
                if p2 > 0:
                    expected[(t1,) if t1 == 0 else (t1, t2)] = p1 * p2
    kw = dict(tokenizer=tok, input_ids=prompt, max_new_tokens=2, do_sample=True, coalesce=False,
              num_assistant_tokens=2, num_assistant_tokens_schedule="constant", logits_processor=[processor])
    counts = Counter(tuple(generate(target, assistant, seed=s, **kw).token_ids[:2]) for s in range(draws))
    p_value, tv = compare(counts, expected, draws)
    assert p_value > 1e-3 and tv < 1.5 * sampling_noise_tv(expected, draws), f"p={p_value:.2g} TV={tv:.3f}"


def stop_across(tok, ids: list[int], start: int = 3) -> str:
    """A stop string that ends inside the token after a boundary: the last two characters of token i and the first
    of token i + 1, written first there."""
    pieces = [tok.decode([t]) for t in ids]
    i = next(i for i in range(start, len(ids) - 1) if len(pieces[i]) >= 2 and len(pieces[i + 1]) >= 2
             and pieces[i][-2:] + pieces[i + 1][:1] not in "".join(pieces[: i + 1]))
    return pieces[i][-2:] + pieces[i + 1][:1]


def stop_inside(tok, ids: list[int], start: int = 3) -> str:
    """A stop string strictly inside one token (neither its first nor its last character), written first there."""
    pieces = [tok.decode([t]) for t in ids]
    i = next(i for i in range(start, len(ids)) if len(pieces[i]) >= 4 and pieces[i][1:3] not in "".join(pieces[:i])
             and pieces[i][1:3] not in pieces[i][2:])
    return pieces[i][1:3]


@pytest.mark.parametrize("helper", ["target", "other"])  # accepts everything / rejects most drafts
@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.parametrize("where", ["across", "inside"])
def test_a_stop_string_ends_at_the_token_completing_it_as_transformers_does(tok, models, helper, k, where):
    full = generate(models["target"], tokenizer=tok, prompt="Once", max_new_tokens=30)
    stop = (stop_across if where == "across" else stop_inside)(tok, full.token_ids)
    expected = hf_greedy(models["target"], tok, "Once", max_new_tokens=30, stop_strings=[stop, "never written"],
                         tokenizer=tok)
    assert len(expected) < len(full.token_ids) and full.token_ids[: len(expected)] == expected
    out = generate(models["target"], models[helper], tokenizer=tok, prompt="Once", max_new_tokens=30,
                   stop_strings=[stop, "never written"], num_assistant_tokens_schedule="constant",
                   num_assistant_tokens=k)
    assert out.token_ids == expected and out.stop_reason == "stop_string"
    assert stop in out.text and stop not in tok.decode(expected[:-1])
    assert out.stats.accepted > 0 or helper == "other"


BATCH_PROMPTS = ["Once", "Hi there", "A much longer prompt about a tale, told in a few words:", "x"]


@pytest.mark.parametrize("helper", ["target", "other"])
@pytest.mark.parametrize("option", ["stop_strings", "repetition_penalty", "logits_processor"])
def test_batched_rows_with_options_equal_transformers_generate_per_row(tok, models, helper, option):
    """generate_batch honours stop strings (one across a token boundary, one inside a token), a repetition penalty
    and a prefix-dependent processor in every row as transformers' own generate does for that row alone."""
    from assisted import generate_batch

    kw = dict(max_new_tokens=24)
    if option == "stop_strings":
        plain = [generate(models["target"], tokenizer=tok, prompt=p, **kw).token_ids for p in BATCH_PROMPTS[:2]]
        kw["stop_strings"] = [stop_across(tok, plain[0]), stop_inside(tok, plain[1])]
    else:
        kw |= {"repetition_penalty": 1.4} if option == "repetition_penalty" else {
            "logits_processor": [BanLastAndPreferParity()]}
    extra = {"tokenizer": tok} if option == "stop_strings" else {}
    expected = [hf_greedy(models["target"], tok, p, **kw, **extra) for p in BATCH_PROMPTS]
    out = generate_batch(models["target"], models[helper], tokenizer=tok, prompts=BATCH_PROMPTS, batch_size=2,
                         num_assistant_tokens=3, num_assistant_tokens_schedule="constant", **kw)
    assert [r.token_ids for r in out] == expected
    if option == "stop_strings":
        assert [r.stop_reason for r in out[:2]] == ["stop_string"] * 2 and all(len(e) < 24 for e in expected[:2])


class AfterTokens(StoppingCriteria):
    def __init__(self, length):
        self.length, self.calls = length, 0

    def __call__(self, input_ids, scores, **kwargs):
        self.calls += 1
        return torch.tensor([input_ids.shape[-1] >= self.length])


@pytest.mark.parametrize("k", [1, 4, 8])
def test_stopping_criteria_are_asked_after_every_committed_token(tok, models, k):
    prompt = tok("Once")["input_ids"]
    criterion = AfterTokens(len(prompt) + 7)
    out = generate(models["target"], models["target"], tokenizer=tok, input_ids=prompt, max_new_tokens=30,
                   stopping_criteria=[criterion], num_assistant_tokens_schedule="constant", num_assistant_tokens=k)
    assert len(out.token_ids) == 7 and out.stop_reason == "criteria" and criterion.calls == 7


class Recording:
    def __init__(self):
        self.puts, self.ended = [], False

    def put(self, value):
        assert not self.ended
        self.puts.append(value.tolist())

    def end(self):
        self.ended = True


@pytest.mark.parametrize("helper", ["other", "target"])
def test_a_streamer_sees_the_prompt_then_exactly_the_committed_tokens(tok, models, helper):
    streamer, prompt = Recording(), tok("Once")["input_ids"]
    out = generate(
        models["target"],
        models[helper],
        tokenizer=tok,
        input_ids=prompt,
        max_new_tokens=20,
        schema={"type": "object", "properties": {"a": {"type": "string", "maxLength": 6}}},
        streamer=streamer,
    )
    assert streamer.puts[0] == [prompt] and streamer.ended
    assert [t for put in streamer.puts[1:] for t in put] == out.token_ids
    assert len(streamer.puts) - 1 <= len(out.stats.steps)  # a step's committed run at once
    text = TextIteratorStreamer(tok, skip_prompt=True)
    again = generate(models["target"], models[helper], tokenizer=tok, input_ids=prompt, max_new_tokens=20,
                     streamer=text)
    assert "".join(text) == again.text


def test_a_failing_call_still_ends_its_streamer(tok, models, monkeypatch):
    streamer = Recording()

    def broken(*args, **kwargs):
        raise RuntimeError("boom")
    monkeypatch.setattr(importlib.import_module("assisted.generate"), "_verify", broken)
    with pytest.raises(RuntimeError, match="boom"):
        generate(models["target"], tokenizer=tok, prompt="Once", max_new_tokens=4, streamer=streamer)
    assert streamer.ended


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(num_beams=3), ValueError, "the call sets num_beams=3, which generate() cannot honour"),
        (
            dict(generation_config=GenerationConfig(min_p=0.1)),
            ValueError,
            "generation_config sets min_p=0.1, which generate() cannot honour; pass min_p=None to override it",
        ),
        (
            dict(generation_config={"do_sample": True}),
            TypeError,
            "generation_config must be a transformers.GenerationConfig",
        ),
        (dict(bogus=1), TypeError, "generate() got an unexpected keyword argument 'bogus'"),
        (
            dict(schedule="constant", num_assistant_tokens_schedule="constant"),
            TypeError,
            "pass num_assistant_tokens_schedule",
        ),
        (dict(prompt_lookup_num_tokens=-1), ValueError, "prompt_lookup_num_tokens must be >= 0"),
        (dict(repetition_penalty=1.2, tree=True), ValueError, "tree=True cannot apply logits processors"),
        (dict(logits_processor=BanLastAndPreferParity()), TypeError, "logits_processor must be a list"),
        (dict(stop_strings=[""]), ValueError, "stop_strings must be a non-empty str or a list of them"),
        (dict(streamer=object()), TypeError, "streamer must have put() and end()"),
        (dict(eos_token_id="x"), ValueError, "eos_token_id must be a non-negative int or a list of them"),
        (
            dict(generation_config=GenerationConfig(max_length=2)),
            ValueError,
            "max_length=2 leaves no room after the prompt",
        ),
    ],
)
def test_options_that_cannot_be_honoured_are_refused_before_any_model_call(tok, models, kwargs, error, message):
    calls = []
    hook = models["target"].register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        with pytest.raises(error) as raised:
            generate(models["target"], models["other"], tokenizer=tok, prompt="Once upon", **kwargs)
    finally:
        hook.remove()
    assert message in str(raised.value) and calls == []


def test_deprecated_names_warn_and_keep_their_meaning(tok, models):
    with pytest.warns(DeprecationWarning, match="schedule= is deprecated, use num_assistant_tokens_schedule="):
        old = generate(models["target"], models["other"], tokenizer=tok, prompt="Once", max_new_tokens=12,
                       schedule="constant", prompt_lookup=False)
    new = generate(models["target"], models["other"], tokenizer=tok, prompt="Once", max_new_tokens=12,
                   num_assistant_tokens_schedule="constant", prompt_lookup_num_tokens=0)
    assert old.token_ids == new.token_ids and old.stats.k_trace == new.stats.k_trace

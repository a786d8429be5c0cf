"""generate(prefix_cache=...): reused KV caches give the same greedy output, and prefill only what is new."""

from __future__ import annotations

import pytest

from assisted import PrefixCache, generate
from tests.helpers_models import smollm2_tokenizer, tiny_gpt2, tiny_llama

pytestmark = [pytest.mark.usefixtures("one_thread")]

V = 49152
POINT = {
    "type": "object",
    "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 99}, "tag": {"enum": ["a", "bb"]}},
    "required": ["x", "tag"],
}
INSTRUCTION = "You extract points from text. Answer with one JSON object with keys x and tag. " * 4


@pytest.fixture(scope="module")
def tok():
    return smollm2_tokenizer()


@pytest.fixture(scope="module")
def models():
    return {"llama": tiny_llama(V, seed=0), "other": tiny_llama(V, seed=1, layers=2), "gpt2": tiny_gpt2(V, seed=2)}


DOCUMENTS = ["Document: the point is 12, tag a.", "Document: x equals 7.", "Document: bb at 40.", "Totally different."]


@pytest.mark.parametrize(
    "pair, constraint",
    [
        (("llama", None), {"schema": POINT}),
        (("llama", "other"), {"schema": POINT}),
        (("gpt2", "gpt2"), {}),
        (("llama", "llama"), {"regex": "[a-z ]{5,30}"}),
    ],
)
@pytest.mark.parametrize("coalesce", [True, False])
def test_greedy_output_is_the_same_with_and_without_reuse(tok, models, plain_reference, pair, constraint, coalesce):
    target, assistant = models[pair[0]], models.get(pair[1])
    cache = PrefixCache()
    for i, document in enumerate(DOCUMENTS):
        prompt = (INSTRUCTION if i < 3 else "") + document
        kw = dict(
            tokenizer=tok, prompt=prompt, max_new_tokens=20, coalesce=coalesce, schedule="heuristic", **constraint
        )
        plain = generate(target, assistant, **kw)
        assert plain.token_ids == plain_reference(target, **kw).token_ids
        reused = generate(target, assistant, prefix_cache=cache, **kw)
        assert reused.token_ids == plain.token_ids and reused.stop_reason == plain.stop_reason
        n = len(tok(prompt)["input_ids"])
        assert plain.stats.prefill_tokens == n
        if i in (1, 2):  # the instruction came from the previous call's cache
            assert reused.stats.prefill_tokens < n - len(tok(INSTRUCTION)["input_ids"]) + 3
        else:  # first call, or nothing shared
            assert reused.stats.prefill_tokens == n
        assert len(cache) == 1


def test_a_repeated_prompt_and_a_continuation_reuse_all_but_the_last_token(tok, models, plain_reference):
    model, cache = models["llama"], PrefixCache()
    ids = tok(INSTRUCTION)["input_ids"]
    first = generate(model, tokenizer=tok, input_ids=ids, max_new_tokens=12, prefix_cache=cache)
    again = generate(model, tokenizer=tok, input_ids=ids, max_new_tokens=12, prefix_cache=cache)
    assert again.token_ids == first.token_ids and again.stats.prefill_tokens == 1
    assert first.token_ids == plain_reference(model, tokenizer=tok, input_ids=ids, max_new_tokens=12).token_ids
    longer = ids + first.token_ids[:-1]  # a continuation: the cache also holds the previous output
    plain = plain_reference(model, tokenizer=tok, input_ids=longer, max_new_tokens=8)
    cont = generate(model, tokenizer=tok, input_ids=longer, max_new_tokens=8, prefix_cache=cache)
    assert cont.token_ids == plain.token_ids and cont.stats.prefill_tokens <= 2


def test_entries_belong_to_their_models_and_the_store_is_bounded(tok, models):
    cache = PrefixCache(capacity=2)
    kw = dict(tokenizer=tok, prompt=INSTRUCTION, max_new_tokens=4, prefix_cache=cache)
    generate(models["llama"], **kw)
    n = generate(models["gpt2"], **kw).stats.prefill_tokens  # another model: nothing to reuse
    assert n == len(tok(INSTRUCTION)["input_ids"])
    assert generate(models["llama"], models["other"], **kw).stats.prefill_tokens == n  # another pair
    assert len(cache) == 2
    assert generate(models["llama"], models["other"], **kw).stats.prefill_tokens == 1
    cache.clear()
    assert len(cache) == 0


@pytest.mark.parametrize("kwargs", [{"capacity": 0}, {"capacity": 1.5}, {"min_tokens": 0}])
def test_bad_settings_are_refused(kwargs):
    with pytest.raises(ValueError):
        PrefixCache(**kwargs)


def test_prefix_cache_must_be_a_prefix_cache(tok, models):
    with pytest.raises(TypeError, match="prefix_cache"):
        generate(models["llama"], tokenizer=tok, prompt="x", max_new_tokens=2, prefix_cache={})

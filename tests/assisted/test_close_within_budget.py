"""close_within_budget: every output validates for every budget at or above the shortest completion, greedy and
sampled, with and without an assistant, in generate, generate_batch and the logits processor; greedy output equals the
budget-aware plain reference (tests/helpers_reference.py with `close_within_budget=True`), sampled output has its
distribution; the option off changes nothing.

Tiny random Llama models over SmolLM2's tokenizer (their JSON strings run on until a budget cuts them: the case the
option is for), and over an 8-token vocabulary for exact distributions.
"""

from __future__ import annotations

import json
from collections import Counter

import jsonschema
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fsm
from assisted import generate, generate_batch, logits_processor
from assisted.cli import decoding_of, parse_args
from tests.assisted.test_acceptance import compare, sampling_noise_tv
from tests.assisted.test_generate_sampling import PROMPT, matches
from tests.drafting.test_sampling import hf_probs
from tests.helpers_models import smollm2_tokenizer, tiny_llama, tiny_tokenizer
from tests.helpers_reference import plain_decode, plain_distribution

pytestmark = [pytest.mark.usefixtures("one_thread")]

V = 49152
ITEM = {"type": "object", "properties": {"name": {"type": "string"}, "qty": {"type": "integer", "minimum": 1},
                                         "tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["name", "qty"]}
REGEX = r"(yes|no)\. [a-z]{2,}!"
CONSTRAINTS = {"schema": {"schema": ITEM}, "regex": {"regex": REGEX}}


@pytest.fixture(scope="module")
def tok():
    return smollm2_tokenizer()


@pytest.fixture(scope="module")
def models():
    return {"target": tiny_llama(V, seed=0), "other": tiny_llama(V, seed=1, layers=2)}


def shortest(tok, constraint) -> int:
    guide = fsm.Guide.from_schema(ITEM, tok) if constraint == "schema" else fsm.Guide.from_regex(REGEX, tok)
    return guide.shortest_completion()


def assert_complete(out, constraint, budget):
    assert len(out.token_ids) <= budget and out.stop_reason in ("closed", "eos", "final")
    if constraint == "schema":
        jsonschema.validate(out.value, ITEM)
    else:
        assert fsm.compile_regex(REGEX).fullmatch(out.text.encode())


@settings(max_examples=12)
@given(above=st.integers(0, 30), constraint=st.sampled_from(list(CONSTRAINTS)), coalesce=st.booleans(),
       assistant=st.sampled_from([None, "other", "target"]))
def test_greedy_output_is_the_budget_aware_reference_and_closes(tok, models, above, constraint, coalesce, assistant):
    budget = shortest(tok, constraint) + above
    ids = tok("Describe an item:")["input_ids"]
    kw = dict(tokenizer=tok, input_ids=ids, max_new_tokens=budget, coalesce=coalesce, close_within_budget=True,
              num_assistant_tokens_schedule="heuristic", **CONSTRAINTS[constraint])
    out = generate(models["target"], models.get(assistant), **kw)
    ref, reason = plain_decode(models["target"], tok, ids, budget, coalesce=coalesce, close_within_budget=True,
                               **CONSTRAINTS[constraint])
    assert out.token_ids == ref
    assert out.stop_reason == (reason if not out.stats.budget_tightened else "closed")
    assert_complete(out, constraint, budget)


@pytest.mark.parametrize("constraint", list(CONSTRAINTS))
def test_without_the_option_the_budget_cuts_and_with_it_the_output_closes(tok, models, constraint):
    budget = shortest(tok, constraint) + 4
    kw = dict(tokenizer=tok, prompt="Describe an item:", max_new_tokens=budget, **CONSTRAINTS[constraint])
    cut = generate(models["target"], **kw)
    assert cut.stop_reason == "length" and cut.value is None and cut.stats.budget_tightened == 0
    closed = generate(models["target"], **kw, close_within_budget=True)
    assert closed.stop_reason == "closed" and closed.stats.budget_tightened > 0
    assert_complete(closed, constraint, budget)
    prefix = next(i for i, (a, b) in enumerate(zip(cut.token_ids, closed.token_ids)) if a != b)
    assert prefix > 0  # the same tokens until the budget first binds


@pytest.mark.parametrize("coalesce", [True, False])
def test_the_option_off_changes_nothing(tok, models, coalesce):
    kw = dict(tokenizer=tok, prompt="Describe an item:", max_new_tokens=40, schema=ITEM, coalesce=coalesce)
    default, off = generate(models["target"], **kw), generate(models["target"], **kw, close_within_budget=False)
    assert (default.token_ids, default.stop_reason) == (off.token_ids, off.stop_reason)
    assert off.stats.budget_tightened == 0
    loose = generate(models["target"], **{**kw, "max_new_tokens": 400}, close_within_budget=True)
    plain = generate(models["target"], **{**kw, "max_new_tokens": 400})
    if plain.stop_reason != "length":  # a loose budget that the object never approaches does not bind
        assert loose.token_ids == plain.token_ids and loose.stats.budget_tightened == 0


@pytest.mark.parametrize("assistant", [None, "other"])
def test_sampled_outputs_close_at_every_budget(tok, models, assistant):
    low = shortest(tok, "schema")
    for seed, above in enumerate([0, 1, 3, 7, 15, 30]):
        out = generate(models["target"], models.get(assistant), tokenizer=tok, prompt="An item:", schema=ITEM,
                       max_new_tokens=low + above, do_sample=True, temperature=1.5, seed=seed,
                       close_within_budget=True)
        assert_complete(out, "schema", low + above)


@pytest.mark.parametrize("assistant", [None, "other"])
def test_batch_rows_equal_generate_alone_and_close(tok, models, assistant):
    budget = shortest(tok, "schema") + 6
    prompts = ["Describe an item:", "An item", "Here is a longer prompt that asks for an item, please:"]
    kw = dict(tokenizer=tok, schema=ITEM, max_new_tokens=budget, close_within_budget=True,
              num_assistant_tokens_schedule="heuristic")
    rows = generate_batch(models["target"], models.get(assistant), prompts=prompts, batch_size=2, **kw)
    for prompt, row in zip(prompts, rows):
        alone = generate(models["target"], tokenizer=tok, input_ids=tok(prompt)["input_ids"], schema=ITEM,
                         max_new_tokens=budget, close_within_budget=True)
        assert (row.token_ids, row.stop_reason) == (alone.token_ids, alone.stop_reason)
        assert row.stats.budget_tightened == alone.stats.budget_tightened
        assert_complete(row, "schema", budget)


@pytest.mark.parametrize("assistant", [None, "other"])
def test_sampled_batch_rows_close_and_draw_as_generate_alone(tok, models, assistant):
    low = shortest(tok, "schema")
    prompts = ["Describe an item:", "An item", "Another item, please:", "Item:"]
    for above in (0, 9):
        kw = dict(tokenizer=tok, schema=ITEM, max_new_tokens=low + above, close_within_budget=True, do_sample=True,
                  temperature=1.5, num_assistant_tokens_schedule="heuristic")
        rows = generate_batch(models["target"], models.get(assistant), prompts=prompts, batch_size=3,
                              seed=list(range(len(prompts))), **kw)
        for seed, (prompt, row) in enumerate(zip(prompts, rows)):
            assert_complete(row, "schema", low + above)
            alone = generate(models["target"], models.get(assistant), input_ids=tok(prompt)["input_ids"], seed=seed,
                             **kw)
            assert row.token_ids == alone.token_ids


def test_a_budget_below_the_shortest_completion_is_refused(tok, models):
    low = shortest(tok, "schema")
    kw = dict(tokenizer=tok, schema=ITEM, close_within_budget=True)
    with pytest.raises(ValueError, match=f"max_new_tokens={low - 1} .* takes {low} tokens"):
        generate(models["target"], prompt="Hi", max_new_tokens=low - 1, **kw)
    assert generate(models["target"], prompt="Hi", max_new_tokens=low, **kw).value is not None
    rows = generate_batch(models["target"], prompts=["Hi", "Hello"], max_new_tokens=low - 1, **kw)
    assert all(r.stop_reason == "error" and "close_within_budget" in r.error for r in rows)
    with pytest.raises(ValueError, match="needs a schema or a regex"):
        generate(models["target"], tokenizer=tok, prompt="Hi", max_new_tokens=5, close_within_budget=True)
    with pytest.raises(TypeError, match="close_within_budget"):
        generate(models["target"], tokenizer=tok, prompt="Hi", schema=ITEM, close_within_budget="yes")


def test_the_logits_processor_closes_model_generate(tok, models):
    budget = shortest(tok, "schema") + 5
    proc = logits_processor(tok, schema=ITEM, close_within_budget=True, max_new_tokens=budget)
    enc = tok(["Describe an item:"], return_tensors="pt")
    out = models["target"].generate(**enc, logits_processor=[proc], max_new_tokens=budget, do_sample=False,
                                    pad_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id)
    new = out[0, enc["input_ids"].shape[1]:].tolist()
    ours = generate(models["target"], tokenizer=tok, input_ids=enc["input_ids"][0].tolist(), schema=ITEM,
                    max_new_tokens=budget, close_within_budget=True, coalesce=False)
    assert new[: len(ours.token_ids)] == ours.token_ids
    assert ours.value is not None
    with pytest.raises(ValueError, match="needs max_new_tokens"):
        logits_processor(tok, schema=ITEM, close_within_budget=True)


def test_the_logits_processor_closes_under_assisted_sampling(tok, models):
    """transformers' own assisted generation calls the processor for rejected positions and for the assistant's
    drafts: each row's budget comes from its own length, so every output still closes."""
    budget = shortest(tok, "schema") + 3
    proc = logits_processor(tok, schema=ITEM, close_within_budget=True, max_new_tokens=budget)
    enc = tok(["Describe an item:"], return_tensors="pt")
    for seed in range(3):
        torch.manual_seed(seed)
        out = models["target"].generate(**enc, logits_processor=[proc], max_new_tokens=budget, do_sample=True,
                                        temperature=1.5, assistant_model=models["other"],
                                        pad_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id)
        new = [t for t in out[0, enc["input_ids"].shape[1]:].tolist() if t != tok.eos_token_id]
        jsonschema.validate(json.loads(tok.decode(new)), ITEM)


def test_the_cli_passes_the_option():
    args = parse_args(["generate", "--model", "m", "--regex", "a+", "--prompt", "x", "--close-within-budget"])
    assert decoding_of(args)["close_within_budget"] is True
    args = parse_args(["generate", "--model", "m", "--regex", "a+", "--prompt", "x"])
    assert "close_within_budget" not in decoding_of(args)


# ----------------------------------------------------------------- exact distributions on an 8-token vocabulary

OPEN = r"(a|b|ab)(c|d|cd|ba)+"  # no end of its own: a budget of 4 cuts most plain samples


@pytest.fixture(scope="module")
def tiny():
    return tiny_tokenizer(), tiny_llama(8, seed=3, hidden=16, init=0.3, eos=0), tiny_llama(8, seed=0, hidden=16,
                                                                                            init=0.3, eos=0)


@pytest.mark.parametrize("assistant, coalesce", [(False, True), (True, False), (True, True)])
def test_sampling_has_the_budget_aware_reference_distribution(tiny, assistant, coalesce):
    tok, target, helper = tiny

    def probs(logits, mask):
        return hf_probs(logits, mask, temperature=1.3)

    expected = plain_distribution(target, tok, PROMPT, 4, probs, regex=OPEN, coalesce=coalesce,
                                  close_within_budget=True)
    unaware = plain_distribution(target, tok, PROMPT, 4, probs, regex=OPEN, coalesce=coalesce)
    cells = set(expected) | set(unaware)
    assert 0.5 * sum(abs(expected.get(c, 0) - unaware.get(c, 0)) for c in cells) > 0.1  # the budget does change it
    draws = 1200
    counts = Counter(tuple(generate(target, helper if assistant else None, tokenizer=tok, input_ids=PROMPT, regex=OPEN,
                                    max_new_tokens=4, do_sample=True, temperature=1.3, seed=seed, coalesce=coalesce,
                                    num_assistant_tokens=2, num_assistant_tokens_schedule="constant",
                                    close_within_budget=True).token_ids) for seed in range(draws))
    ok, numbers = matches(counts, expected, draws)
    assert ok, numbers
    p_value, tv = compare(counts, expected, draws)
    assert tv < 1.5 * sampling_noise_tv(expected, draws)

"""Guides that close within a token budget (`Guide.within`, fsm/closing.py): every walk under the budget's masks
ends complete, whatever the budget at or above the shortest completion, the schema, the tokenizer and the tokens
chosen; the mask is never empty; without a budget nothing changes."""

from __future__ import annotations

import json
import random

import jsonschema
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fsm
from fsm.closing import UNREACHABLE, shortest
from tests.fsm_walk import distances_to_accept
from tests.helpers_models import tiny_tokenizer

SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10}, "age": {"type": "integer"},
                                      "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
     "required": ["name", "age"]},
    {"type": "object", "properties": {"a": {"type": "string", "pattern": "^[a-z]+$", "not": {"const": "ab"}},
                                      "b": {"enum": ["x", "yy", "zzz"]}}, "required": ["a"]},
    {"type": "object", "properties": {"x": {"type": "number", "minimum": 5},
                                      "y": {"oneOf": [{"type": "string", "minLength": 3}, {"type": "integer"}]}},
     "required": ["x", "y"]},
    {"type": "array", "items": {"type": "object", "properties": {"sku": {"type": "string", "minLength": 2},
                                                                 "qty": {"type": "integer", "minimum": 1}},
                                "required": ["sku", "qty"]}, "minItems": 1},
]
FIELD_TYPES = [{"type": "string"}, {"type": "integer"}, {"type": "number"}, {"type": "boolean"},
               {"enum": ["red", "green", "blue"]}, {"type": "string", "maxLength": 5},
               {"type": "array", "items": {"type": "integer"}}, {"type": "string", "format": "date"}]


@st.composite
def schemas(draw):
    """A random object schema: 1-4 fields of the kinds above, some required, in either policy."""
    n = draw(st.integers(1, 4))
    names = [f"field_{i}" for i in range(n)]
    props = {name: draw(st.sampled_from(FIELD_TYPES)) for name in names}
    required = [name for name in names if draw(st.booleans())]
    return {"type": "object", "properties": props, "required": required}


def walk(guide: fsm.Guide, rng: random.Random, take_forced: bool) -> list[int]:
    """Random allowed tokens (sometimes a whole forced run) until EOS or the budget; asserts the mask is never
    empty and every advance fits."""
    ids = []
    while guide.left > 0:
        allowed = np.flatnonzero(guide.mask().numpy())
        assert len(allowed), f"empty mask in state {guide.state} with {guide.left} tokens left"
        run = guide.forced() if take_forced and rng.random() < 0.5 else []
        for token in run or [int(rng.choice(allowed))]:
            if token in guide.eos_token_ids:
                return ids
            guide.advance(token)
            ids.append(token)
    return ids


def assert_closes(schema, tokenizer, budget_above: int, seed: int, policy: str = "compact") -> None:
    guide = fsm.Guide.from_schema(schema, tokenizer, policy=policy)
    budget = guide.shortest_completion() + budget_above
    within = guide.within(budget)
    assert within.fits()
    rng = random.Random(seed)
    ids = walk(within, rng, take_forced=seed % 2 == 0)
    assert within.is_final() and len(ids) <= budget
    spelled = b"".join(guide.index.vocabulary.token_bytes[i] for i in ids).decode("utf-8")
    jsonschema.validate(json.loads(spelled), schema)


@settings(max_examples=25)
@given(schema=st.sampled_from(SCHEMAS), above=st.integers(0, 20), seed=st.integers(0, 10**6),
       policy=st.sampled_from(["compact", "spec"]))
def test_every_walk_under_the_budget_closes_valid(smol_tokenizer, schema, above, seed, policy):
    assert_closes(schema, smol_tokenizer, above, seed, policy)


@settings(max_examples=25)
@given(schema=schemas(), above=st.integers(0, 12), seed=st.integers(0, 10**6))
def test_random_schemas_close_valid(smol_tokenizer, schema, above, seed):
    assert_closes(schema, smol_tokenizer, above, seed)


@settings(max_examples=10)
@given(schema=st.sampled_from(SCHEMAS), above=st.integers(0, 10), seed=st.integers(0, 10**6))
def test_byte_fallback_vocabularies_close_valid(sentencepiece_tokenizer, schema, above, seed):
    assert_closes(schema, sentencepiece_tokenizer, above, seed)


@pytest.mark.parametrize("regex", [r"(ab|cd){2,4}c?", r"(a|b|ab)(c|d|cd|ba)+", r"a{3,}(cd)*b"])
def test_every_token_path_under_every_budget_ends_complete(regex):
    """Exhaustive on an 8-token vocabulary: all paths the budget's masks allow, for every budget that fits."""
    guide = fsm.Guide.from_regex(regex, tiny_tokenizer())
    tried = 0
    for budget in range(0, 9):
        root = guide.within(budget)
        if not root.fits():
            assert budget < guide.shortest_completion()
            continue
        stack = [root]
        while stack:
            g = stack.pop()
            allowed = g.allowed()
            assert allowed or g.left == 0, (budget, g.state)
            if g.left == 0:
                assert g.is_final()
            for token in allowed:
                if token in g.eos_token_ids:
                    assert g.is_final()
                    continue
                after = g.copy()
                after.advance(token)
                stack.append(after)
        tried += 1
    assert tried >= 5


@pytest.mark.parametrize("regex", [r"[a-z]{2,5}@(x|yy)\.com", r"(foo|ba(r|z))+!", r"\d{3}-\d{2,}"])
def test_byte_distances_are_the_shortest_paths(smol_tokenizer, regex):
    """`byte_distance` (witnesses and searches over terms) against a relaxation over the whole DFA, and the token
    distance never above it."""
    guide = fsm.Guide.from_regex(regex, smol_tokenizer)
    exact = distances_to_accept(guide.index.dfa)
    closing = guide.index.closing
    for state in range(guide.index.dfa.n_states):
        expected = int(exact[state]) if exact[state] < np.iinfo(np.int32).max else UNREACHABLE
        assert closing.byte_distance(state) == expected
        assert closing.distance(state) <= expected


def test_searches_through_complements_find_the_shortest():
    term = fsm.rx.inter(fsm.rx.star(fsm.rx.byte_range(ord("a"), ord("c"))),
                        fsm.rx.complement(fsm.rx.alt(fsm.rx.EPSILON, fsm.rx.literal("a"), fsm.rx.literal("b"))))
    assert shortest(term, fsm.rx.ALL_BYTES) == 1  # "c"
    assert shortest(term, 1 << ord("a") | 1 << ord("b")) == 2  # "aa" without "c"
    assert shortest(fsm.rx.literal("xyz"), 1 << ord("x")) == UNREACHABLE


def test_forced_text_counts_in_tokens_not_bytes(smol_tokenizer):
    """`{"name":"` is forced: its fewest tokens, not its bytes, are what the budget must leave."""
    guide = fsm.Guide.from_schema({"type": "object", "properties": {"name": {"type": "string"}},
                                   "required": ["name"]}, smol_tokenizer)
    text = b'{"name":""}'
    assert guide.shortest_completion() < len(text)
    assert not guide.within(guide.shortest_completion() - 1).fits() and guide.within(guide.shortest_completion()).fits()


def test_without_a_budget_nothing_changes(smol_tokenizer):
    guide = fsm.Guide.from_schema(SCHEMAS[0], smol_tokenizer)
    loose = guide.within(10_000)
    for _ in range(6):
        assert guide.mask() is loose.mask() and guide.within(None).mask() is guide.mask()  # the same tensors
        assert guide.forced() == loose.forced() and not loose.binds()
        token = (guide.forced() or guide.allowed())[0]
        guide.advance(token)
        loose.advance(token)
    assert loose.left == 10_000 - 6 and guide.left is None


def test_a_token_that_does_not_fit_is_refused(smol_tokenizer):
    guide = fsm.Guide.from_regex(r"x(a+|bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb)", smol_tokenizer).within(3)
    guide.advance(smol_tokenizer.convert_tokens_to_ids("x"))
    b = smol_tokenizer.convert_tokens_to_ids("b")
    assert guide.binds() and not guide.mask()[b] and guide.index.info(guide.state).mask[b]
    with pytest.raises(fsm.InvalidTokenError, match="no valid completion"):
        guide.advance(b)
    assert guide.mask()[smol_tokenizer.convert_tokens_to_ids("a")]


def test_forced_runs_stop_where_the_budget_does_not_allow_them(smol_tokenizer):
    guide = fsm.Guide.from_schema(SCHEMAS[0], smol_tokenizer)
    budget = guide.within(guide.shortest_completion())
    full = guide.forced()
    assert budget.forced() == full[: len(budget.forced())]
    walkable = budget.copy()
    for token in budget.forced():
        assert walkable.mask()[token]
        walkable.advance(token)


def test_within_checks_its_argument(smol_tokenizer):
    guide = fsm.Guide.from_regex("ab", smol_tokenizer)
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(ValueError, match="tokens left"):
            guide.within(bad)
    assert isinstance(guide.within(0).mask(), torch.Tensor)

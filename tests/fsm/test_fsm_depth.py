"""Values at any depth: free-form values and recursive `$ref`s are rules that call themselves (`rx.Rule`), so a
guide accepts every nesting depth the schema allows and rejects an invalid value at every depth."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest

import fsm
from fsm import json_terms as jt
from fsm import rx

DEPTH = 20
TREE = {  # a comment tree: each node holds its replies
    "type": "object",
    "properties": {"text": {"type": "string", "maxLength": 8}, "replies": {"type": "array", "items": {"$ref": "#"}}},
    "required": ["text"],
    "additionalProperties": False,
}
LINKED = {  # a linked list through $defs, with an open object (spec: undeclared keys) on the way
    "$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"}, "next": {"$ref": "#/$defs/node"}},
                       "required": ["v"]}},
    "$ref": "#/$defs/node",
}
MUTUAL = {  # two definitions that call each other
    "$defs": {"a": {"type": "array", "items": {"$ref": "#/$defs/b"}, "maxItems": 2},
              "b": {"anyOf": [{"type": "integer"}, {"type": "object", "properties": {"a": {"$ref": "#/$defs/a"}},
                                                     "additionalProperties": False}]}},
    "$ref": "#/$defs/a",
}


def compact(value) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def free_form(depth: int, inner="leaf"):
    """A value nested `depth` deep, arrays and objects in turn, with `inner` at the bottom."""
    for level in range(depth):
        inner = [inner, level, None] if level % 2 else {"k": inner, "n": level, "s": "é"}
    return inner


def tree(depth: int, leaf=None):
    node = leaf if leaf is not None else {"text": "leaf"}
    for level in range(depth):
        node = {"text": str(level), "replies": [node, {"text": "x"}]}
    return node


def linked(depth: int, leaf=None):
    node = leaf if leaf is not None else {"v": 0}
    for level in range(depth):
        node = {"v": level, "next": node}
    return node


def mutual(depth: int, leaf=1):
    node = [leaf]
    for _ in range(depth):
        node = [{"a": node}, 3]
    return node


INVALID_LEAVES = {  # schema, builder, invalid values put at the bottom
    "tree": (TREE, tree, [{"text": 1}, {"replies": []}, {"text": "a", "extra": 1}, {"text": "too long text"}]),
    "linked": (LINKED, linked, [{"v": "1"}, {"next": {"v": 1}}, {"v": 1.5}]),
    "mutual": (MUTUAL, mutual, [[1, 2, 3], {"b": []}, "s"]),
}


@pytest.mark.parametrize("policy", ["compact", "spec"])
def test_free_form_values_at_every_depth(policy):
    term = fsm.compile_schema({}, policy=policy)
    for depth in range(DEPTH + 1):
        text = compact(free_form(depth))
        assert rx.matches(term, text), depth
        bad = text.replace('"leaf"', '"leaf",')  # a trailing comma at the bottom
        assert not rx.matches(term, bad), depth
        assert not rx.matches(term, text[:-1]) and not rx.matches(term, text + "]"), depth


@pytest.mark.parametrize("policy", ["compact", "spec"])
@pytest.mark.parametrize("name", sorted(INVALID_LEAVES))
def test_recursive_refs_at_every_depth(name, policy):
    schema, build, bad_leaves = INVALID_LEAVES[name]
    term = fsm.compile_schema(schema, policy=policy)
    validator = jsonschema.Draft202012Validator(schema)
    for depth in range(DEPTH + 1):
        value = build(depth)
        assert validator.is_valid(value) and rx.matches(term, compact(value)), (depth, value)
        for leaf in bad_leaves:
            wrong = build(depth, leaf)
            assert not validator.is_valid(wrong) and not rx.matches(term, compact(wrong)), (depth, wrong)


def test_free_form_values_inside_a_declared_object():
    schema = {"type": "object", "properties": {"meta": {"type": "object"}}, "required": ["meta"]}
    term = fsm.compile_schema(schema, policy="spec")  # compact closes {"type": "object"} to {}
    assert rx.matches(term, compact({"meta": {"a": [{"x": 1, "y": {}}], "deep": free_form(DEPTH)}}))
    assert not rx.matches(term, compact({"meta": [free_form(DEPTH)]}))


MET = {  # a free-form value (under "free") beside a value that meets another schema, and values invalid there
    "property-and-pattern": (  # "array" and the pattern's {} meet on "x"
        {"patternProperties": {".*": {}}, "properties": {"x": {"type": "array"}}},
        lambda depth: {"x": [free_form(depth)], "y": free_form(depth)}, [{"x": {}}]),
    "two-patterns": (  # two patterns meet on keys starting "ab"
        {"patternProperties": {"^a": {}, "^ab": {"type": "array"}}},
        lambda depth: {"abc": [free_form(depth)], "a": free_form(depth)}, [{"abc": {}}]),
    "pattern-and-bound": (  # "array" from the pattern, maxItems from the property: merged, not intersected
        {"patternProperties": {".*": {"type": "array"}}, "properties": {"x": {"maxItems": 1}}},
        lambda depth: {"x": [free_form(depth)]}, [{"x": [1, 2]}, {"x": {}}]),
}


@pytest.mark.parametrize("name", sorted(MET))
def test_a_value_met_by_another_schema_keeps_free_form_values_at_any_depth(name):
    """Where two schemas meet on one value (a pattern matching a declared key, overlapping patterns, an allOf), the
    value is their merge, or the other one where one is `{}`: a rule's call held under an intersection sent the whole
    schema to the unrolled fallback, and every free-form value lost each depth past 3 (a JSONSchemaBench schema's
    valid instance was rejected)."""
    other, build, wrong_values = MET[name]
    schema = {"properties": {"free": {"type": "object"}, "other": other}}
    term = fsm.compile_schema(schema, policy="spec")
    validator = jsonschema.Draft202012Validator(schema)
    for depth in (4, DEPTH):
        value = {"free": {"k": free_form(depth)}, "other": build(depth)}
        assert validator.is_valid(value) and rx.matches(term, compact(value)), depth
    for wrong in wrong_values:
        assert not validator.is_valid({"other": wrong}) and not rx.matches(term, compact({"other": wrong})), wrong


def test_an_allof_met_again_inside_its_own_merge_is_a_rule():
    """Two lists whose items are the allOf of "object" and a $ref whose target reaches the root: the second list meets
    the allOf while the first one's merge is still being compiled. It is a rule, called there, not an intersection
    that holds the $ref's call (which sent the schema to the unrolled fallback: free-form values past depth 3 lost)."""
    items = {"anyOf": [{"$ref": "#/$defs/node"}], "type": "object"}
    schema = {"$defs": {"node": {"properties": {"up": {"$ref": "#"}}}},
              "properties": {"free": {"type": "object"}, "a": {"type": "array", "items": items},
                             "b": {"type": "array", "items": items, "minItems": 1}}}
    term = fsm.compile_schema(schema, policy="spec")
    validator = jsonschema.Draft202012Validator(schema)
    for depth in (4, DEPTH):
        value = {"a": [{"up": {"b": [{"up": {"free": {"k": free_form(depth)}}}]}}], "free": {"k": free_form(depth)}}
        assert validator.is_valid(value) and rx.matches(term, compact(value)), depth
    for wrong in ({"a": [3]}, {"b": []}, {"a": [{"up": {"b": [[]]}}]}):
        assert not validator.is_valid(wrong) and not rx.matches(term, compact(wrong)), wrong


def test_a_recursion_through_not_is_a_rule():
    """Each level of a recursion through `not` is one negation deeper. Counted up to where negations stop being
    written as cases (every count past it compiles alike), the rules close there: counted without end, each level
    was a new rule until Python's stack ran out, and the schema fell back to depth 3."""
    node = {"type": "object", "properties": {"v": {"type": "integer"}, "next": {"$ref": "#/$defs/node"}},
            "required": ["v"], "not": {"type": "string"}}
    schema = {"$defs": {"node": node}, "$ref": "#/$defs/node"}
    term = fsm.compile_schema(schema, policy="spec")
    validator = jsonschema.Draft202012Validator(schema)
    for value in (linked(DEPTH), linked(DEPTH, leaf={"v": 1, "extra": free_form(DEPTH)})):
        assert validator.is_valid(value) and rx.matches(term, compact(value))
    for wrong in (linked(DEPTH, leaf={"v": "x"}), linked(DEPTH, leaf={})):
        assert not validator.is_valid(wrong) and not rx.matches(term, compact(wrong))


def test_max_recursion_depth_is_an_opt_in_limit():
    bounded = fsm.compile_schema({}, max_recursion_depth=3)
    assert rx.matches(bounded, compact(free_form(3))) and not rx.matches(bounded, compact(free_form(4)))
    bounded_tree = fsm.compile_schema(TREE, max_recursion_depth=2)
    assert rx.matches(bounded_tree, compact(tree(2))) and not rx.matches(bounded_tree, compact(tree(4)))


def test_a_recursion_the_rules_cannot_express_is_unrolled():
    """A $ref reached before any byte (anyOf of itself): as before, with the fallback depth; still valid only."""
    schema = {"anyOf": [{"$ref": "#"}, {"type": "array", "items": {"$ref": "#"}}, {"type": "integer"}]}
    term = fsm.compile_schema(schema)
    assert rx.matches(term, "[[1,[2]],3]") and not rx.matches(term, '["a"]')


def test_rules_are_checked():
    rule = rx.Rule("loop")
    looping = rx.call(rule, plain=True)
    rx.define(rule, rx.alt(looping, rx.literal("x")))  # reaches itself before any byte
    assert rx.check_rule(looping) == "unguarded recursion"
    rule = rx.Rule("endless")
    endless = rx.call(rule, plain=True)
    rx.define(rule, rx.seq(rx.literal("["), endless, rx.literal("]")))  # no finite string
    assert rx.check_rule(endless) == "an empty language"
    with pytest.raises(ValueError):
        rx.define(rule, rx.literal("x"))
    unset = rx.call(rx.Rule("unset"), plain=True)
    with pytest.raises(rx.UndefinedRule):
        rx.derivative(unset, ord("x"))


def test_the_witness_of_a_rule_is_a_shortest_string():
    value = jt.any_value(rx.EPSILON)
    assert rx.witness(value) == b"0"
    assert rx.witness(rx.seq(rx.literal("["), value, rx.literal("]"))) == b"[0]"


def _walk(guide: fsm.Guide, rng: random.Random, steps: int, tokens_of) -> list[int]:
    """Random allowed tokens, preferring those that open a bracket, for `steps` tokens."""
    ids = []
    for _ in range(steps):
        allowed = [t for t in guide.allowed() if t not in guide.eos_token_ids]
        if not allowed:  # complete, only EOS may follow
            break
        opening = [t for t in allowed if tokens_of[t][-1:] in (b"[", b"{")]
        token = rng.choice(opening if opening and rng.random() < 0.6 else allowed)
        guide.advance(token)
        ids.append(token)
    return ids


@pytest.mark.parametrize("schema", [{}, TREE], ids=["free-form", "tree"])
def test_budgeted_walks_close_deep_values_valid(smol_tokenizer, schema):
    """Deep random prefixes, then a random walk under the budget the guide says suffices: always valid JSON."""
    guide = fsm.Guide.from_schema(schema, smol_tokenizer, policy="spec")
    token_bytes = guide.index.vocabulary.token_bytes
    validator = jsonschema.Draft202012Validator(schema)
    for seed in range(3):
        rng = random.Random(seed)
        walk = guide.copy()
        ids = _walk(walk, rng, 60, token_bytes)
        left = walk.shortest_completion()
        walk = walk.within(left)
        while not walk.only_eos_allowed():
            token = rng.choice(walk.allowed())
            if token in walk.eos_token_ids:
                break
            walk.advance(token)
            ids.append(token)
        assert walk.is_final()
        text = b"".join(token_bytes[t] for t in ids).decode()
        assert validator.is_valid(json.loads(text)), text


def test_closing_a_stack_costs_its_depth(smol_tokenizer):
    guide = fsm.Guide.from_schema({}, smol_tokenizer)
    for token in smol_tokenizer.encode("[" * DEPTH, add_special_tokens=False):
        guide.advance(token)
    longest = max(len(b) for b in guide.index.vocabulary.token_bytes if b and set(b) == {ord("]")})
    assert -(-DEPTH // longest) <= guide.shortest_completion() <= DEPTH
    closing = smol_tokenizer.encode("]" * DEPTH, add_special_tokens=False)
    for token in closing:
        guide.advance(token)
    assert guide.is_final() and guide.only_eos_allowed()


def test_forced_tokens_inside_a_deep_tree(smol_tokenizer):
    guide = fsm.Guide.from_schema(TREE, smol_tokenizer)  # compact: "text" first, then "replies"
    prefix = compact(tree(DEPTH))
    prefix = prefix[: prefix.rindex('{"text":"leaf"') + 1]  # the innermost node just opened
    for token in smol_tokenizer.encode(prefix, add_special_tokens=False):
        guide.advance(token)
    forced = smol_tokenizer.decode(guide.forced())
    assert forced == '"text":"'[: len(forced)] and forced
    copy = guide.copy()
    copy.advance(guide.forced()[0])
    assert copy.state != guide.state

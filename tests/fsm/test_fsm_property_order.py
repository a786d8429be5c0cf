"""`property_order="any"`: object members in any order, each declared key at most once, required keys
present, extra keys anywhere — exactly the objects `jsonschema` accepts (walks never repeat a declared key)."""

from __future__ import annotations

import itertools
import json
import random

import jsonschema
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

import fsm
from fsm import rx
from tests.fsm_walk import random_walk, text_of

# name -> (schema, a valid instance whose keys get permuted)
SCHEMAS = {
    "required_optional": (
        {
            "type": "object",
            "properties": {
                "a": {"type": "integer"},
                "b": {"type": "string", "maxLength": 3},
                "c": {"type": "boolean"},
                "d": {"type": "null"},
            },
            "required": ["a", "b"],
        },
        {"a": 1, "b": "xy", "c": True, "d": None},
    ),
    "additional_schema": (
        {
            "type": "object",
            "properties": {"id": {"type": "integer"}, "tag": {"enum": ["u", "v"]}},
            "required": ["id"],
            "additionalProperties": {"type": "boolean"},
        },
        {"id": 7, "tag": "u", "x": True, "yz": False},
    ),
    "nested": (
        {
            "type": "object",
            "properties": {
                "p": {
                    "type": "object",
                    "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                    "required": ["x", "y"],
                },
                "q": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {"k": {"const": 1}, "v": {"type": "string", "maxLength": 2}},
                        "required": ["k"],
                    },
                    "maxItems": 2,
                },
                "r": {"type": "string", "maxLength": 2},
            },
            "required": ["p", "q"],
        },
        {"p": {"y": 2, "x": 1}, "q": [{"v": "s", "k": 1}], "r": "t"},
    ),
    "pattern_properties": (
        {
            "type": "object",
            "properties": {"id": {"type": "integer"}, "x-id": {"type": "boolean"}},
            "required": ["id"],
            "patternProperties": {"^x-": {"type": "boolean"}, "^n_[0-9]$": {"type": "null"}},
            "propertyNames": {"maxLength": 5},
        },
        {"id": 3, "x-id": True, "x-a": False, "n_1": None},
    ),
}


def _text(value) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _validator(schema):
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def _any(schema, **options) -> rx.Rx:
    return fsm.compile_schema(schema, property_order="any", **options)


def _no_duplicate_declared_keys(text: str, schema: dict) -> None:
    """Declared keys occur at most once (extra keys may repeat: a regular language cannot tell them apart)."""
    def check(pairs):
        keys = [k for k, _ in pairs if k in schema["properties"]]
        assert len(keys) == len(set(keys)), f"duplicate keys in {text}"
        return dict(pairs)

    json.loads(text, object_pairs_hook=check)


@pytest.mark.parametrize("name", SCHEMAS)
def test_every_permutation_is_accepted(name):
    schema, instance = SCHEMAS[name]
    term, validator = _any(schema), _validator(schema)
    for keys in itertools.permutations(instance):
        value = {k: instance[k] for k in keys}
        assert validator.is_valid(value)
        assert rx.matches(term, _text(value)), _text(value)


@pytest.mark.parametrize("name", SCHEMAS)
def test_duplicate_and_missing_keys_are_rejected(name):
    schema, instance = SCHEMAS[name]
    term = _any(schema)
    body = _text(instance)[1:-1]
    for key in schema["properties"]:
        if key in instance:  # the same declared member again, before and after the others
            again = _text({key: instance[key]})[1:-1]
            assert not rx.matches(term, "{" + body + "," + again + "}")
            assert not rx.matches(term, "{" + again + "," + body + "}")
    for key in schema["required"]:
        rest = {k: v for k, v in instance.items() if k != key}
        assert not _validator(schema).is_valid(rest)
        for keys in itertools.permutations(rest):
            assert not rx.matches(term, _text({k: rest[k] for k in keys}))


def test_keys_are_recognized_as_keys_not_substrings():
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "string"},
            "s": {"type": "string"},
            "b": {"type": "object", "additionalProperties": {"type": "integer"}},
        },
        "required": ["a"],
    }
    term = _any(schema)
    assert rx.matches(term, '{"b":{"a":1},"a":"x"}')  # "a" inside the nested object is its own key
    assert not rx.matches(term, '{"b":{"a":1}}')  # ... and does not count for the outer object
    assert not rx.matches(term, '{"s":",\\"a\\":\\"x\\"","b":{}}')  # nor does `,"a":"x"` inside a string
    assert rx.matches(term, '{"s":",\\"a\\":\\"x\\"","a":"y"}')
    assert not rx.matches(term, '{"a":"x","s":"y","a":"z"}')


def test_schema_order_stays_the_default():
    schema, instance = SCHEMAS["required_optional"]
    reordered = _text({k: instance[k] for k in reversed(instance)})
    assert not rx.matches(fsm.compile_schema(schema), reordered)
    assert rx.matches(fsm.compile_schema(schema, property_order="schema"), _text(instance))
    assert rx.matches(_any(schema), reordered)


def test_whitespace_between_members():
    schema, _ = SCHEMAS["required_optional"]
    term = _any(schema, whitespace=r"[ \n]?")
    assert rx.matches(term, '{ "c": true, "b": "x", "a": 1 }')
    assert rx.matches(term, '{"b":"x" ,\n"a":1}')
    assert not rx.matches(term, '{ "a": 1, "b": "x", "a": 2 }')


def test_open_objects_put_extra_keys_anywhere():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    term = _any(schema, additional_properties=True)
    assert rx.matches(term, '{"z":[1,{"a":"s"}],"a":1,"y":null}')
    assert not rx.matches(term, '{"z":1,"a":1,"a":2}')
    assert not rx.matches(term, '{"a":"s"}')
    assert not rx.matches(term, '{"z":1}')


# Object keywords that compose by intersection keep working in any order: (schema, accepted, rejected).
KEYWORDS = {
    "min_max_properties": (
        {"type": "object", "properties": {"a": {}, "b": {}, "c": {}}, "minProperties": 2, "maxProperties": 2},
        [{"b": 1, "a": 2}, {"c": 1, "a": 2}],
        [{"a": 1}, {"c": 1, "b": 2, "a": 3}],
    ),
    "dependent_required": (
        {
            "type": "object",
            "properties": {"card": {"type": "string"}, "address": {"type": "string"}},
            "dependentRequired": {"card": ["address"]},
        },
        [{}, {"address": "x"}, {"address": "x", "card": "y"}],
        [{"card": "y"}],
    ),
    "if_then_else": (
        {
            "type": "object",
            "properties": {"kind": {"enum": ["a", "b"]}, "n": {"type": "integer"}},
            "required": ["kind"],
            "if": {"properties": {"kind": {"const": "a"}}, "required": ["kind"]},
            "then": {"required": ["n"]},
            "else": {"not": {"required": ["n"]}},
        },
        [{"n": 1, "kind": "a"}, {"kind": "b"}],
        [{"kind": "a"}, {"n": 1, "kind": "b"}],
    ),
    "all_of": (
        {
            "allOf": [
                {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                {"properties": {"b": {"type": "boolean"}}, "required": ["b"]},
            ]
        },
        [{"b": True, "a": 1}, {"a": 1, "b": False}],
        [{"b": True}, {"b": 1, "a": 1}],
    ),
    "one_of": (
        {
            "oneOf": [
                {"type": "object", "properties": {"k": {"const": 1}, "x": {}}, "required": ["k", "x"]},
                {"type": "object", "properties": {"k": {"const": 2}, "x": {}}, "required": ["k"]},
            ]
        },
        [{"x": 0, "k": 1}, {"k": 2}, {"x": 0, "k": 2}],
        [{"k": 1}, {"x": 0, "k": 3}],
    ),
    "unevaluated_false": (
        {"type": "object", "properties": {"a": {}, "b": {}}, "unevaluatedProperties": False},
        [{"b": 1, "a": 2}],
        [{"c": 1}],
    ),
}


@pytest.mark.parametrize("name", KEYWORDS)
def test_keywords_compose_in_any_order(name):
    schema, accepted, rejected = KEYWORDS[name]
    term, validator = _any(schema), _validator(schema)
    for value in accepted:
        assert validator.is_valid(value), f"{value!r} is invalid: the test itself is wrong"
        assert rx.matches(term, _text(value)), f"should accept {value!r}"
    for value in rejected:
        assert not validator.is_valid(value), f"{value!r} is valid: the test itself is wrong"
        assert not rx.matches(term, _text(value)), f"should reject {value!r}"


def test_unknown_property_order_is_rejected():
    with pytest.raises(fsm.SchemaError, match="property_order"):
        fsm.compile_schema({"type": "object"}, property_order="sorted")
    with pytest.raises(ValueError, match="'schema', 'any'"):
        fsm.compile_with_notes({"type": "object"}, property_order="ANY")


@pytest.mark.parametrize("name", SCHEMAS)
@settings(max_examples=10, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(rng=st.randoms(use_true_random=False))
def test_random_walks_validate_in_any_order(name, rng, smol_tokenizer):
    schema = SCHEMAS[name][0]
    guide = fsm.Guide.from_schema(schema, smol_tokenizer, property_order="any")
    text = text_of(guide, random_walk(guide, rng))
    assert rx.matches(_any(schema), text)
    _validator(schema).validate(json.loads(text))
    _no_duplicate_declared_keys(text, schema)


TYPES = [
    {"type": "integer"},
    {"type": "string", "maxLength": 8},
    {"type": "boolean"},
    {"type": "number"},
    {"type": "array", "items": {"type": "integer"}, "maxItems": 3},
    {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "string"}}, "required": ["x"]},
]
WIDE = {
    "type": "object",
    "properties": {f"field_{i}": TYPES[i % len(TYPES)] for i in range(12)},
    "required": [f"field_{i}" for i in range(0, 12, 2)],
}
WIDE_INSTANCE = {
    "field_0": 1,
    "field_1": "ab",
    "field_2": True,
    "field_3": -1.5,
    "field_4": [1, 2],
    "field_5": {"y": "q", "x": 3},
    "field_6": 20,
    "field_8": False,
    "field_10": [],
    "field_11": {"x": 1},
    "field_9": 0.25,
}


def test_twelve_properties_compile_small_and_walk_through_a_guide(smol_tokenizer):
    """The term's size, not a stopwatch, says the build is cheap: O(n^2) members, not n! orders or 2^n subsets."""
    term = _any(WIDE)
    assert rx.size(term) < 2_000
    keys, rng = list(WIDE_INSTANCE), random.Random(0)
    for _ in range(20):
        rng.shuffle(keys)
        assert rx.matches(term, _text({k: WIDE_INSTANCE[k] for k in keys}))
    assert not rx.matches(term, _text({k: WIDE_INSTANCE[k] for k in keys if k != "field_4"}))

    rng.shuffle(keys)
    text = _text({k: WIDE_INSTANCE[k] for k in keys})
    guide = fsm.Guide.from_schema(WIDE, smol_tokenizer, property_order="any")
    for token in smol_tokenizer.encode(text, add_special_tokens=False):
        guide.advance(token)
    assert guide.is_final()
    assert guide.index.dfa.n_states < 5_000  # only the states the walk (and its tokens) visit


# -- rx.any_order_list: the term behind property_order="any" ---------------------------------------


def _brute_any_order(text: str, required: list[str], optional: list[str], extra: str | None) -> bool:
    """Whether `text` is a non-empty comma list with each required item once, each optional one at most once."""
    items = text.split(",") if text else []
    counted = {i: items.count(i) for i in set(items)}
    known = set(required) | set(optional) | ({extra} if extra else set())
    return (bool(items) and set(items) <= known and all(counted.get(r, 0) == 1 for r in required)
            and all(counted.get(o, 0) <= 1 for o in optional))


@pytest.mark.parametrize("required, optional, extra", [
    (["a", "b"], ["c"], "x"), (["a"], [], None), ([], ["a", "b"], None), ([], [], "x"), (["a", "b", "c"], [], None),
])
def test_any_order_list_is_the_language_of_its_definition(required, optional, extra):
    term = rx.any_order_list([rx.literal(t) for t in required], [rx.literal(t) for t in optional],
                             rx.literal(extra) if extra else rx.NOTHING, rx.literal(","))
    letters = sorted({*required, *optional, *([extra] if extra else [])})
    for n in range(0, 6):
        for items in itertools.product(letters, repeat=n):
            text = ",".join(items)
            assert rx.matches(term, text) == _brute_any_order(text, required, optional, extra), text
    assert rx.is_empty(term) == (not letters)


def _derivative_of(term: rx.Rx, text: str) -> rx.Rx:
    for byte in text.encode():
        term = rx.derivative(term, byte)
    return term


def test_any_order_list_of_intersections_is_the_language_of_its_definition():
    """Items that are not plain (an intersection each): every prefix of a list is non-empty with a witness
    that completes it, and every text is matched as the brute force says (what a non-plain `pick` answers)."""
    words = rx.star(rx.byte_range(ord("a"), ord("z")))
    item = lambda text: rx.inter(rx.literal(text), words)  # noqa: E731
    term = rx.any_order_list([item("a"), item("b")], [item("c")], item("x"), rx.literal(","))
    assert not term.plain
    for n in range(0, 5):
        for items in itertools.product("abcx", repeat=n):
            text = ",".join(items)
            assert rx.matches(term, text) == _brute_any_order(text, ["a", "b"], ["c"], "x"), text
            after = _derivative_of(term, text)
            completable = all(items.count(once) <= 1 for once in "abc")  # the missing required ones can follow
            assert rx.is_empty(after) == (not completable), text
            found = rx.witness(after)
            assert (found is not None) == completable, text
            assert not completable or rx.matches(term, text.encode() + found), text


def test_lists_of_one_object_share_the_derivatives_of_their_items():
    """After different first members, the member being written is one term (`split_pick`'s items), and
    the whole states differ only in the members they still allow."""
    term = rx.any_order_list(
        [rx.literal("k1:1")], [rx.literal("k2:2"), rx.literal("k3:3")], rx.NOTHING, rx.literal(",")
    )
    states = [_derivative_of(term, first + ",k") for first in ("k1:1", "k2:2", "k3:3")]
    splits = [rx.split_pick(state) for state in states]
    assert all(s is not None for s in splits)
    assert splits[0][0] is splits[1][0] is splits[2][0]
    assert len({s[1][0][0].id for s in splits}) == 3  # three owners: the members left differ
    assert rx.matches(states[1], "1:1") and not rx.matches(states[1], "2:2") and rx.matches(states[1], "1:1,k3:3")
    assert rx.matches(states[0], "2:2") and rx.matches(states[0], "3:3,k2:2") and not rx.matches(states[0], "1:1")
    assert rx.unsplit(*splits[2]) is states[2]


def test_a_list_restricted_after_a_member_keeps_its_language():
    """Restricting a derivative (a pick of the items with the owner's holes) restricts its language exactly."""
    from fsm.liveness import restrict

    term = rx.any_order_list([rx.literal("ab"), rx.literal("cd")], [rx.literal("e")], rx.literal("x"), rx.literal(","))
    mask = sum(1 << b for b in b"abcdx,")  # no "e"
    state = _derivative_of(term, "ab,")
    spelled = restrict(state, mask, rx.star(rx.byte_set(mask)), {})
    for text in ("cd", "cd,x", "x,cd", "cd,e", "e,cd", "cd,ab", "x"):
        assert rx.matches(spelled, text) == (rx.matches(state, text) and "e" not in text), text


def test_any_order_list_is_empty_only_when_a_required_item_is():
    never = rx.inter(rx.literal("a"), rx.literal("b"))  # empty, but not by construction
    assert rx.is_empty(rx.any_order_list([never], [rx.literal("c")], rx.NOTHING, rx.literal(",")))
    assert not rx.is_empty(rx.any_order_list([rx.literal("c")], [never], rx.NOTHING, rx.literal(",")))
    with pytest.raises(ValueError, match="empty string"):
        rx.any_order_list([rx.optional(rx.literal("a"))], [], rx.NOTHING, rx.literal(","))


def test_any_order_list_restricted_to_single_byte_tokens_keeps_its_language():
    from fsm.liveness import restrict

    items = [rx.literal("ab"), rx.literal("cd")]
    term = rx.any_order_list(items, [rx.literal("e")], rx.NOTHING, rx.literal(","))
    mask = sum(1 << b for b in b"abcd,")  # no "e"
    spelled = restrict(term, mask, rx.star(rx.byte_set(mask)), {})
    for text in ("ab,cd", "cd,ab", "ab,cd,e", "e,ab,cd", "ab", "ab,ab"):
        assert rx.matches(spelled, text) == (rx.matches(term, text) and "e" not in text), text


def test_spec_objects_need_no_emptiness_search_per_member(monkeypatch, fresh_fsm_caches):
    """The any-order body is plain where its members are: walking a wide object searches for emptiness only
    inside extra keys (undeclared names), never over the members' intersection (work counted, not timed)."""
    searches = []
    real = rx._search_empty
    monkeypatch.setattr(rx, "_search_empty", lambda term, limit: searches.append(term) or real(term, limit))
    term = fsm.compile_schema(WIDE, policy="spec")
    dfa = fsm.regex.dfa_of(term)
    keys = list(WIDE_INSTANCE)
    for shift in range(len(keys)):
        order = keys[shift:] + keys[:shift]
        assert dfa.fullmatch(_text({k: WIDE_INSTANCE[k] for k in order}).encode())
    assert len(searches) < 20, len(searches)  # 2 now; 2,831 as an intersection of one term per member

"""JSON Schema -> rx term -> guide: every walk through the guide is valid JSON under the schema, and
each keyword accepts and rejects instances as `jsonschema` does (or rejects more, never accepts more)."""

from __future__ import annotations

import json
from enum import Enum
from typing import Literal, Optional, Union

import jsonschema
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field

import fsm
from fsm import rx
from tests.fsm_walk import random_walk, text_of


class Character(BaseModel):  # the seed's example (.txt "Coalescence")
    name: str = Field(max_length=10)
    age: int
    armor: Literal["leather", "chainmail", "plate"]
    strength: int


class Color(str, Enum):
    red = "red"
    green = "green"


class Address(BaseModel):
    street: str
    city: str = Field(min_length=2, max_length=20)
    zip_code: Optional[str] = Field(default=None, pattern=r"^[0-9]{5}$")


class Person(BaseModel):
    name: str
    nickname: Optional[str] = None
    age: int = Field(ge=0, le=130)
    height_m: float = Field(gt=0, le=3)
    favorite: Color
    address: Address
    tags: list[str] = Field(default_factory=list, max_length=3)
    contact: Union[int, str]


class Node(BaseModel):
    value: int
    children: list["Node"] = Field(default_factory=list, max_length=2)


SCHEMAS = {
    "character": Character,
    "person": Person,
    "recursive": Node,
    "array_bounds": {
        "type": "array",
        "items": {"type": "integer", "minimum": -5, "maximum": 300},
        "minItems": 2,
        "maxItems": 4,
    },
    "prefix_items": {
        "type": "array",
        "prefixItems": [{"type": "boolean"}, {"type": "null"}],
        "items": {"const": 7},
        "maxItems": 4,
    },
    "enum_any_values": {"enum": [1, "two", None, [3, {"x": True}], {"a": 'é"\\'}, 2.5]},
    "all_optional": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "string"}, "c": {"type": "boolean"}},
    },
    "formats": {
        "type": "object",
        "properties": {
            f: {"type": "string", "format": f}
            for f in ("date", "time", "date-time", "uuid", "email", "uri", "ipv4", "hostname", "ipv6", "duration")
        },
        "required": ["date", "time", "date-time", "uuid", "email", "uri", "ipv4", "hostname", "ipv6", "duration"],
    },
    "string_all_together": {
        "type": "string",
        "minLength": 3,
        "maxLength": 8,
        "pattern": "^[a-z]+[0-9]*$",
        "format": "hostname",
    },
    "unanchored_pattern": {"type": "string", "pattern": "ab|^x", "maxLength": 6},
    "unicode": {
        "type": "object",
        "properties": {"名前": {"type": "string", "maxLength": 4}, "emoji": {"const": "😀 ü"}},
        "required": ["名前", "emoji"],
    },
    "numbers": {
        "type": "object",
        "properties": {
            "i": {"type": "integer", "exclusiveMinimum": -3, "exclusiveMaximum": 1000},
            "n": {"type": "number", "minimum": -2, "maximum": 5},
            "m": {"type": "number", "exclusiveMinimum": 0},
            "free": {"type": "number"},
        },
        "required": ["i", "n", "m", "free"],
    },
    "type_list": {"type": ["string", "integer", "null"], "maxLength": 3, "maximum": 9},
    "any_of_objects": {
        "anyOf": [
            {
                "type": "object",
                "properties": {"kind": {"const": "a"}, "x": {"type": "integer"}},
                "required": ["kind", "x"],
            },
            {"type": "object", "properties": {"kind": {"const": "b"}}, "required": ["kind"]},
        ]
    },
    "one_of_exclusive": {"oneOf": [{"type": "integer"}, {"type": "string", "maxLength": 2}]},
    "all_of_merge": {
        "allOf": [
            {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0}}, "required": ["a"]},
            {"properties": {"a": {"maximum": 10}, "b": {"type": "boolean"}}},
        ]
    },
    "additional_schema": {
        "type": "object",
        "properties": {"id": {"type": "integer"}},
        "required": ["id"],
        "additionalProperties": {"type": "boolean"},
    },
    "ref_defs": {
        "$defs": {"pos": {"type": "integer", "minimum": 1}},
        "type": "object",
        "properties": {"p": {"$ref": "#/$defs/pos"}, "q": {"$ref": "#/$defs/pos"}},
        "required": ["p"],
    },
    "any_value": {},
    "not": {
        "type": "object",
        "properties": {"a": {"not": {"type": "string"}}, "b": {"not": {"enum": [1, "x"]}, "type": "integer"}},
        "required": ["a", "b"],
    },
    "if_then_else": {
        "type": "object",
        "properties": {"kind": {"enum": ["a", "b"]}, "n": {"type": "integer"}},
        "required": ["kind"],
        "if": {"properties": {"kind": {"const": "a"}}, "required": ["kind"]},
        "then": {"required": ["n"]},
        "else": {"not": {"required": ["n"]}},
    },
    "one_of_overlapping": {"oneOf": [{"type": "integer", "maximum": 10}, {"type": "integer", "minimum": 5}]},
    "pattern_properties": {
        "type": "object",
        "properties": {"id": {"type": "integer"}},
        "patternProperties": {"^x-": {"type": "boolean"}, "^n_[0-9]$": {"type": "null"}},
        "propertyNames": {"maxLength": 5},
    },
    "min_max_properties": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "integer"}},
        "minProperties": 2,
        "maxProperties": 2,
    },
    "dependent_required": {
        "type": "object",
        "properties": {"card": {"type": "string"}, "address": {"type": "string"}},
        "dependentRequired": {"card": ["address"]},
    },
    "multiple_of": {
        "type": "object",
        "properties": {
            "i": {"type": "integer", "multipleOf": 7, "maximum": 100},
            "n": {"type": "number", "multipleOf": 5},
        },
        "required": ["i", "n"],
    },
    "contains": {
        "type": "array",
        "items": {"type": "integer", "maximum": 9},
        "contains": {"const": 3},
        "minContains": 1,
        "maxContains": 2,
        "maxItems": 4,
    },
    "unique_enum_items": {"type": "array", "items": {"enum": ["r", "g", "b"]}, "uniqueItems": True},
    "unknown_format_and_annotations": {
        "type": "string",
        "format": "password",
        "x-intellij-html-description": "<b>x</b>",
        "markdownDescription": "m",
        "maxLength": 4,
    },
}


def _validator(schema):
    as_dict = schema.model_json_schema() if isinstance(schema, type) else schema
    cls = jsonschema.validators.validator_for(as_dict, default=jsonschema.Draft202012Validator)
    return cls(as_dict, format_checker=cls.FORMAT_CHECKER)


def _text(value) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _matches(schema, text: str, **options) -> bool:
    return rx.matches(fsm.compile_schema(schema, **options), text)


@pytest.mark.parametrize("name", SCHEMAS)
# shrinking walks is slow
@settings(max_examples=15, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(rng=st.randoms(use_true_random=False))
def test_random_walks_validate(name, rng, smol_tokenizer):
    schema = SCHEMAS[name]
    guide = fsm.Guide.from_schema(schema, smol_tokenizer)
    tokens = random_walk(guide, rng)
    text = text_of(guide, tokens)
    assert _matches(schema, text)
    _validator(schema).validate(json.loads(text))


# Per keyword: (schema, instances the term accepts, instances it rejects). Accepted ones must be valid
# for jsonschema; rejected ones are invalid for it unless listed as a documented over-restriction.
KEYWORDS = {
    "not": ({"not": {"type": ["string", "null"]}}, [1, [], {}, True], ["s", None]),
    "not_enum": ({"type": "integer", "not": {"enum": [1, 2]}}, [0, 3, -1], [1, 2]),
    "not_required": (
        {"type": "object", "properties": {"a": {}, "b": {}}, "not": {"required": ["a", "b"]}},
        [{}, {"a": 1}, {"b": 2}],
        [{"a": 1, "b": 2}],
    ),
    "if_then_else": (
        {"if": {"type": "integer"}, "then": {"minimum": 5}, "else": {"type": "string"}},
        [5, 7, "x"],
        [4, None, 1.5],
    ),
    "one_of_overlap": (
        {"oneOf": [{"type": "integer", "maximum": 10}, {"type": "integer", "minimum": 5}]},
        [4, 11, -3],
        [5, 7, 10],
    ),
    "one_of_types": ({"oneOf": [{"type": "integer"}, {"type": "number", "minimum": 0}]}, [-1, 1.5], [1, 0, -1.5]),
    "pattern_properties": (
        {"type": "object", "patternProperties": {"^x-": {"type": "integer"}}, "additionalProperties": False},
        [{}, {"x-a": 1}, {"x-a": 1, "x-b": 2}],
        [{"x-a": "s"}, {"y": 1}],
    ),
    "property_names": (
        {"type": "object", "additionalProperties": {"type": "integer"}, "propertyNames": {"pattern": "^[a-z]+$"}},
        [{"ab": 1}],
        [{"A": 1}, {"a1": 2}],
    ),
    "min_properties": (
        {"type": "object", "properties": {"a": {}, "b": {}}, "minProperties": 1},
        [{"a": 1}, {"b": 2}, {"a": 1, "b": 2}],
        [{}],
    ),
    "max_properties": (
        {"type": "object", "properties": {"a": {}, "b": {}}, "maxProperties": 1},
        [{}, {"a": 1}],
        [{"a": 1, "b": 2}],
    ),
    "min_properties_extra": ({"type": "object", "additionalProperties": True, "minProperties": 1}, [{"k": 1}], [{}]),
    "dependent_required": (
        {"type": "object", "properties": {"a": {}, "b": {}}, "dependentRequired": {"a": ["b"]}},
        [{}, {"b": 1}, {"a": 1, "b": 1}],
        [{"a": 1}],
    ),
    "dependencies_schema": (
        {
            "$schema": "http://json-schema.org/draft-07/schema#",
            "type": "object",
            "properties": {"a": {}, "b": {"type": "integer"}},
            "dependencies": {"a": {"required": ["b"], "properties": {"b": {"minimum": 3}}}},
        },
        [{}, {"b": 1}, {"a": 1, "b": 3}],
        [{"a": 1}, {"a": 1, "b": 2}],
    ),
    "multiple_of_int": ({"type": "integer", "multipleOf": 3}, [0, 3, -6, 99], [1, 100, -4]),
    "multiple_of_number": ({"type": "number", "multipleOf": 4}, [8, 8.0, -12, 0], [2, 8.5, 9]),
    "multiple_of_fraction_on_integers": ({"type": "integer", "multipleOf": 0.5}, [1, 7], [1.5]),
    "not_multiple_of": ({"type": "integer", "not": {"multipleOf": 3}}, [1, 2, -4], [0, 3, -6]),
    "multiple_of_binary_fraction": ({"type": "number", "multipleOf": 2.5}, [0, 2.5, -7.5, 10, 12.50], [1, 2.4, 3.75]),
    "allof_additional_schema": (
        {"allOf": [{"properties": {"a": {}}, "additionalProperties": {"type": "integer"}}, {"properties": {"b": {}}}]},
        [{"b": 1}, {"a": "s"}],
        [{"b": "s"}],
    ),
    "pattern_properties_python_semantics": (
        {
            "type": "object",
            "patternProperties": {"^\\w+$": {"type": "integer"}},
            "additionalProperties": {"type": "string"},
        },
        [{"ab": 1}],
        [{"é": "s"}, {"ab": "s"}],
    ),
    "not_ref_with_siblings_draft7": (
        {
            "$schema": "http://json-schema.org/draft-07/schema#",
            "definitions": {"s": {"type": "string"}},
            "not": {"$ref": "#/definitions/s", "maxLength": 1},
        },
        [1, None],
        ["abc", "a"],
    ),
    "contains": ({"type": "array", "contains": {"type": "string"}}, [["a"], [1, "a", 2]], [[], [1, 2]]),
    "min_max_contains": (
        {"type": "array", "items": {"type": "integer"}, "contains": {"minimum": 5}, "minContains": 2, "maxContains": 3},
        [[5, 6], [1, 5, 2, 6, 7]],
        [[5], [5, 6, 7, 8], [1, 2]],
    ),
    "unique_items_finite": (
        {"type": "array", "items": {"enum": [1, 2, "a"]}, "uniqueItems": True},
        [[], [1, 2, "a"], ["a", 1]],
        [[1, 1], [2, "a", 2]],
    ),
    "unique_items_irrelevant": ({"type": "array", "uniqueItems": True, "maxItems": 1}, [[], [{"a": 1}]], [[1, 2]]),
    "unknown_format": ({"type": "string", "format": "password", "minLength": 2}, ["ab", "secret"], ["a"]),
    "annotations": (
        {"type": "integer", "x-intellij-html-description": "<b>", "markdownDescription": "m", "errorMessage": "e"},
        [1],
        ["1"],
    ),
    "unevaluated_false": (
        {"type": "object", "properties": {"a": {}}, "unevaluatedProperties": False},
        [{}, {"a": 1}],
        [{"b": 1}],
    ),
    "untyped_keywords": ({"minimum": 3, "maxLength": 2}, [3, "ab", None, {}], [2, "abc"]),
    "allof_contradiction_is_dropped": (
        {"type": "object", "properties": {"a": {"allOf": [{"type": "string"}, {"type": "integer"}]}}},
        [{}],
        [{"a": 1}, {"a": "s"}],
    ),
}


@pytest.mark.parametrize("name", KEYWORDS)
def test_keywords_judge_like_jsonschema(name):
    schema, accepted, rejected = KEYWORDS[name]
    term, validator = fsm.compile_schema(schema), _validator(schema)
    for value in accepted:
        assert rx.matches(term, _text(value)), f"should accept {value!r}"
        assert validator.is_valid(value), f"{value!r} is invalid: the test itself is wrong"
    for value in rejected:
        assert not rx.matches(term, _text(value)), f"should reject {value!r}"
        assert not validator.is_valid(value), f"{value!r} is valid: a documented over-restriction? list it elsewhere"


def test_compile_notes_list_ignored_formats():
    term, notes = fsm.compile_with_notes(
        {"type": "object", "properties": {"p": {"type": "string", "format": "password"}}}
    )
    assert notes == ["format 'password' ignored at #/properties/p (validators ignore it)"]
    assert rx.matches(term, '{"p":"anything"}')


def test_character_is_compact_and_ordered():
    term = fsm.compile_schema(Character)
    assert rx.matches(term, '{"name":"John","age":20,"armor":"plate","strength":11}')
    assert not rx.matches(term, '{"name": "John","age":20,"armor":"plate","strength":11}')
    assert not rx.matches(term, '{"name":"Johnathan Smith","age":20,"armor":"plate","strength":11}')


def test_whitespace_is_configurable():
    assert _matches(Character, '{ "name": "John", "age": 20, "armor": "plate", "strength": 11 }', whitespace=r"[ \n]?")


def test_additional_properties_policy():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert not _matches(schema, '{"a":1,"b":2}')
    assert _matches(schema, '{"a":1,"b":[2,{"c":null}]}', additional_properties=True)
    # a declared key cannot come back unchecked
    assert not _matches(schema, '{"a":1,"a":"x"}', additional_properties=True)


def test_a_closed_object_builds_no_term_of_undeclared_keys(monkeypatch):
    """Where no undeclared key may appear (no additionalProperties, compact; no patternProperties), the keys that are
    not declared are never spelled out as a term (the declared names' trie: most of a compile's work before)."""
    built, without_words = [], rx.without_words
    monkeypatch.setattr(rx, "without_words", lambda *args: built.append(args[1]) or without_words(*args))
    schema = {"type": "object", "properties": {"alpha": {"type": "integer"}, "beta": {"type": "string"}}}
    closed = fsm.compile_schema(schema)
    assert built == [] and rx.matches(closed, '{"alpha":1,"beta":"x"}') and not rx.matches(closed, '{"gamma":1}')
    open_ = fsm.compile_schema(schema, additional_properties=True)
    assert built == [["alpha", "beta"]] and rx.matches(open_, '{"alpha":1,"gamma":[]}')


def test_optional_properties_any_subset_in_order():
    term = fsm.compile_schema(SCHEMAS["all_optional"])
    for text in ["{}", '{"a":1}', '{"b":"x"}', '{"a":1,"c":true}', '{"a":1,"b":"x","c":false}']:
        assert rx.matches(term, text), text
    for text in ['{"b":"x","a":1}', '{,"a":1}', '{"a":1,}']:
        assert not rx.matches(term, text), text


def test_integer_bounds_are_exact():
    term = fsm.compile_schema({"type": "integer", "minimum": -12, "exclusiveMaximum": 105})
    for x in range(-200, 300):
        assert rx.matches(term, str(x)) == (-12 <= x < 105)


def test_string_escapes_and_unicode():
    term = fsm.compile_schema({"type": "string", "minLength": 2, "maxLength": 3})
    for value in ['a"b', "\\\\", "\n\t", "é😀", "\u0001x"]:
        assert rx.matches(term, json.dumps(value, ensure_ascii=False)), value
        assert rx.matches(term, json.dumps(value)), value  # \uXXXX escapes, surrogate pairs count once
    assert not rx.matches(term, '"a\nb"')  # raw control characters are invalid JSON
    assert not rx.matches(term, json.dumps("abcd"))
    assert not rx.matches(term, '"\\ud800x"')  # a lone surrogate is left out


def test_recursion_is_bounded():
    term = fsm.compile_schema(Node, max_recursion_depth=2)
    assert rx.matches(term, '{"value":1,"children":[{"value":2}]}')
    assert not rx.matches(
        term, '{"value":1,"children":[{"value":2,"children":[{"value":3,"children":[{"value":4}]}]}]}'
    )


def test_shared_refs_compile_once():
    """A chain of definitions each used twice: text inlining doubles per level, terms are shared."""
    defs = {
        f"d{i}": {
            "type": "object",
            "properties": {"l": {"$ref": f"#/$defs/d{i + 1}"}, "r": {"$ref": f"#/$defs/d{i + 1}"}},
        }
        for i in range(40)
    }
    defs["d40"] = {"type": "integer"}
    term = fsm.compile_schema({"$defs": defs, "$ref": "#/$defs/d0"})
    assert rx.size(term) < 2_000
    assert rx.matches(term, '{"l":{"r":{}}}')


def test_json_string_and_dict_inputs_agree():
    schema = SCHEMAS["numbers"]
    assert fsm.compile_schema(json.dumps(schema)) is fsm.compile_schema(schema)


def test_annotations_are_ignored():
    plain = {"type": "integer"}
    annotated = {
        "type": "integer",
        "title": "t",
        "description": "d",
        "examples": [1],
        "default": 2,
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "y",
        "x-foo": {"type": "string"},
    }
    assert fsm.compile_schema(annotated) is fsm.compile_schema(plain)


@pytest.mark.parametrize(
    "schema, keyword, pointer",
    [
        ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "uniqueItems", "#"),
        ({"type": "number", "multipleOf": 0.01}, "multipleOf", "#"),
        ({"type": "integer", "multipleOf": 10_007}, "multipleOf", "#"),
        ({"type": "string", "format": "regex"}, "format", "#"),
        (
            {"type": "object", "properties": {"a~b/c": {"type": "integer", "minimum": 5, "maximum": 1}}},
            "minimum",
            "#/properties/a~0b~1c",
        ),
        ({"type": "string", "minLength": 5, "maxLength": 2}, "maxLength", "#"),
        ({"type": "string", "maxLength": "3"}, "maxLength", "#"),
        ({"type": "strin"}, "type", "#"),
        ({"type": 5}, "type", "#"),
        ({"type": ["string", {}]}, "type", "#"),
        (
            {"type": "object", "properties": {"q": {"type": "string", "pattern": '^"$'}}, "required": ["q"]},
            "pattern",
            "#/properties/q",
        ),
        ({"type": "string", "pattern": "^a\\\\b$"}, "pattern", "#"),  # a backslash JSON writes escaped
        ({"$ref": "#/$defs/missing"}, "$ref", "#"),
        ({"$ref": "https://example.com/schema.json"}, "$ref", "#"),
        ({"type": "string", "pattern": "(?<=a)b"}, "pattern", "#"),
        ({"type": "string", "pattern": "a\\1"}, "pattern", "#"),
        ({"enum": []}, "enum", "#"),
        ({"type": "object", "minProperties": 2, "additionalProperties": True}, "minProperties", "#"),
        ({"type": "array", "contains": {"type": "integer"}, "unevaluatedItems": False}, "unevaluatedItems", "#"),
        (
            {"type": "object", "anyOf": [{"properties": {"a": {}}}, {}], "unevaluatedProperties": {"type": "string"}},
            "unevaluatedProperties",
            "#",
        ),
        ({"properties": {"p": {"$ref": "#nowhere"}}}, "$ref", "#/properties/p"),
    ],
)
def test_bad_schemas_name_keyword_and_pointer(schema, keyword, pointer):
    with pytest.raises(fsm.SchemaError) as caught:
        fsm.compile_schema(schema)
    assert caught.value.keyword == keyword
    assert caught.value.pointer == pointer
    assert repr(keyword) in str(caught.value) and pointer in str(caught.value)


def test_unsatisfiable_schemas_raise():
    for schema in [
        False,
        {"not": {}},
        {"allOf": [{"type": "string"}, {"type": "integer"}]},
        {"oneOf": [{"type": "integer"}, {"type": "integer"}]},
    ]:
        with pytest.raises(fsm.SchemaError, match="accepts no value"):
            fsm.compile_schema(schema)


def test_malformed_inputs():
    with pytest.raises(fsm.SchemaError, match="not valid JSON"):
        fsm.compile_schema("{not json")
    with pytest.raises(fsm.SchemaError, match="pydantic model class, a dict or a JSON string"):
        fsm.compile_schema(42)


def test_a_schema_nesting_beyond_the_recursion_limit_is_a_schema_error():
    """Regression (coverage run, e.g. Github_medium o13135): a RecursionError escaped from the compiler."""
    deep: dict = {"type": "integer"}
    for _ in range(3000):
        deep = {"allOf": [deep]}
    with pytest.raises(fsm.SchemaError, match="nests too deeply"):
        fsm.compile_schema(deep)

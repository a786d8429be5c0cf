"""JSON Schema -> guide: every walk through the guide is valid JSON under the schema."""

from __future__ import annotations

import json
import re
from enum import Enum
from typing import Literal, Optional, Union

import jsonschema
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field

import fsm
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
    "array_bounds": {"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 300}, "minItems": 2, "maxItems": 4},
    "prefix_items": {"type": "array", "prefixItems": [{"type": "boolean"}, {"type": "null"}], "items": {"const": 7}, "maxItems": 4},
    "enum_any_values": {"enum": [1, "two", None, [3, {"x": True}], {"a": "é\"\\"}, 2.5]},
    "all_optional": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}, "c": {"type": "boolean"}}},
    "formats": {
        "type": "object",
        "properties": {f: {"type": "string", "format": f} for f in ("date", "time", "date-time", "uuid", "email", "uri", "ipv4", "hostname", "ipv6", "duration")},
        "required": ["date", "time", "date-time", "uuid", "email", "uri", "ipv4", "hostname", "ipv6", "duration"],
    },
    "string_all_together": {"type": "string", "minLength": 3, "maxLength": 8, "pattern": "^[a-z]+[0-9]*$", "format": "hostname"},
    "unanchored_pattern": {"type": "string", "pattern": "ab|^x", "maxLength": 6},
    "unicode": {"type": "object", "properties": {"名前": {"type": "string", "maxLength": 4}, "emoji": {"const": "😀 ü"}}, "required": ["名前", "emoji"]},
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
    "any_of_objects": {"anyOf": [{"type": "object", "properties": {"kind": {"const": "a"}, "x": {"type": "integer"}}, "required": ["kind", "x"]}, {"type": "object", "properties": {"kind": {"const": "b"}}, "required": ["kind"]}]},
    "one_of_exclusive": {"oneOf": [{"type": "integer"}, {"type": "string", "maxLength": 2}]},
    "all_of_merge": {"allOf": [{"type": "object", "properties": {"a": {"type": "integer", "minimum": 0}}, "required": ["a"]}, {"properties": {"a": {"maximum": 10}, "b": {"type": "boolean"}}}]},
    "additional_schema": {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"], "additionalProperties": {"type": "boolean"}},
    "ref_defs": {"$defs": {"pos": {"type": "integer", "minimum": 1}}, "type": "object", "properties": {"p": {"$ref": "#/$defs/pos"}, "q": {"$ref": "#/$defs/pos"}}, "required": ["p"]},
    "any_value": {},
}


def _validator(schema):
    as_dict = schema.model_json_schema() if isinstance(schema, type) else schema
    return jsonschema.Draft202012Validator(as_dict, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)


@pytest.mark.parametrize("name", SCHEMAS)
@settings(max_examples=15, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate])  # shrinking walks is slow
@given(rng=st.randoms(use_true_random=False))
def test_random_walks_validate(name, rng, smol_tokenizer):
    schema = SCHEMAS[name]
    guide = fsm.Guide.from_schema(schema, smol_tokenizer)
    tokens = random_walk(guide, rng)
    text = text_of(guide, tokens)
    assert re.fullmatch(fsm.regex_from_schema(schema), text)
    _validator(schema).validate(json.loads(text))


def test_character_regex_is_compact_and_ordered():
    regex = fsm.regex_from_schema(Character)
    assert re.fullmatch(regex, '{"name":"John","age":20,"armor":"plate","strength":11}')
    assert not re.fullmatch(regex, '{"name": "John","age":20,"armor":"plate","strength":11}')
    assert not re.fullmatch(regex, '{"name":"Johnathan Smith","age":20,"armor":"plate","strength":11}')


def test_whitespace_is_configurable():
    regex = fsm.regex_from_schema(Character, whitespace=r"[ \n]?")
    assert re.fullmatch(regex, '{ "name": "John", "age": 20, "armor": "plate", "strength": 11 }')


def test_additional_properties_policy():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert not re.fullmatch(fsm.regex_from_schema(schema), '{"a":1,"b":2}')
    open_regex = fsm.regex_from_schema(schema, additional_properties=True)
    assert re.fullmatch(open_regex, '{"a":1,"b":[2,{"c":null}]}')
    assert not re.fullmatch(open_regex, '{"a":1,"a":"x"}')  # a declared key cannot come back unchecked


def test_optional_properties_any_subset_in_order():
    regex = fsm.regex_from_schema(SCHEMAS["all_optional"])
    for text in ["{}", '{"a":1}', '{"b":"x"}', '{"a":1,"c":true}', '{"a":1,"b":"x","c":false}']:
        assert re.fullmatch(regex, text), text
    for text in ['{"b":"x","a":1}', '{,"a":1}', '{"a":1,}']:
        assert not re.fullmatch(regex, text), text


def test_integer_bounds_are_exact():
    regex = fsm.regex_from_schema({"type": "integer", "minimum": -12, "exclusiveMaximum": 105})
    for x in range(-200, 300):
        assert bool(re.fullmatch(regex, str(x))) == (-12 <= x < 105)


def test_string_escapes_and_unicode():
    regex = fsm.regex_from_schema({"type": "string", "maxLength": 3})
    for value in ['a"b', "\\", "\n", "é😀", "\u0001"]:
        assert re.fullmatch(regex, json.dumps(value, ensure_ascii=False)), value
    assert not re.fullmatch(regex, '"a\nb"')  # raw control characters are invalid JSON
    assert not re.fullmatch(regex, json.dumps("abcd"))


def test_recursion_is_bounded():
    regex = fsm.regex_from_schema(Node, max_recursion_depth=2)
    assert re.fullmatch(regex, '{"value":1,"children":[{"value":2}]}')
    assert not re.fullmatch(regex, '{"value":1,"children":[{"value":2,"children":[{"value":3,"children":[{"value":4}]}]}]}')


def test_json_string_and_dict_inputs_agree():
    schema = SCHEMAS["numbers"]
    assert fsm.regex_from_schema(json.dumps(schema)) == fsm.regex_from_schema(schema)


def test_annotations_are_ignored():
    plain = {"type": "integer"}
    annotated = {"type": "integer", "title": "t", "description": "d", "examples": [1], "default": 2, "$schema": "x", "$id": "y"}
    assert fsm.regex_from_schema(annotated) == fsm.regex_from_schema(plain)


@pytest.mark.parametrize(
    "schema, keyword, pointer",
    [
        ({"not": {"type": "string"}}, "not", "#"),
        ({"type": "object", "properties": {"a": {"type": "string", "if": {}, "then": {}}}}, "if", "#/properties/a"),
        ({"type": "object", "patternProperties": {"^x": {}}}, "patternProperties", "#"),
        ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "uniqueItems", "#"),
        ({"type": "object", "dependentRequired": {"a": ["b"]}}, "dependentRequired", "#"),
        ({"type": "number", "multipleOf": 0.5}, "multipleOf", "#"),
        ({"type": "string", "format": "color"}, "format", "#"),
        ({"type": "object", "properties": {"a~b/c": {"type": "integer", "minimum": 5, "maximum": 1}}}, "minimum", "#/properties/a~0b~1c"),
        ({"type": "string", "minLength": 5, "maxLength": 2}, "maxLength", "#"),
        ({"type": "string", "maxLength": "3"}, "maxLength", "#"),
        ({"type": "strin"}, "type", "#"),
        ({"$ref": "#/$defs/missing"}, "$ref", "#"),
        ({"$ref": "https://example.com/schema.json"}, "$ref", "#"),
        ({"type": "string", "pattern": "(?<=a)b"}, "pattern", "#"),
        ({"type": "string", "pattern": "a\\1"}, "pattern", "#"),
        ({"oneOf": [{"type": "integer"}, {"type": "integer", "minimum": 3}]}, "oneOf", "#"),
        ({"allOf": [{"type": "string"}, {"type": "integer"}]}, "type", "#/allOf/1"),
        ({"enum": []}, "enum", "#"),
        ({"type": "object", "minProperties": 2}, "minProperties", "#"),
    ],
)
def test_bad_schemas_name_keyword_and_pointer(schema, keyword, pointer):
    with pytest.raises(fsm.SchemaError) as caught:
        fsm.regex_from_schema(schema)
    assert caught.value.keyword == keyword
    assert caught.value.pointer == pointer
    assert repr(keyword) in str(caught.value) and pointer in str(caught.value)


def test_malformed_inputs():
    with pytest.raises(fsm.SchemaError, match="not valid JSON"):
        fsm.regex_from_schema("{not json")
    with pytest.raises(fsm.SchemaError, match="pydantic model class, a dict or a JSON string"):
        fsm.regex_from_schema(42)

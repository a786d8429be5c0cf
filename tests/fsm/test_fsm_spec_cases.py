"""Corner cases written from the draft 2020-12 core and validation texts (and draft 7 where it differs),
one block per keyword and per interaction of a merge or rewrite. Each instance is walked token by token
through a guide under both policies, and `jsonschema` is the oracle:

- an instance the oracle rejects is rejected by the guide (no false accept, either policy);
- an instance the oracle accepts is accepted under `policy="spec"`;
- a `SchemaError` fails the case unless the case lists its policy as refused (and a listed policy must raise);
- every case carries at least one text the oracle accepts and one it rejects (no vacuous case).
"""

from __future__ import annotations

import json

import jsonschema
import pytest

import fsm
from fsm.lazy_dfa import LazyDFA
from tests.fsm_walk import accepts_text

D7 = "http://json-schema.org/draft-07/schema#"
UNEVALUATED = {  # 2020-12 core 11.3: annotations come from the schema itself and its successful in-place applicators
    "sibling_allof_cannot_see": {"allOf": [{"properties": {"foo": True}}, {"unevaluatedProperties": False}]},
    "ref_target_cannot_see_siblings": {
        "$defs": {"A": {"unevaluatedProperties": False}},
        "properties": {"prop1": {"type": "string"}},
        "$ref": "#/$defs/A",
    },
    "uncle": {
        "type": "object",
        "properties": {"foo": {"type": "string"}},
        "allOf": [{"properties": {"bar": {"type": "string"}}}, {"unevaluatedProperties": False}],
    },
    "adjacent_properties": {
        "type": "object",
        "properties": {"foo": {"type": "string"}},
        "unevaluatedProperties": False,
    },
    "nested_allof_sees": {
        "type": "object",
        "properties": {"foo": {"type": "string"}},
        "allOf": [{"properties": {"bar": {"type": "string"}}}],
        "unevaluatedProperties": False,
    },
    "ref_sees": {
        "$defs": {"bar": {"properties": {"bar": {"type": "string"}}}},
        "type": "object",
        "$ref": "#/$defs/bar",
        "properties": {"foo": {"type": "string"}},
        "unevaluatedProperties": False,
    },
    "pattern_sees": {
        "type": "object",
        "patternProperties": {"^x": {"type": "integer"}},
        "unevaluatedProperties": False,
    },
    "additional_evaluates_all": {
        "type": "object",
        "additionalProperties": {"type": "integer"},
        "unevaluatedProperties": False,
    },
    "schema_valued": {"type": "object", "properties": {"a": {}}, "unevaluatedProperties": {"type": "integer"}},
    "required_is_not_evaluated": {"required": ["b"], "properties": {"a": {}}, "unevaluatedProperties": False},
    "anyof_beside": {
        "type": "object",
        "anyOf": [{"properties": {"foo": {}}}, {"properties": {"bar": {}}, "required": ["bar"]}],
        "unevaluatedProperties": False,
    },
    "dependent_schemas_beside": {
        "type": "object",
        "properties": {"foo": {}},
        "dependentSchemas": {"foo": {"properties": {"bar": {}}}},
        "unevaluatedProperties": False,
    },
    "items_false": {"type": "array", "prefixItems": [{"type": "string"}], "unevaluatedItems": False},
    "items_sibling_allof": {"allOf": [{"prefixItems": [True]}, {"unevaluatedItems": False}]},
    "items_nested_allof": {
        "type": "array",
        "allOf": [{"prefixItems": [True, {"type": "integer"}]}],
        "unevaluatedItems": False,
    },
    "items_schema": {"type": "array", "prefixItems": [{"type": "string"}], "unevaluatedItems": {"type": "integer"}},
    "items_with_items": {"type": "array", "items": {"type": "integer"}, "unevaluatedItems": False},
}
UNEVALUATED_VALUES = [
    {},
    {"foo": 1},
    {"foo": "x"},
    {"bar": "y"},
    {"foo": "x", "bar": "y"},
    {"prop1": "match"},
    {"x1": 1},
    {"x1": "s"},
    {"a": 1, "b": 2},
    {"b": 1},
    {"b": "s"},
    {"baz": 1},
    [],
    ["a"],
    ["a", 1],
    [1, 2],
    ["a", "b"],
    3,
]

MERGES = {  # allOf merging may only tighten (or be refused)
    "prefix_vs_parent_items": {"allOf": [{"prefixItems": [{"minimum": 3}]}], "items": {"minimum": 5}},
    "prefix_vs_branch_items": {"allOf": [{"prefixItems": [{"type": "string"}]}, {"items": {"type": "integer"}}]},
    "prefix_lengths": {
        "allOf": [{"prefixItems": [{"type": "string"}], "items": False}, {"prefixItems": [True, {"type": "integer"}]}]
    },
    "draft7_tuple_vs_items": {
        "$schema": D7,
        "allOf": [{"items": [{"type": "string"}], "additionalItems": {"type": "integer"}}, {"items": {"maxLength": 2}}],
    },
    "min_contains_zero": {
        "allOf": [{"contains": {"type": "string"}, "minContains": 0}, {"contains": {"type": "string"}}]
    },
    "min_contains_stray": {"allOf": [{"contains": {"type": "string"}}, {"minContains": 0}]},
    "max_contains_stray": {"allOf": [{"contains": {"type": "string"}}, {"maxContains": 1, "contains": {"const": 9}}]},
    "pattern_vs_additional": {
        "allOf": [{"patternProperties": {"^x": {"type": "integer"}}}, {"additionalProperties": {"type": "string"}}]
    },
    "pattern_vs_closed": {
        "allOf": [
            {"patternProperties": {"^x": {"type": "integer"}}},
            {"properties": {"foo": {}}, "additionalProperties": False},
        ]
    },
    "pattern_over_closed_names": {
        "allOf": [
            {"patternProperties": {"^x": {"type": "integer"}}},
            {"properties": {"x1": {}}, "additionalProperties": False},
        ]
    },
    "open_vs_schema_additional": {
        "allOf": [
            {"properties": {"a": {}}, "additionalProperties": True},
            {"additionalProperties": {"type": "integer"}},
        ]
    },
    "then_without_if": {"allOf": [{"then": {"type": "string"}}, {"if": {"type": "integer"}, "else": {"maximum": 1}}]},
    "if_in_both": {
        "allOf": [
            {"if": {"type": "integer"}, "then": {"minimum": 2}},
            {"if": {"type": "integer"}, "else": {"type": "string"}},
        ]
    },
    "required_vs_closed": {"allOf": [{"required": ["b"]}, {"properties": {"a": {}}, "additionalProperties": False}]},
    "dependent_schemas": {
        "type": "object",
        "dependentSchemas": {"a": {"properties": {"b": {"type": "integer"}}}},
        "allOf": [{"properties": {"b": {}}}],
    },
}
MERGE_VALUES = [
    [],
    [3],
    [3, 5],
    [6, 6],
    [5, 3],
    ["a"],
    ["a", 1],
    ["a", "b"],
    ["ab", 1],
    [1, "a"],
    ["abc", 1],
    [1, 2],
    ["a", 9],
    ["a", 9, 9],
    {},
    {"x1": 1},
    {"x1": "s"},
    {"foo": 1},
    {"b": 1},
    {"a": 1},
    {"a": 1, "b": "s"},
    {"a": 1, "b": 2},
    1,
    2,
    3,
    "s",
    0.5,
    2.5,
]

REFS = {  # 2020-12 core 8.2: $id changes the base URI, $anchor (and draft 7 "$id": "#name") names a plain-name fragment
    "anchor": {"$defs": {"A": {"$anchor": "foo", "type": "integer"}}, "$ref": "#foo"},
    "draft7_id_anchor": {
        "$schema": D7,
        "definitions": {"A": {"$id": "#foo", "type": "integer"}},
        "allOf": [{"$ref": "#foo"}],
    },
    "nested_id_base": {
        "$id": "http://example.com/root.json",
        "$defs": {"int": {"type": "integer"}},
        "properties": {
            "p": {"$id": "http://example.com/nested.json", "$defs": {"int": {"type": "string"}}, "$ref": "#/$defs/int"}
        },
    },
    "relative_id": {
        "$id": "http://example.com/a/root.json",
        "$defs": {"B": {"$id": "b.json", "type": "string"}},
        "properties": {"p": {"$ref": "b.json"}},
    },
    "absolute_ref_to_root": {
        "$id": "http://example.com/root.json",
        "$defs": {"n": {"type": "null"}},
        "properties": {"p": {"$ref": "http://example.com/root.json#/$defs/n"}},
    },
    "anchor_in_nested_resource": {
        "$id": "http://example.com/root.json",
        "properties": {"p": {"$ref": "other.json#bar"}},
        "$defs": {"O": {"$id": "other.json", "$defs": {"X": {"$anchor": "bar", "type": "boolean"}}}},
    },
}
REF_VALUES = [1, "s", None, True, {"p": 1}, {"p": "s"}, {"p": None}, {"p": True}]

NUMBERS = {  # validation 6.1.1 / 4.2.2: numbers compare by value, 1.0 is an integer
    "integer": {"type": "integer"},
    "integer_range": {"type": "integer", "minimum": -3, "maximum": 3},
    "integer_multiple": {"type": "integer", "multipleOf": 2},
    "const": {"const": -2},
    "enum": {"enum": [1, "x", [2], {"a": 3}]},
    "const_float": {"const": 2.5},
}
NUMBER_TEXTS = [
    "1",
    "1.0",
    "1.00",
    "-2",
    "-2.0",
    "-2.00",
    "2.5",
    "2.50",
    "3.0",
    "4.0",
    "0.5",
    '"x"',
    "[2]",
    "[2.0]",
    '{"a":3}',
    '{"a":3.0}',
    "2",
]


def _validator(schema):
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def _judge(schema: dict, texts: list[str], tokenizer, refused: frozenset[str] = frozenset()) -> None:
    """No false accept under either policy; under "spec" every valid text accepted; a SchemaError only where
    `refused` names the policy."""
    validator = _validator(schema)
    verdicts = [validator.is_valid(json.loads(text)) for text in texts]
    assert any(verdicts) and not all(verdicts), "a case needs a valid and an invalid text"
    for policy in ("compact", "spec"):
        if policy in refused:
            with pytest.raises(fsm.SchemaError) as error:
                fsm.Guide.from_schema(schema, tokenizer, policy=policy)
            assert error.value.pointer, str(error.value)
            continue
        guide = fsm.Guide.from_schema(schema, tokenizer, policy=policy)
        for text, valid in zip(texts, verdicts):
            accepted = accepts_text(guide.copy(), text, tokenizer)
            assert valid or not accepted, f"{policy}: false accept of {text}"
            if policy == "spec":
                assert accepted or not valid, f"spec: valid {text} rejected"


def _texts(values) -> list[str]:
    return [json.dumps(v, separators=(",", ":")) for v in values]


@pytest.mark.parametrize("name", UNEVALUATED)
def test_unevaluated_keywords(name, smol_tokenizer):
    refused = {"anyof_beside", "dependent_schemas_beside"}  # conditional annotations: SchemaError
    policies = frozenset({"compact", "spec"}) if name in refused else frozenset()
    _judge(UNEVALUATED[name], _texts(UNEVALUATED_VALUES), smol_tokenizer, refused=policies)


@pytest.mark.parametrize("name", ["anyof_beside", "dependent_schemas_beside"])
def test_unevaluated_beside_conditional_applicators_is_refused(name):
    with pytest.raises(fsm.SchemaError) as error:
        fsm.compile_schema(UNEVALUATED[name])
    assert error.value.keyword == "unevaluatedProperties" and error.value.pointer == "#"


@pytest.mark.parametrize("name", MERGES)
def test_merges_only_tighten(name, smol_tokenizer):
    _judge(MERGES[name], _texts(MERGE_VALUES), smol_tokenizer)


@pytest.mark.parametrize("name", REFS)
def test_refs_resolve_against_base_uri_and_anchors(name, smol_tokenizer):
    _judge(REFS[name], _texts(REF_VALUES), smol_tokenizer)


@pytest.mark.parametrize("name", NUMBERS)
def test_numbers_compare_by_value(name, smol_tokenizer):
    _judge(NUMBERS[name], NUMBER_TEXTS, smol_tokenizer)


def test_unresolvable_anchor_names_ref_and_pointer():
    with pytest.raises(fsm.SchemaError) as error:
        fsm.compile_schema({"properties": {"p": {"$ref": "#nope"}}})
    assert error.value.keyword == "$ref" and error.value.pointer == "#/properties/p"


ONE_OF_REQUIRED = {"type": "object", "oneOf": [{"required": ["foo", "bar"]}, {"required": ["foo", "baz"]}]}
ONE_OF_REQUIRED_TEXTS = [
    '{"foo":1,"bar":2}',
    '{"bar":2,"foo":1}',
    '{"foo":1,"baz":2}',
    '{"foo":1,"bar":2,"baz":3}',
    '{"foo":1}',
    '{"bar":1,"baz":2}',
    '{"baz":1,"x":0,"foo":2}',
    "3",
    "[]",
]


@pytest.mark.parametrize(
    "schema",
    [
        ONE_OF_REQUIRED,
        {"oneOf": [{"required": ["a"]}, {"required": ["b"], "description": "d"}, {"required": ["a", "b"]}]},
    ],
)
def test_one_of_required_options_is_exact(schema, smol_tokenizer):
    _judge(
        schema,
        ONE_OF_REQUIRED_TEXTS + ['{"a":1}', '{"b":1}', '{"a":1,"b":2}', "null"],
        smol_tokenizer,
    )


def test_one_of_required_first_mask_builds_few_states(smol_tokenizer):
    """The first mask under policy="spec" explored ~34,000 DFA states (32 s) when oneOf was written
    with complements; written as cases it needs a handful."""
    dfa = LazyDFA(fsm.compile_schema(ONE_OF_REQUIRED, policy="spec"))  # a fresh DFA: guides share theirs
    index = fsm.TokenIndex(dfa, fsm.vocabulary_from_tokenizer(smol_tokenizer))
    assert index.info(0).mask.any()
    assert dfa.n_states <= 20


def test_policy_names_the_option_pairs():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}
    spec = fsm.compile_schema(schema, policy="spec")
    assert spec is fsm.compile_schema(schema, additional_properties=True, property_order="any")  # terms are interned
    assert fsm.compile_schema(schema, policy="compact") is fsm.compile_schema(schema)
    assert fsm.rx.matches(spec, '{"b":1,"a":2,"c":[]}')
    assert not fsm.rx.matches(fsm.compile_schema(schema), '{"b":1,"a":2}')
    overridden = fsm.compile_schema(schema, policy="spec", property_order="schema")  # an explicit option wins
    assert fsm.rx.matches(overridden, '{"a":1,"c":[]}') and not fsm.rx.matches(overridden, '{"b":1,"a":2}')
    with pytest.raises(fsm.SchemaError, match="policy must be one of 'compact', 'spec'"):
        fsm.compile_schema(schema, policy="strict")

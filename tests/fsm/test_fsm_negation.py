"""Negations at the schema level (fsm/negation.py) and over-approximations that see top-level members
(fsm/upper_objects.py): each only narrows what is generated, checked against `jsonschema` on value pools.

A case of `not S` must never hold a value S accepts; options called disjoint must share no valid value; U(S) must
hold every text S accepts (nested, repeated keys, deeper than its depth bound), and leave out the texts whose
required member is only nested (the precision that makes GeoJSON's and Vega-Lite's `oneOf` cheap)."""

from __future__ import annotations

import itertools
import json

import jsonschema
import pytest

from fsm import rx
from fsm.negation import disjoint, negated_cases
from fsm.schema import Compiler
from fsm.upper_objects import DEPTH, deep, has_member, loose

POOL = [None, True, 0, 1.5, "", "x", "Point", [], [1], {}, {"a": 1}, {"a": "x"}, {"type": "Point"},
        {"type": "Line"}, {"type": "Point", "c": [1, 2]}, {"type": 1}, {"b": None}, {"a": {"type": "Point"}},
        {"type": "Point", "a": {"type": "Line"}}, {"a": [], "b": "x"}, {"a": 1, "b": 2, "type": "Line"}]

OBJECT_SCHEMAS = [
    {"type": "object", "required": ["type"], "properties": {"type": {"const": "Point"}}},
    {"required": ["a"]},
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}},
    {"type": ["object", "null"], "required": ["a", "b"], "properties": {"a": {"type": "array"}}},
    {"allOf": [{"$ref": "#/$defs/t"}, {"required": ["c"]}], "$defs": {"t": {"type": "object", "required": ["type"]}}},
    {"type": "object", "properties": {"a": {"type": "integer"}}, "not": {"required": ["b"]}},
    {"enum": [{"a": 1}, {"type": "Point"}]},
]


def _compiler(schema) -> Compiler:
    return Compiler(schema, rx.EPSILON, True, 3, "any")


def _text(value) -> str:
    return json.dumps(value, separators=(",", ":"))


def _valid(schema, value) -> bool:
    return jsonschema.Draft202012Validator(schema).is_valid(value)


@pytest.mark.parametrize("schema", OBJECT_SCHEMAS)
def test_every_case_of_a_negation_rejects_what_the_schema_accepts(schema):
    c = _compiler(schema)
    cases = negated_cases(schema, c.facts, extra=4)
    assert cases, "an object schema with keys is negated by cases"
    for value, case in itertools.product(POOL, cases):
        if _valid({**schema, **case} if "$defs" in schema else case, value):
            assert not _valid(schema, value), f"{value} satisfies case {case} and the schema"


@pytest.mark.parametrize("schema", OBJECT_SCHEMAS)
def test_negated_schemas_compile_to_texts_the_schema_rejects(schema):
    """L(not S) through the compiler: every text it accepts of the pool is rejected by S (and it accepts some)."""
    term = _compiler(schema).compile({"not": schema}, "#")
    accepted = [v for v in POOL if rx.matches(term, _text(v))]
    assert accepted and not any(_valid(schema, v) for v in accepted), accepted


def test_a_case_the_merged_schema_contradicts_is_left_out():
    """Inside an option that requires `type` with the very subschema S_type, "type absent or not S_type" is dead."""
    point = {"type": "object", "required": ["type"], "properties": {"type": {"const": "Point"}}}
    c = _compiler(point)
    assert negated_cases(point, c.facts) == [{"type": ["null", "boolean", "array", "string", "number"]},
                                               {"type": "object", "properties": {"type": {"not": {"const": "Point"}}}}]
    assert negated_cases(point, c.facts, within=point) == []  # nothing left: the option's term is NOTHING
    assert negated_cases(point, c.facts, within={"required": ["type"], "properties": point["properties"]}) == [
        {"type": ["null", "boolean", "array", "string", "number"]}]  # only other types are left
    assert negated_cases(point, c.facts, within={"type": "object"}) == [
        {"type": "object", "properties": {"type": {"not": {"const": "Point"}}}}]  # objects only: no other type


def test_options_called_disjoint_share_no_valid_value():
    schemas = {
        "point": {"type": "object", "required": ["type"], "properties": {"type": {"enum": ["Point"]}}},
        "line": {"type": "object", "required": ["type"], "properties": {"type": {"enum": ["Line"]}}},
        "open": {"type": "object", "properties": {"type": {"enum": ["Line"]}}},  # may lack "type": not disjoint
        "null": {"type": "null"},
        "any": {"properties": {"type": {"enum": ["Point"]}}, "required": ["type"]},  # non-objects: not disjoint
    }
    c = _compiler({})
    found = {}
    for (na, a), (nb, b) in itertools.permutations(schemas.items(), 2):
        found[na, nb] = disjoint(a, b, c.facts, lambda s: c.upper(s, "#"))
        if found[na, nb]:
            assert not any(_valid(a, v) and _valid(b, v) for v in POOL), (na, nb)
    assert found["point", "line"] and found["point", "open"] and found["null", "point"]
    assert not found["line", "open"] and not found["any", "null"] and not found["any", "line"]


def _upper(schema):
    return _compiler(schema).upper(schema, "#")


@pytest.mark.parametrize("schema", OBJECT_SCHEMAS)
def test_upper_holds_every_valid_text(schema):
    u = _upper(schema)
    valid = [v for v in POOL if _valid(schema, v)]
    assert valid and all(rx.matches(u, _text(v)) for v in valid)


def test_upper_sees_top_level_members_only():
    point = {"type": "object", "required": ["type"], "properties": {"type": {"const": "Point"}}}
    u = _upper(point)
    assert rx.matches(u, '{"a":{"type":"Line"},"type":"Point"}')
    assert not rx.matches(u, '{"type":"Line","a":{"type":"Point"}}')  # only nested: was inside U before
    assert not rx.matches(u, '{"type":"Line","a":["x",{"type":"Point"},"\\"type\\":\\"Point\\""]}')
    assert rx.matches(u, '{"type":"Line","type":"Point"}')  # repeated keys: validators keep the last
    assert rx.matches(u, '{"type":"\\u0050oint"}')  # any spelling


def test_upper_keeps_texts_nested_deeper_than_its_bound():
    point = {"type": "object", "required": ["type"], "properties": {"type": {"const": "Point"}}}
    u = _upper(point)
    nested = lambda n: "[" * n + "]" * n  # noqa: E731
    assert not rx.matches(u, '{"type":"Line","a":' + nested(DEPTH - 1) + "}")  # within the bound: told apart
    assert rx.matches(u, '{"type":"Line","a":' + nested(DEPTH) + "}")  # deeper: kept whole (a superset)
    assert rx.matches(u, '{"a":' + nested(DEPTH) + ',"type":"Point"}')
    assert rx.matches(deep(2), "[{[]}]") and not rx.matches(deep(2), "[{}]")


def test_loose_runs_balance_brackets_and_skip_strings():
    assert rx.matches(loose(1), '"a]",1,{"b":"}"}') and not rx.matches(loose(1), "{{}}")
    assert not rx.matches(loose(2), '"a\\"]') and rx.matches(loose(0), '"a\\"]"')
    member = has_member(rx.literal('"k"'), rx.literal("1"), rx.EPSILON)
    assert rx.matches(member, '{"a":[1,2],"k":1}') and not rx.matches(member, '{"k":12}')
    assert not rx.matches(member, '{"a":{"k":1}}')


def test_a_key_one_option_requires_and_the_other_forbids_makes_them_disjoint():
    closed = {"type": "object", "properties": {"a": {}}, "additionalProperties": False}
    point = {"type": "object", "required": ["type"]}
    c = _compiler({})
    assert disjoint(closed, point, c.facts, lambda s: c.upper(s, "#"))
    assert not any(_valid(closed, v) and _valid(point, v) for v in POOL)
    assert not disjoint(closed, {"type": "object", "required": ["a"]}, c.facts, lambda s: c.upper(s, "#"))


def test_not_of_a_union_negates_every_branch():
    """not (required a or required b): one case, both absent (a union's negation is every branch's)."""
    schema = {"anyOf": [{"required": ["a"]}, {"anyOf": [{"required": ["b"]}]}]}
    c = _compiler(schema)
    cases = negated_cases(schema, c.facts)
    assert cases == [{"allOf": [{"type": "object", "properties": {"a": False}},
                                {"type": "object", "properties": {"b": False}}]}]
    for value in POOL:
        assert not (_valid(cases[0], value) and _valid(schema, value))


def test_what_a_schema_negates_is_a_case_of_its_negation():
    """not {a: integer, not required b} holds {"a": 1, "b": 2}: neither a type nor a property case says so."""
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "not": {"required": ["b"]}}
    term = _compiler(schema).compile({"not": schema}, "#")
    assert {"required": ["b"]} in negated_cases(schema, _compiler(schema).facts)
    assert rx.matches(term, '{"a":1,"b":2}') and not rx.matches(term, '{"a":1}')


def test_an_enum_of_objects_is_negated_key_by_key():
    """not {enum: [{"a": true}]} holds every other object, {"a": 1} among them (the complement of U held none)."""
    schema = {"allOf": [{"enum": [{"a": 1}]}, {"not": {"enum": [{"a": True}]}}]}
    term = _compiler(schema).compile(schema, "#")
    assert rx.matches(term, '{"a":1}') and not rx.matches(term, '{"a":true}')
    negated = _compiler({}).compile({"not": {"const": {"a": True}}}, "#")
    assert all(rx.matches(negated, t) for t in ('{"a":1}', '{}', '1'))  # an extra key only where declared: narrower
    assert not rx.matches(negated, '{"a":true}')

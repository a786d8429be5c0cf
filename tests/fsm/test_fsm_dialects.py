"""Each difference between the dialects that the guide enforces, written from the drafts' specification texts
and judged by `jsonschema`'s validator for the declared draft. Every case is compiled under each dialect it
names and checked on the same texts:

- the oracle finds at least one text valid and one invalid in every dialect, and at least one text on which
  two of the case's dialects disagree (the case tests a difference, not a shared rule);
- the guide accepts no text the declared dialect's validator rejects (policies "compact" and "spec");
- under "spec" it accepts every valid text, except the ones the case lists as known gaps.
"""

from __future__ import annotations

import json
from typing import NamedTuple

import jsonschema
import pytest

import fsm
from fsm import rx

URI = {"draft-04": "http://json-schema.org/draft-04/schema#", "draft-06": "http://json-schema.org/draft-06/schema#",
       "draft-07": "http://json-schema.org/draft-07/schema#", "2019-09": "https://json-schema.org/draft/2019-09/schema",
       "2020-12": "https://json-schema.org/draft/2020-12/schema"}
ORACLE = {"draft-04": jsonschema.Draft4Validator, "draft-06": jsonschema.Draft6Validator,
          "draft-07": jsonschema.Draft7Validator, "2019-09": jsonschema.Draft201909Validator,
          "2020-12": jsonschema.Draft202012Validator}
LEGACY = ("draft-04", "draft-06", "draft-07")
ALL = (*LEGACY, "2019-09", "2020-12")


class Case(NamedTuple):
    body: dict  # the schema without $schema (the same body in every dialect)
    dialects: tuple
    texts: tuple
    gaps: frozenset = frozenset()  # valid texts the guide may reject under "spec" (it never accepts invalid ones)
    shared: bool = False  # the same rule in every dialect listed (kept tested, not a difference)


def _sibling_id(id_keyword: str) -> dict:
    """Draft-06/07 core 8.3 (draft-04: JSON Reference section 3): an `$id` beside `$ref` is ignored with every
    other sibling, so "x.json" resolves against the enclosing base (.../base/x.json: a number); from 2019-09
    the `$id` applies and moves the base to .../schemas/ (x.json: a string)."""
    root = "http://example.com/schemas/"
    return {id_keyword: root + "base/",
            "definitions": {"string": {id_keyword: root + "x.json", "type": "string"},
                            "number": {id_keyword: "x.json", "type": "number"}},
            "allOf": [{id_keyword: root, "$ref": "x.json"}]}


def _unknown_keyword_id(id_keyword: str) -> dict:
    """2020-12 core 9.4.2 (with 8.2.1; draft-07 core 8.2, draft-04 core 7.2): an identifier names a subschema,
    which only known keywords hold; inside an unknown one it is data, so x.json is the string schema."""
    root = "http://example.com/schemas/"
    return {id_keyword: root + "root.json",
            "definitions": {"decoy": {"x-wrapper": {id_keyword: root + "x.json", "type": "null"}},
                            "real": {id_keyword: root + "x.json", "type": "string"}},
            "allOf": [{"$ref": "x.json"}]}


INTEGERS = ("1", "1.0", "12345.0", "-0", "-0.0", "-7", "1.5", "2.0", "4.0", "[1]", "[1.0]", '"1"')
CASES = {
    # draft-04 core 3.5 / validation 5.5.2: an integer is a number without fraction or exponent part;
    # draft-06 validation 6.25 (type; and later): "integer which matches any number with a zero fractional part".
    "integer": Case({"type": "integer"}, ALL, INTEGERS, frozenset({"-0.0"})),
    "integer_enum": Case({"type": "integer", "enum": [1, 2, 3]}, ALL, INTEGERS),
    "integer_float_enum": Case({"type": "integer", "enum": [1.0, 2.5, "x"]}, ALL, INTEGERS + ("2.5", '"x"')),
    "integer_items_enum": Case({"type": "array", "items": {"type": "integer"}, "enum": [[1], [2]]}, LEGACY, INTEGERS),
    "integer_multiple": Case({"type": "integer", "multipleOf": 2}, ALL, INTEGERS, frozenset({"-0.0"})),
    "not_integer": Case({"type": ["number", "string"], "not": {"type": "integer"}}, ALL, INTEGERS),
    "integer_or_string": Case({"anyOf": [{"type": "string"}, {"type": "integer", "minimum": 1}]}, ALL, INTEGERS),
    # draft-04 validation 5.1.2-5.1.3: exclusiveMinimum/exclusiveMaximum are booleans that make
    # minimum/maximum exclusive (alone, or false, they change nothing); draft-06 on: numbers (kept tested).
    "exclusive_flags": Case(
        {"type": "integer", "minimum": 3, "exclusiveMinimum": True, "maximum": 6, "exclusiveMaximum": False},
        ("draft-04",),
        ("2", "3", "4", "6", "7", "3.0"),
    ),
    "exclusive_flag_number": Case(
        {"type": "number", "maximum": 5, "exclusiveMaximum": True},
        ("draft-04",),
        ("4", "4.5", "5", "5.0", "-3", "6"),
        frozenset({"4.5"}),
    ),
    "not_exclusive_flag": Case(
        {"type": "integer", "not": {"minimum": 3, "exclusiveMinimum": True}},
        ("draft-04",),
        ("2", "3", "4", "-1"),
        frozenset({"2", "3", "-1"}),
    ),
    "exclusive_numbers": Case(
        {"type": "integer", "exclusiveMinimum": 3, "exclusiveMaximum": 6}, ALL[1:], ("3", "4", "5", "6"), shared=True
    ),
    # draft-07 core 8.3: "All other properties in a "$ref" object MUST be ignored";
    # 2019-09 core 8.2.4.1: $ref is an applicator, its siblings apply beside it.
    "ref_siblings": Case(
        {
            "definitions": {"int": {"type": "integer"}},
            "type": "object",
            "properties": {"p": {"$ref": "#/definitions/int", "maximum": 5}},
        },
        ALL,
        ('{"p":1}', '{"p":9}', '{"p":"s"}', "{}"),
    ),
    "root_ref_siblings": Case(
        {"definitions": {"int": {"type": "integer"}}, "$ref": "#/definitions/int", "minimum": 5}, ALL, ("1", "7", '"s"')
    ),
    # draft-07 validation 6.4.1-6.4.2: `items` as an array validates by position, `additionalItems` the rest
    # (ignored when `items` is a schema); 2020-12 core 10.3.1.1: `prefixItems`, and no `additionalItems`.
    "tuple_items": Case(
        {"type": "array", "items": [{"type": "integer"}], "additionalItems": False},
        ALL[:4],
        ("[]", "[1]", "[1,2]", '["a"]', '[1,"a"]'),
        shared=True,
    ),
    "additional_items_alone": Case(
        {"type": "array", "items": {"type": "integer"}, "additionalItems": False},
        ALL,
        ("[]", "[1]", "[1,2]", '["a"]'),
        shared=True,
    ),
    "prefix_items": Case(
        {"type": "array", "prefixItems": [{"type": "integer"}], "additionalItems": False},
        ALL,
        ("[]", "[1]", "[1,2]", '["a"]', '[1,"a"]', "1"),
    ),
    # draft-07 validation 6.5.7: `dependencies` (names or a schema); 2019-09 validation 6.5.4 / core 9.2.2.4:
    # `dependentRequired` / `dependentSchemas` replace it.
    "dependencies": Case(
        {
            "type": "object",
            "properties": {"a": {}, "b": {}, "c": {"type": "integer"}},
            "dependencies": {"a": ["b"], "b": {"required": ["c"]}},
        },
        ALL,
        ("{}", '{"a":1}', '{"a":1,"b":2}', '{"a":1,"b":2,"c":3}', '{"b":1,"c":"x"}', '{"c":1}'),
    ),
    "dependent_keywords": Case(
        {
            "type": "object",
            "properties": {"a": {}, "b": {}, "c": {"type": "integer"}},
            "dependentRequired": {"a": ["b"]},
            "dependentSchemas": {"b": {"required": ["c"]}},
        },
        ALL,
        ("{}", '{"a":1}', '{"a":1,"b":2}', '{"a":1,"b":2,"c":3}', '{"b":1,"c":"x"}', '{"c":1}'),
    ),
    # Keywords a dialect does not define are annotations there, also under `not`: const, contains and
    # propertyNames come with draft-06, if/then/else with draft-07, minContains and unevaluated* with 2019-09.
    "const": Case({"anyOf": [{"type": "string"}, {"not": {"const": 1}}]}, ALL, ('"a"', "1", "2", "null")),
    "contains": Case({"type": "array", "contains": {"type": "string"}}, ALL, ("[]", "[1]", '["a"]', '[1,"a"]', "1")),
    "property_names": Case(
        {"type": "object", "propertyNames": {"maxLength": 1}, "additionalProperties": {"type": "integer"}},
        ALL,
        ("{}", '{"a":1}', '{"ab":1}', '{"a":"s"}'),
    ),
    "if_then_else": Case(
        {"type": "integer", "if": {"minimum": 5}, "then": {"multipleOf": 2}, "else": {"maximum": 2}},
        ALL,
        ("1", "3", "4", "6", "7", '"s"'),
    ),
    "not_if": Case(
        {"anyOf": [{"type": "string"}, {"not": {"if": {"type": "integer"}, "then": {"minimum": 5}}}]},
        ALL,
        ('"a"', "1", "7", "null"),
        frozenset({"1"}),
    ),  # U(if/then/else) is every value
    "min_contains": Case(
        {"type": "array", "contains": {"type": "string"}, "minContains": 2, "maxContains": 2},
        ALL[1:],
        ("[]", '["a"]', '["a","b"]', '["a","b","c"]', '[1,"a","b"]'),
    ),
    "unevaluated": Case(
        {"type": "object", "properties": {"a": {"type": "integer"}}, "unevaluatedProperties": False},
        ALL,
        ("{}", '{"a":1}', '{"a":1,"b":2}', '{"a":"s"}'),
    ),
    "sibling_id": Case(_sibling_id("$id"), ALL[1:], ("5", "1.5", '"a"', "null")),
    "sibling_id_draft4": Case(_sibling_id("id"), ("draft-04",), ("5", "1.5", '"a"', "null")),
    "unknown_keyword_id": Case(_unknown_keyword_id("$id"), ALL[1:], ('"a"', "null", "1"), shared=True),
    "unknown_keyword_id_draft4": Case(_unknown_keyword_id("id"), ("draft-04",), ('"a"', "null", "1")),
    # draft-04 core 7.2: `id` (not `$id`) sets the base URI and "#name" names a fragment.
    "draft4_id": Case(
        {
            "id": "http://example.com/root.json",
            "definitions": {"a": {"id": "a.json", "type": "integer"}, "b": {"id": "#b", "type": "string"}},
            "type": "object",
            "properties": {"p": {"$ref": "a.json"}, "q": {"$ref": "#b"}},
        },
        ("draft-04",),
        ('{"p":1}', '{"p":"s"}', '{"q":"s"}', '{"q":1}', "{}"),
    ),
}


def _schema(body: dict, dialect: str) -> dict:
    return {"$schema": URI[dialect], **body}


def _verdicts(case: Case, dialect: str) -> dict[str, bool]:
    schema = _schema(case.body, dialect)
    validator = ORACLE[dialect](schema)
    return {t: validator.is_valid(json.loads(t)) for t in case.texts}


@pytest.mark.parametrize("name", CASES)
def test_the_case_tells_the_dialects_apart(name):
    case = CASES[name]
    seen = {d: _verdicts(case, d) for d in case.dialects}
    for dialect, verdicts in seen.items():
        assert any(verdicts.values()) and not all(verdicts.values()), f"{dialect}: {verdicts}"
    if len(case.dialects) > 1 and not case.shared:
        assert len({tuple(v.values()) for v in seen.values()}) > 1, f"the dialects agree on every text: {seen}"


@pytest.mark.parametrize("name, dialect", [(n, d) for n, c in CASES.items() for d in c.dialects])
def test_guide_follows_the_declared_dialect(name, dialect):
    case = CASES[name]
    verdicts = _verdicts(case, dialect)
    for policy in ("compact", "spec"):
        term = fsm.compile_schema(_schema(case.body, dialect), policy=policy)
        accepted = {t for t in case.texts if rx.matches(term, t)}
        assert [t for t in accepted if not verdicts[t]] == [], f"{policy}: false accepts"
        if policy == "spec":
            missed = [t for t, ok in verdicts.items() if ok and t not in accepted and t not in case.gaps]
            assert missed == [], "spec: valid texts rejected"


SPELLINGS = [(f"{scheme}://json-schema.org/{path}/schema{hash_}", name)
             for name, path in (("draft-04", "draft-04"), ("draft-06", "draft-06"), ("draft-07", "draft-07"),
                                ("2019-09", "draft/2019-09"), ("2020-12", "draft/2020-12"))
             for scheme in ("http", "https") for hash_ in ("", "#")]


@pytest.mark.parametrize("uri, name", SPELLINGS)
def test_every_spelling_of_a_dialect_reads_as_it(uri, name):
    assert fsm.schema_dialect({"$schema": uri}) == name
    term = fsm.compile_schema({"$schema": uri, "type": "integer"})
    assert rx.matches(term, "12") and rx.matches(term, "12.0") == (name != "draft-04")


def test_no_schema_reads_as_2020_12():
    assert fsm.schema_dialect({"type": "integer"}) == fsm.schema_dialect(True) == "2020-12"
    assert fsm.compile_schema({"type": "integer"}) is fsm.compile_schema(_schema({"type": "integer"}, "2020-12"))


@pytest.mark.parametrize("uri", ["http://json-schema.org/draft-03/schema#", "http://json-schema.org/schema#",
                                 "https://example.com/my-dialect", "json-schema.org/draft-07/schema", 7])
def test_an_unknown_dialect_is_refused_naming_it(uri):
    with pytest.raises(fsm.SchemaError, match="unknown dialect") as error:
        fsm.compile_schema({"$schema": uri, "type": "integer"})
    assert error.value.keyword == "$schema" and error.value.pointer == "#" and repr(uri) in str(error.value)


@pytest.mark.parametrize("root", ["draft-07", "2019-09", None])
def test_a_subschema_that_declares_a_dialect_is_read_in_it(root):
    """jsonschema reads every subschema's `$schema` (bundled schemas repeat draft-04's in their definitions):
    the guide does too, so 1.0 is no integer inside the draft-04 definition and one outside it."""
    body = {"definitions": {"n": {"$schema": URI["draft-04"], "type": "integer"}}, "type": "object",
            "properties": {"p": {"$ref": "#/definitions/n"}, "q": {"type": "integer"}}}
    schema = body if root is None else _schema(body, root)
    validator = ORACLE[root or "2020-12"](schema)
    term = fsm.compile_schema(schema, policy="spec")
    for text, valid in (('{"p":1.0}', False), ('{"p":1}', True), ('{"q":1.0}', True), ('{"p":"s"}', False)):
        assert validator.is_valid(json.loads(text)) is valid and rx.matches(term, text) is valid, text


@pytest.mark.parametrize(
    "inner, keyword, pointer",
    [
        (
            {"$schema": "https://json-schema.org/draft-04/schema", "type": "integer"},
            "$schema",
            "#/properties/p",
        ),  # not its id
        (
            {"$schema": URI["draft-04"], "id": "http://example.com/p.json", "type": "integer"},
            "$schema",
            "#/properties/p",
        ),
        (
            {"$schema": URI["draft-04"], "type": "object", "properties": {"x": {"type": "integer"}}},
            "$ref",
            "#/properties/r",
        ),
    ],
)
def test_a_dialect_switch_the_guide_cannot_follow_is_refused(inner, keyword, pointer):
    schema = (
        _schema(
            {
                "$defs": {"d": inner},
                "type": "object",
                "properties": {"p": inner, "r": {"$ref": "#/$defs/d/properties/x"}},
            },
            "2020-12",
        )
        if keyword == "$ref"
        else _schema({"type": "object", "properties": {"p": inner}}, "2020-12")
    )
    with pytest.raises(fsm.SchemaError) as error:
        fsm.compile_schema(schema)
    assert error.value.keyword == keyword and error.value.pointer == pointer


@pytest.mark.parametrize(
    "body, dialect, keyword",
    [
        ({"minimum": 3, "exclusiveMinimum": 3}, "draft-04", "exclusiveMinimum"),  # draft-04: booleans only
        ({"maximum": 3, "exclusiveMaximum": True}, "draft-06", "exclusiveMaximum"),  # draft-06 on: numbers only
        ({"minimum": 3, "exclusiveMinimum": False}, "2020-12", "exclusiveMinimum"),
        ({"minimum": 3, "exclusiveMinimum": True}, None, "exclusiveMinimum"),  # no $schema: 2020-12
        ({"items": [{"type": "integer"}]}, "2020-12", "items"),  # 2020-12: items is one schema
        (
            {"$defs": {"a": {"$id": "#a", "type": "integer"}}, "$ref": "#a"},
            "2019-09",
            "$ref",
        ),  # an anchor only up to draft-07
        ({"definitions": {"a": {"$anchor": "a", "type": "integer"}}, "$ref": "#a"}, "draft-07", "$ref"),  # from 2019-09
    ],
)
def test_a_form_the_dialect_does_not_define_is_refused(body, dialect, keyword):
    with pytest.raises(fsm.SchemaError) as error:
        fsm.compile_schema(body if dialect is None else _schema(body, dialect))
    assert error.value.keyword == keyword and error.value.pointer == "#"


@pytest.mark.parametrize(
    "body",
    [
        {"type": "array", "items": [{"type": "integer"}], "additionalItems": {"type": "string"}},
        {"type": "object", "dependencies": {"a": ["b"], "b": {"required": ["c"]}}},
    ],
)
def test_no_schema_still_enforces_the_legacy_array_and_dependency_keywords(body):
    """As before the guide read `$schema`: they mean what draft-07 says (2020-12 does not define them)."""
    term = fsm.compile_schema(body, policy="spec")
    assert term is fsm.compile_schema(_schema(body, "draft-07"), policy="spec")
    assert not rx.matches(term, '[1,2]') and not rx.matches(term, '{"a":1}')
    assert rx.matches(term, '[1,"a"]' if "items" in body else '{"a":1,"b":2,"c":3}')

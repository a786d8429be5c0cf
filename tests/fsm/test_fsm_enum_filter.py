"""`enum`/`const` beside other keywords: the values that validate, decided by jsonschema (fsm.enum_filter)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

import fsm
from fsm import enum_filter, rx

DRAFT7 = "http://json-schema.org/draft-07/schema#"
NEGATED_PATTERNS = {  # U of the `not` cannot tell the object apart: without the filter the language is empty
    "allOf": [{"enum": [{"a": "bar"}]},
              {"not": {"patternProperties": {"a*": {"type": "integer"}, "aaa*": {"maximum": 20}}}}]
}
CASES = [
    NEGATED_PATTERNS,
    {"enum": [{"a": 1}, {"b": 2}, {"a": 1, "x": 3}, {"x": "s"}],
     "not": {"patternProperties": {"^x": {"type": "integer"}}, "required": ["x"]}},
    {"enum": [{"k": 1}, {"k": 2}, {"k": 1, "m": 0}],
     "oneOf": [{"required": ["m"]}, {"properties": {"k": {"const": 2}}}]},
    {"enum": [1, 2, 3, "a", 2.5], "type": "integer", "minimum": 2},
    {"const": {"a": [1, 2]}, "properties": {"a": {"maxItems": 1}}},
    {"$schema": DRAFT7, "enum": [{"a": 1}, {"a": 1, "c": 0}, {"b": 1}], "dependencies": {"a": ["c"]}},
    {"enum": ["2020-01-01", "not a date"], "format": "date"},
]


def _compact(value) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


@pytest.mark.parametrize("schema", CASES, ids=range(len(CASES)))
def test_exactly_the_values_that_validate(schema):
    values = [schema["const"]] if "const" in schema else schema.get("enum") or schema["allOf"][0]["enum"]
    checker = jsonschema.validators.validator_for(schema)
    validator = checker(schema, format_checker=checker.FORMAT_CHECKER)
    valid = [v for v in values if validator.is_valid(v)]
    if not valid:
        with pytest.raises(fsm.SchemaError):
            fsm.compile_schema(schema, policy="spec")
        return
    term = fsm.compile_schema(schema, policy="spec")
    for value in values:
        assert rx.matches(term, _compact(value)) == validator.is_valid(value), value


def test_dependencies_of_draft_07_are_enforced():
    """The 2020-12 validator ignores `dependencies`: the dialect's own validator must also pass each value."""
    kept = enum_filter.valid_constants(fsm.dialects.read(CASES[5], fsm.dialects.dialect_of(CASES[5]), "#"),
                                       "draft-07", {"enum", "dependencies"})
    assert kept == [{"a": 1, "c": 0}, {"b": 1}]


def test_negative_control_without_the_filter_the_language_is_empty(monkeypatch):
    monkeypatch.setattr(fsm.schema, "valid_constants", lambda *args: None)
    with pytest.raises(fsm.SchemaError):
        fsm.compile_schema(NEGATED_PATTERNS, policy="spec")


def test_where_the_filter_stays_out():
    assert enum_filter.valid_constants({"enum": [1, 2]}, "2020-12", {"enum"}) is None  # nothing else to check
    assert enum_filter.valid_constants({"enum": [1.0], "type": "integer"}, "draft-04", {"enum", "type"}) is None
    with_ref = {"enum": [{"a": 1}], "properties": {"a": {"$ref": "#/$defs/x"}}}
    assert enum_filter.valid_constants(with_ref, "2020-12", {"enum", "properties"}) is None


TRANSCEND = (Path(__file__).resolve().parents[3] / "shared" / "data" / "jsonschemabench"
             / "JsonSchemaStore---transcend-yml-schema-v4.json")


def _counting_enum_validators(monkeypatch) -> list[int]:
    """Validators whose `enum` keyword records how many values each check compares with (its list's length)."""
    compared: list[int] = []

    def counting(cls):
        enum = cls.VALIDATORS["enum"]

        def counted(validator, enums, instance, schema):
            compared.append(len(enums))
            yield from enum(validator, enums, instance, schema)

        return jsonschema.validators.extend(cls, {"enum": counted})

    monkeypatch.setattr(enum_filter, "VALIDATORS", {k: counting(c) for k, c in enum_filter.VALIDATORS.items()})
    return compared


def test_a_long_enum_is_filtered_without_comparing_it_with_itself(monkeypatch):
    """Each listed value passes its own enum: asking the keyword made 5,383 region codes 29M comparisons."""
    compared = _counting_enum_validators(monkeypatch)
    values = [f"code-{i}" for i in range(5000)] + [7, None]
    kept = enum_filter.valid_constants({"enum": values, "type": "string"}, "2020-12", {"enum", "type"})
    assert kept == values[:5000] and sum(compared) == 0
    kept = enum_filter.valid_constants({"const": "a", "enum": ["a", "b"], "type": "string"}, "2020-12",
                                       {"enum", "const", "type"})
    assert kept == ["a"] and sum(compared) == 2  # const's one value is checked against the enum as before


@pytest.mark.skipif(not TRANSCEND.is_file(), reason="JSONSchemaBench is read from ../shared")
def test_transcend_compiles_in_one_attempt_and_linear_enum_work(monkeypatch):
    """transcend-yml-schema-v4 (enums of 5,383 and 5,133 region codes beside `type`) took 23 s, now ~0.5 s: one
    compiler (no recursion, so no rule attempt to retry) and no enum compared with its own list."""
    compared = _counting_enum_validators(monkeypatch)
    made = []
    original = fsm.schema.Compiler.__init__

    def counted_init(self, *args, **kwargs):
        made.append(args)
        original(self, *args, **kwargs)

    monkeypatch.setattr(fsm.schema.Compiler, "__init__", counted_init)
    fsm.compile_schema(json.loads(TRANSCEND.read_text())["schema"], policy="compact")
    assert len(made) == 1 and sum(compared) == 0

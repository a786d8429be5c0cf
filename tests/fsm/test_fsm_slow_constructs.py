"""The constructs that made walks slow (issue 55), each as a small schema: compiled and walked within a work budget
(new terms, the deterministic measure `fsm.Budget` counts), every valid value accepted under policy="spec", no invalid
one accepted under either policy (against `jsonschema`), and a state undecided within the search bound forbidden.

Before the schema-level negations (fsm/negation.py) and the top-level over-approximations (fsm/upper_objects.py),
each of the first four needed a search of up to 100,000 terms per state (GeoJSON and Vega-Lite ran past 60 s)."""

from __future__ import annotations

import json

import jsonschema
import pytest

import fsm
from fsm import rx
from fsm.budget import Budget, GuideBudgetError, metered
from tests.fsm_walk import accepts_text

pytestmark = pytest.mark.usefixtures("fresh_fsm_caches")  # term counts must not depend on what ran before

# JsonSchemaStore geojson: oneOf of open objects told apart by "type", nested ones repeating it
GEOJSON = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "definitions": {
        "point": {"type": "object", "required": ["type", "coordinates"],
                  "properties": {"type": {"type": "string", "enum": ["Point"]},
                                 "coordinates": {"type": "array", "minItems": 2, "items": {"type": "number"}}}},
        "line": {"type": "object", "required": ["type", "coordinates"],
                 "properties": {"type": {"type": "string", "enum": ["LineString"]},
                                "coordinates": {"type": "array", "minItems": 2,
                                                "items": {"type": "array", "items": {"type": "number"}}}}},
        "feature": {"type": "object", "required": ["type", "properties", "geometry"],
                    "properties": {"type": {"type": "string", "enum": ["Feature"]},
                                   "properties": {"oneOf": [{"type": "null"}, {"type": "object"}]},
                                   "geometry": {"oneOf": [{"type": "null"}, {"$ref": "#/definitions/point"},
                                                          {"$ref": "#/definitions/line"}]}}},
    },
    "oneOf": [
        {"$ref": "#/definitions/point"}, {"$ref": "#/definitions/line"}, {"$ref": "#/definitions/feature"},
        {"type": "object", "required": ["type", "features"],
         "properties": {"type": {"type": "string", "enum": ["FeatureCollection"]},
                        "features": {"type": "array", "items": {"$ref": "#/definitions/feature"}}}},
    ],
}
GEOJSON_VALUES = [
    {"type": "FeatureCollection", "features": [{"type": "Feature", "properties": {"a": 1},
                                                "geometry": {"type": "Point", "coordinates": [1, 2]}}]},
    {"type": "Feature", "properties": None, "geometry": {"type": "LineString", "coordinates": [[1, 2], [3, 4]]}},
    {"type": "Point", "coordinates": [1.5, 2], "bbox": {"type": "LineString"}},
    {"type": "FeatureCollection", "features": [{"type": "Feature", "geometry": None}]},
    {"type": "Point", "coordinates": [1]},
    {"type": "Feature", "properties": {}, "geometry": {"type": "Point", "coordinates": ["x", 1]}},
    {"type": "Polygon", "coordinates": []},
]
# Github_ultra o19343 (Vega-Lite): oneOf told apart only by required keys, a FacetSpec holding a UnitSpec
VEGA = {
    "$schema": "http://json-schema.org/draft-04/schema#",
    "definitions": {
        "mark": {"type": "string", "enum": ["bar", "line", "point"]},
        "unit": {"type": "object", "required": ["mark"],
                 "properties": {"mark": {"$ref": "#/definitions/mark"}, "name": {"type": "string"},
                                "encoding": {"type": "object", "properties": {
                                    "x": {"type": "object", "properties": {"field": {"type": "string"}}},
                                    "y": {"type": "object", "properties": {"field": {"type": "string"}}}}}}},
        "facet": {"type": "object", "required": ["facet", "spec"],
                  "properties": {"facet": {"type": "object"}, "name": {"type": "string"},
                                 "spec": {"$ref": "#/definitions/unit"}}},
        "layer": {"type": "object", "required": ["layers"],
                  "properties": {"layers": {"type": "array", "items": {"$ref": "#/definitions/unit"}},
                                 "name": {"type": "string"}}},
    },
    "oneOf": [{"$ref": "#/definitions/unit"}, {"$ref": "#/definitions/facet"}, {"$ref": "#/definitions/layer"}],
}
VEGA_VALUES = [
    {"mark": "bar", "encoding": {"x": {"field": "a"}, "y": {"field": "b"}}},
    {"facet": {}, "spec": {"mark": "line"}, "name": "n"},
    {"layers": [{"mark": "point"}, {"mark": "bar", "name": "x"}]},
    {"mark": "bar", "extra": {"facet": {}, "spec": {}}},
    {"mark": "bar", "facet": {}, "spec": {"mark": "line"}},
    {"layers": [{"mark": "area"}]},
    {"facet": {}, "spec": {"mark": "line"}, "layers": []},
    {"mark": "bar", "encoding": {"x": {"field": 1}}},
]
# Github_hard o35186: oneOf of allOf [$ref base, own] told apart by a pattern on an enum, under patternProperties
STATES = {
    "definitions": {
        "base": {"type": "object", "required": ["id", "type"],
                 "properties": {"id": {"type": "string"},
                                "type": {"type": "string", "enum": ["atomic", "compound", "final"]}}},
        "atomic": {"allOf": [{"$ref": "#/definitions/base"}, {"type": "object", "required": ["on"],
                   "properties": {"type": {"type": "string", "pattern": "atomic"}, "on": {"type": "object"}}}]},
        "compound": {"allOf": [{"$ref": "#/definitions/base"}, {"type": "object", "required": ["states"],
                     "properties": {"type": {"type": "string", "pattern": "compound"},
                                    "states": {"$ref": "#/definitions/states"}}}]},
        "final": {"allOf": [{"$ref": "#/definitions/base"},
                            {"type": "object", "properties": {"type": {"type": "string", "pattern": "final"}}}]},
        "states": {"type": "object", "patternProperties": {"^.*$": {"oneOf": [
            {"$ref": "#/definitions/atomic"}, {"$ref": "#/definitions/compound"}, {"$ref": "#/definitions/final"}]}}},
    },
    "type": "object", "required": ["states"], "properties": {"states": {"$ref": "#/definitions/states"}},
}
STATES_VALUES = [
    {"states": {"a": {"id": "a", "type": "atomic", "on": {"go": "b"}}, "b": {"id": "b", "type": "final"}}},
    {"states": {"c": {"id": "c", "type": "compound", "states": {"d": {"id": "d", "type": "final"}}}}},
    {"states": {"a": {"id": "a", "type": "atomic"}}},
    {"states": {"a": {"id": "a", "type": "compound", "on": {}}}},
    {"states": {"a": {"id": 1, "type": "final"}}},
]
# Github_hard o62820: a recursive closed object with minProperties and a oneOf [string, object]
QUERY = {
    "$schema": "http://json-schema.org/draft-04/schema#",
    "definitions": {"cond": {"type": "object", "additionalProperties": False, "minProperties": 1, "properties": {
        "and": {"type": "array", "minItems": 1, "items": {"$ref": "#/definitions/cond"}},
        "or": {"type": "array", "minItems": 1, "items": {"$ref": "#/definitions/cond"}},
        "not": {"$ref": "#/definitions/cond"},
        "name": {"type": "string"},
        "concept_id": {"oneOf": [{"type": "string"}, {
            "type": "object", "additionalProperties": False, "required": ["value"],
            "properties": {"value": {"type": "string"}, "pattern": {"type": "boolean"}}}]}}}},
    "type": "object", "additionalProperties": False, "properties": {"condition": {"$ref": "#/definitions/cond"}},
}
QUERY_VALUES = [
    {"condition": {"and": [{"name": "x"}, {"or": [{"concept_id": "c1"}, {"name": "y"}]}]}},  # 3 nested: the $ref bound
    {"condition": {"concept_id": {"value": "v", "pattern": True}}},
    {"condition": {}},
    {"condition": {"and": []}},
    {"condition": {"concept_id": {"pattern": True}}},
    {"condition": {"name": "x", "other": 1}},
]
# Glaiveai2K calculate_area: oneOf options with `not required`
NOT_REQUIRED = {
    "type": "object", "required": ["d"], "properties": {"d": {
        "type": "object",
        "properties": {"r": {"type": "number"}, "l": {"type": "number"}, "w": {"type": "number"}},
        "oneOf": [{"required": ["r"], "not": {"required": ["l", "w"]}},
                  {"required": ["l", "w"], "not": {"required": ["r"]}}]}},
}
NOT_REQUIRED_VALUES = [{"d": {"r": 1}}, {"d": {"l": 1, "w": 2}}, {"d": {"r": 1, "l": 1}},
                       {"d": {"r": 1, "l": 1, "w": 2}}, {"d": {}}, {"d": {"l": 1}}]
# Synthesized *_not_2: an enum of objects minus a `not` of properties
ENUM_NOT = {"allOf": [{"enum": [{"bar": 2, "foo": 1}, {"foo": "x"}]},
                      {"not": {"properties": {"foo": {"type": "string"}}, "required": ["foo"]}}]}
ENUM_NOT_VALUES = [{"bar": 2, "foo": 1}, {"foo": "x"}, {"foo": 1}]

CONSTRUCTS = {  # name: (schema, values, new terms allowed for both policies' compiles and walks; ~3x what they take)
    "geojson": (GEOJSON, GEOJSON_VALUES, 35_000),
    "vega": (VEGA, VEGA_VALUES, 100_000),
    "states": (STATES, STATES_VALUES, 100_000),
    "query": (QUERY, QUERY_VALUES, 40_000),
    "not_required": (NOT_REQUIRED, NOT_REQUIRED_VALUES, 7_000),
    "enum_not": (ENUM_NOT, ENUM_NOT_VALUES, 1_500),
}


def _verdicts(schema, values) -> list[bool]:
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return [cls(schema).is_valid(v) for v in values]


@pytest.mark.parametrize("name", CONSTRUCTS)
def test_slow_constructs_are_decided_within_a_work_budget(name, smol_tokenizer):
    schema, values, terms = CONSTRUCTS[name]
    verdicts = _verdicts(schema, values)
    assert any(verdicts) and not all(verdicts)
    texts = [json.dumps(v, separators=(",", ":")) for v in values]
    fsm.Guide.from_schema({"type": "object"}, smol_tokenizer).mask()  # the compiler's shared terms, outside the count
    with metered(Budget(max_terms=terms), f"the {name} construct", timed=False):  # compiles and walks: one budget
        for policy in ("spec", "compact"):
            try:
                guide = fsm.Guide.from_schema(schema, smol_tokenizer, policy=policy)
            except GuideBudgetError:
                raise
            except fsm.SchemaError:  # compact may close what an enum needs open: narrower, never wrong
                assert policy == "compact", name
                continue
            for text, valid in zip(texts, verdicts):
                accepted = accepts_text(guide.copy(), text, smol_tokenizer)
                assert valid or not accepted, f"{policy}: false accept of {text}"
                assert accepted or not valid or policy == "compact", f"spec: valid {text} rejected"


def test_an_unsatisfiable_not_required_is_refused_at_once():
    """Glaiveai2K calculate_area_95058385: every option excludes keys the object requires; the compile says so within
    a small work budget (before: a 100,000-term search past the wall-clock budget)."""
    schema = {"type": "object", "required": ["a", "b", "c"],
              "oneOf": [{"required": ["a"], "not": {"required": ["b", "c"]}},
                        {"required": ["b"], "not": {"required": ["a", "c"]}}]}
    with pytest.raises(fsm.SchemaError, match="accepts no value"):
        fsm.compile_schema(schema, policy="spec", budget=Budget(max_terms=5_000))


# The shortest "aaa..." is excluded; the search from the root finds "bbb...", and the states after '"c' lie off its path
SEARCHED = {"type": "string", "pattern": "^[abc]{12}$", "not": {"pattern": "a|bc"}}


def test_a_state_undecided_within_the_bound_is_forbidden_not_accepted(smol_tokenizer, monkeypatch):
    """With the search bound at 3 terms, states after '"c' cannot be decided: the guide forbids them (a valid text is
    lost, loudly narrower) and accepts nothing invalid; with the real bound the same text is accepted."""
    texts = ['"cccccccccccc"', '"bbbbbbbbbbbb"', '"ccccccaccccc"', '"cccc"', '"bbbbbbbbbbbbb"', '"cccccbcccccc"']
    verdicts = _verdicts(SEARCHED, [json.loads(t) for t in texts])
    assert verdicts == [True, True, False, False, False, False]
    monkeypatch.setattr(rx, "WALK_LIMIT", 3)
    guide = fsm.Guide.from_schema(SEARCHED, smol_tokenizer)
    accepted = [accepts_text(guide.copy(), text, smol_tokenizer) for text in texts]
    assert not any(a and not v for a, v in zip(accepted, verdicts))
    assert accepted[0] is False  # undecided: forbidden
    monkeypatch.undo()
    fsm.guide.INDEXES.clear()
    fresh = fsm.Guide.from_rx(fsm.compile_schema({**SEARCHED, "maxLength": 12}), smol_tokenizer)
    assert accepts_text(fresh, texts[0], smol_tokenizer)

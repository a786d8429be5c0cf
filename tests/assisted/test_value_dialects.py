"""`value` validation reads a schema in the dialect the guide reads (`fsm.schema_dialect`): the declared
draft in any spelling of its URI, 2020-12 without `$schema`, and a refusal for an unknown one."""

from __future__ import annotations

import jsonschema
import pytest

import fsm
from assisted.inputs import parse_value, validator_class
from fsm import rx

D4, D6 = "http://json-schema.org/draft-04/schema", "https://json-schema.org/draft-06/schema#"
D7_HTTPS = "https://json-schema.org/draft-07/schema"  # jsonschema's validator_for would read it as 2020-12


@pytest.mark.parametrize("uri, cls", [(D4, jsonschema.Draft4Validator), (D6, jsonschema.Draft6Validator),
                                      (D7_HTTPS, jsonschema.Draft7Validator),
                                      ("http://json-schema.org/draft/2019-09/schema#", jsonschema.Draft201909Validator),
                                      (None, jsonschema.Draft202012Validator)])
def test_the_validator_is_the_declared_dialects(uri, cls):
    assert validator_class({"type": "integer"} if uri is None else {"$schema": uri, "type": "integer"}) is cls


@pytest.mark.parametrize(
    "schema, valid, invalid",
    [
        ({"$schema": D4, "type": "integer"}, "12345", "12345.0"),  # draft-04: an integer has no fraction
        ({"$schema": D6, "type": "integer"}, "12345.0", "12345.5"),
        (
            {"$schema": D7_HTTPS, "definitions": {"i": {"type": "integer"}}, "$ref": "#/definitions/i", "maximum": 5},
            "9",
            "1.5",
        ),
    ],
)
def test_guide_and_value_agree_on_the_dialect(schema, valid, invalid):
    term = fsm.compile_schema(schema, policy="spec")
    assert rx.matches(term, valid) and not rx.matches(term, invalid)
    assert parse_value(schema, valid, complete=True) == float(valid)
    with pytest.raises(ValueError, match="which the schema rejects"):
        parse_value(schema, invalid, complete=True)


def test_an_unknown_dialect_is_refused_by_value_validation_too():
    with pytest.raises(fsm.SchemaError, match="unknown dialect 'http://example.com/s'"):
        parse_value({"$schema": "http://example.com/s", "type": "integer"}, "1", complete=True)

"""Number bounds compared as jsonschema compares them: a number with a fraction is a binary float there."""

from __future__ import annotations

import json
from decimal import Decimal

import jsonschema
import pytest

import fsm
from fsm import rx
from fsm.float_bounds import bounded_numbers, fraction_texts

BOUNDS = [0.1, 0.5, -0.1, 0, 5, -459.67, 99999999999.99, 0.01, 78.55, 2**53 + 1, 1e-5, 3.3333333333333335, -2.5]
DELTAS = ["0", "1e-20", "-1e-20", "1e-17", "-1e-17", "1e-16", "-1e-16", "0.001", "-0.001", "0.5", "-0.5", "1", "-3"]
KEYWORDS = ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"]


def texts_near(bound) -> set[str]:
    """Decimal texts within a few ulps of `bound`, rounded ones, and the bound's own spellings."""
    out = {"0", "-0", "0.0", "-0.0", "1", "-1", "0.5", repr(float(bound)), str(bound)}
    for delta in DELTAS:
        value = Decimal(bound) + Decimal(delta)
        for spelled in (value, value.quantize(Decimal("1e-3")) if abs(value) < 10**12 else value):
            text = format(spelled, "f")
            out |= {text, text + ".0"} if "." not in text else {text}
    return out


def schemas():
    for bound in BOUNDS:
        for keyword in KEYWORDS:
            for other in (None, ("maximum", 1000), ("minimum", -1000), ("exclusiveMaximum", bound)):
                schema = {keyword: bound}
                if other is not None:
                    schema[other[0]] = other[1]
                yield schema


@pytest.mark.parametrize("schema", list(schemas()), ids=str)
def test_L_only_valid_and_U_every_valid_text(schema):
    lower, upper = bounded_numbers(schema, "#"), bounded_numbers(schema, "#", upper=True)
    validator = jsonschema.Draft202012Validator({"type": "number", **schema})
    for bound in schema.values():
        for text in texts_near(bound):
            valid = validator.is_valid(json.loads(text))
            assert not rx.matches(lower, text) or valid, ("false accept", text)
            spelled_alike = "e" not in text and text != "-0"  # exponents and -0 are added to U by the caller
            assert rx.matches(upper, text) or not valid or not spelled_alike, ("U misses", text)


def test_the_bound_itself_and_round_values_are_accepted():
    for keyword, inside in (("minimum", "0.1"), ("maximum", "0.1"), ("exclusiveMinimum", "0.10000000000000002"),
                            ("exclusiveMaximum", "0.09999999999999999")):
        term = fsm.compile_schema({"type": "number", keyword: 0.1})
        assert rx.matches(term, inside), keyword
    term = fsm.compile_schema({"type": "number", "minimum": 0.5, "maximum": 99999999999.99})
    for text in ("0.5", "1", "1.25", "99999999999.99", "99999999999.989"):
        assert rx.matches(term, text), text
    for text in ("0.49", "99999999999.991", "100000000000"):
        assert not rx.matches(term, text), text


def test_a_decimal_a_float_cannot_tell_from_the_bound_is_rejected():
    term = fsm.compile_schema({"type": "number", "exclusiveMinimum": 0.1})
    assert not rx.matches(term, "0.10000000000000000001")  # the float 0.1: not > 0.1 in jsonschema
    term = fsm.compile_schema({"type": "number", "exclusiveMinimum": 5})
    assert not rx.matches(term, "5.00000000000000000001")


def test_fraction_texts_ends():
    from fractions import Fraction

    half = Fraction(1, 2)
    closed = fraction_texts(-half, half, True, True)
    opened = fraction_texts(-half, half, False, False)
    for text in ("0.5", "-0.5", "0.50", "0.0", "-0.0", "0.4999"):
        assert rx.matches(closed, text), text
    for text in ("0.5", "-0.5", "0.50"):
        assert not rx.matches(opened, text), text
    assert rx.matches(opened, "0.0") and not rx.matches(closed, "0.51") and not rx.matches(closed, "5")

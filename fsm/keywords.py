"""Readers of keyword values that several schema builders share: each checks its value and names the keyword."""

from __future__ import annotations

import math
from fractions import Fraction

from fsm.errors import SchemaError


def natural(schema: dict, keyword: str, pointer: str, default):
    value = schema.get(keyword, default)
    if value is default:
        return value
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise SchemaError(f"must be a non-negative integer, not {value!r}", keyword=keyword, pointer=pointer)
    return value


def numeric_bounds(schema: dict, pointer: str) -> dict:
    keys = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
    bounds = {k: schema[k] for k in keys if k in schema}
    for k, v in bounds.items():  # draft-04's boolean exclusive* are read as numbers (fsm.dialects)
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            raise SchemaError(f"must be a number, not {v!r}", keyword=k, pointer=pointer)
        if isinstance(v, float) and not math.isfinite(v):
            raise SchemaError(f"must be a finite number, not {v!r}", keyword=k, pointer=pointer)
        if isinstance(v, int) and v.bit_length() > MAX_BOUND_BITS:
            raise SchemaError(
                f"bounds of more than {MAX_BOUND_DIGITS} digits are not supported", keyword=k, pointer=pointer
            )
    return bounds


MAX_BOUND_DIGITS = 4000  # Python refuses to print longer integers (sys.get_int_max_str_digits)
MAX_BOUND_BITS = int(MAX_BOUND_DIGITS * 3.32)


def exact_decimal(step) -> tuple[int, int] | None:
    """(m, s) with step = m / 10**s, when floats represent step and its multiples exactly (2.5, 0.25; not 0.1).

    jsonschema divides floats: 0.3 / 0.1 is not an integer there, so only exact steps are safe.
    """
    exact = Fraction(step)
    if exact.denominator & (exact.denominator - 1) or exact.denominator > 8:  # 0.1 is inexact in binary;
        return None  # up to 1/8, every multiple with MAX_MULTIPLE_DIGITS integer digits fits in 53 bits
    decimals = 0
    while (exact * 10**decimals).denominator != 1:
        decimals += 1
    return int(exact * 10**decimals), decimals

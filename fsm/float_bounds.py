"""Number bounds as validators compare them: a JSON number with a fraction is a binary float there.

jsonschema reads `0.10000000000000000001` as the float 0.1, so `exclusiveMinimum: 0.1` rejects it although its
decimal value is larger. Rounding to the nearest float is monotonic, so the float of a decimal v is >= the float f
exactly when v lies above the midpoint between f and the float below it (at the midpoint itself, ties to even
decide: left out of L, kept in U). So the texts with a fraction are an exact decimal interval whose ends are
midpoints of floats (finite decimals, dozens of digits); integers (no fraction) are Python ints, compared exactly.

    L (what surely validates):    fraction texts strictly inside the midpoints, integers in the exact range
    U (what may validate):        fraction texts within the midpoints, ends included
"""

from __future__ import annotations

import math
from fractions import Fraction
from functools import lru_cache

from fsm import json_terms as jt
from fsm import rx
from fsm.errors import SchemaError

DECIMALS = 40  # float texts compare to the midpoints rounded here (inward for L, outward for U): ulps apart above 1e-20
_DIGITS = "0123456789"


def integer_bounds(schema: dict) -> tuple[int | None, int | None]:
    """Inclusive integer bounds from minimum/maximum/exclusiveMinimum/exclusiveMaximum (numbers)."""
    low, high = schema.get("minimum"), schema.get("maximum")
    low = None if low is None else math.ceil(low)
    high = None if high is None else math.floor(high)
    for key, side in (("exclusiveMinimum", 1), ("exclusiveMaximum", -1)):
        value = schema.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            bound = math.floor(value) + 1 if side == 1 else math.ceil(value) - 1
            if side == 1:
                low = bound if low is None else max(low, bound)
            else:
                high = bound if high is None else min(high, bound)
    return low, high


def bounded_numbers(bounds: dict, pointer: str, upper: bool = False) -> rx.Rx:
    """Numbers (no exponent) within `minimum`/`maximum`/`exclusiveMinimum`/`exclusiveMaximum` as jsonschema
    compares them: L (`upper` False: every text valid) or U (`upper` True: every valid text)."""
    low, low_closed = _side(bounds, "minimum", "exclusiveMinimum", -1, upper, pointer)
    high, high_closed = _side(bounds, "maximum", "exclusiveMaximum", 1, upper, pointer)
    fractions = fraction_texts(low, high, low_closed, high_closed)
    return rx.alt(jt.integer_range(*integer_bounds(bounds)), fractions)


def _side(bounds: dict, inclusive: str, exclusive: str, direction: int, upper: bool,
          pointer: str) -> tuple[Fraction | None, bool]:
    """(end, closed) of one side (direction -1: lower, 1: upper) for float texts: the midpoint beyond which a float
    passes every bound of the side, rounded to DECIMALS inward for L (then closed where it moved) or outward for U."""
    limits = []
    for key, strict in ((inclusive, False), (exclusive, True)):
        if key in bounds:
            limits.append(_midpoint(bounds[key], strict, direction, key, pointer))
    if not limits:
        return None, False
    middle = max(limits) if direction < 0 else min(limits)
    scaled = middle * 10**DECIMALS
    inward = math.ceil(scaled) if direction < 0 else math.floor(scaled)
    outward = math.floor(scaled) if direction < 0 else math.ceil(scaled)
    end = Fraction(outward if upper else inward, 10**DECIMALS)
    return end, upper or end != middle


def _midpoint(bound, strict: bool, direction: int, keyword: str, pointer: str) -> Fraction:
    """Lower side: the midpoint between the smallest float >= bound (> if strict) and the float below; mirrored."""
    try:
        f = float(bound)
    except OverflowError:
        f = math.inf if bound > 0 else -math.inf
    exact = Fraction(bound)
    if math.isfinite(f) and ((Fraction(f) - exact) * direction > 0 or (strict and Fraction(f) == exact)):
        f = math.nextafter(f, -direction * math.inf)
    neighbour = math.nextafter(f, direction * math.inf) if math.isfinite(f) else f
    if not (math.isfinite(f) and math.isfinite(neighbour)):
        raise SchemaError(f"bound {bound} is beyond the largest float", keyword=keyword, pointer=pointer)
    return (Fraction(f) + Fraction(neighbour)) / 2


def fraction_texts(low: Fraction | None, high: Fraction | None, low_closed: bool, high_closed: bool) -> rx.Rx:
    """Decimal texts with a fraction (-?N.D+) whose value lies between `low` and `high` (None: unbounded), both
    finite decimals; an end included when it is closed."""
    parts = []
    if high is None or high > 0 or (high_closed and high == 0):  # non-negative texts
        a, a_closed = (None, False) if low is None or low < 0 else (low, low_closed)
        parts.append(_magnitudes(a, high, a_closed, high_closed))
    if low is None or low < 0 or (low_closed and low == 0):  # "-m": low < -m < high, so -high < m < -low
        a, a_closed = (None, False) if high is None or high > 0 else (-high, high_closed)
        b = None if low is None else -low
        parts.append(rx.seq(rx.literal("-"), _magnitudes(a, b, a_closed, low_closed)))
    return rx.alt(*parts)


def _magnitudes(a: Fraction | None, b: Fraction | None, a_closed: bool, b_closed: bool) -> rx.Rx:
    """N.D+ with a < value < b (a, b >= 0 or None; <= at a closed end)."""
    whole_a, whole_b = (None if a is None else math.floor(a)), (None if b is None else math.floor(b))
    digits_a = None if a is None else _fraction_digits(a - whole_a)
    digits_b = None if b is None else _fraction_digits(b - whole_b)
    point = rx.literal(".")
    if whole_a is not None and whole_b is not None and whole_a > whole_b:
        return rx.NOTHING
    if whole_a is not None and whole_a == whole_b:
        return rx.seq(rx.literal(str(whole_a)), point, _nonempty(digits_a, digits_b, a_closed, b_closed))
    parts = []
    first = 0 if whole_a is None else whole_a + 1
    last = None if whole_b is None else whole_b - 1
    if last is None or first <= last:
        parts.append(rx.seq(jt.natural_range(first, last), point, _nonempty(None, None, False, False)))
    if whole_a is not None:
        parts.append(rx.seq(rx.literal(str(whole_a)), point, _nonempty(digits_a, None, a_closed, False)))
    if whole_b is not None:
        parts.append(rx.seq(rx.literal(str(whole_b)), point, _nonempty(None, digits_b, False, b_closed)))
    return rx.alt(*parts)


def _fraction_digits(value: Fraction) -> str:
    """The digits after the point of a finite decimal 0 <= value < 1, without trailing zeros ("" for 0)."""
    digits = []
    while value:
        value *= 10
        digit = math.floor(value)
        digits.append(_DIGITS[digit])
        value -= digit
    return "".join(digits)


@lru_cache(maxsize=4096)
def _nonempty(low: str | None, high: str | None, low_closed: bool, high_closed: bool) -> rx.Rx:
    """Digit strings D (one or more) with 0.low < 0.D < 0.high (None: no bound; <= at a closed end): each first
    digit, then what its bounds leave."""
    groups: dict[tuple, int] = {}
    for d in range(10):
        after = (_after(low, d, -1), _after(high, d, 1))
        if _IMPOSSIBLE not in after:
            groups[after] = groups.get(after, 0) | 1 << (0x30 + d)
    return rx.alt(*(rx.seq(rx.byte_set(mask), _rest(*after, low_closed, high_closed))
                    for after, mask in groups.items()))


_IMPOSSIBLE = "!"


def _after(bound: str | None, digit: int, direction: int) -> str | None:
    """The bound left for the digits after `digit` (None: satisfied; _IMPOSSIBLE: broken). Direction -1: lower."""
    if bound is None:
        return None
    first = int(bound[0]) if bound else 0
    if digit == first:
        return bound[1:]
    return None if (digit - first) * direction < 0 else _IMPOSSIBLE


def _rest(low: str | None, high: str | None, low_closed: bool, high_closed: bool) -> rx.Rx:
    """Digit strings (none or more) within the bounds."""
    digit, zeros = rx.byte_range(0x30, 0x39), rx.star(rx.literal("0"))
    if low is None and high is None:
        return rx.star(digit)
    if high == "":  # 0.D <= 0: zeros only
        return zeros if high_closed and (low is None or (low == "" and low_closed)) else rx.NOTHING
    if low == "" and high is None:  # 0.D > 0 (>= 0 when closed)
        return rx.star(digit) if low_closed else rx.seq(zeros, rx.byte_range(0x31, 0x39), rx.star(digit))
    low_ok = low is None or (low_closed and low == "")  # nothing more: 0 >= 0.low only when low is 0
    high_ok = high is None or high != "" or high_closed  # 0 < 0.high when high is non-zero (no trailing zeros)
    end = rx.EPSILON if low_ok and high_ok else rx.NOTHING
    return rx.alt(end, _nonempty(low, high, low_closed, high_closed))

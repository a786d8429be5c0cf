"""Regex building blocks for JSON text: strings, numbers with exact ranges, formats, literals."""

from __future__ import annotations

import json
import math
import re

NOTHING = "(?!)"  # marks an empty range; callers turn it into a SchemaError

# One JSON string character as written inside quotes: plain, a short escape, or \uXXXX.
PLAIN_CHAR = r'[^"\\\x00-\x1f]'
STRING_CHAR = r'(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})'
STRING = f'"{STRING_CHAR}*"'
INTEGER = r"-?(?:0|[1-9][0-9]*)"
NUMBER = INTEGER + r"(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?"
BOOLEAN = "(?:true|false)"
NULL = "null"

_DAY_28 = "(?:0[1-9]|1[0-9]|2[0-8])"
_YEAR = "(?:[0-9]{3}[1-9]|[0-9]{2}[1-9]0|[0-9][1-9]00|[1-9]000)"  # 0001-9999
_LEAP_YEAR = "(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
_DATE = (
    f"(?:{_YEAR}-(?:(?:0[1-9]|1[0-2])-{_DAY_28}|(?:0[13-9]|1[0-2])-(?:29|30)|(?:0[13578]|1[02])-31)"
    f"|{_LEAP_YEAR}-02-29)"
)
_TIME = r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]{1,9})?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
_OCTET = "(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_LABEL = "[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HEX = "[0-9a-fA-F]"
_URI_CHAR = r"(?:[A-Za-z0-9\-._~!$&'()*+,;=:@/]|%[0-9A-Fa-f]{2})"
_H16 = "[0-9a-fA-F]{1,4}"

# Formats produce a subset of what the format allows, so every output passes a format checker.
FORMATS = {
    "date": _DATE,
    "time": _TIME,
    "date-time": _DATE + "T" + _TIME,
    "uuid": f"{_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{12}}",
    "email": r"[A-Za-z0-9_+\-]+(?:\.[A-Za-z0-9_+\-]+)*@" + _LABEL + r"(?:\." + _LABEL + ")+",
    "uri": r"[A-Za-z][A-Za-z0-9+\-.]*:" + _URI_CHAR + r"*(?:\?" + _URI_CHAR + r"*)?(?:#" + _URI_CHAR + "*)?",
    "ipv4": _OCTET + r"(?:\." + _OCTET + "){3}",
    "ipv6": f"(?:{_H16}:){{7}}{_H16}|::|(?:{_H16}:){{1,7}}:|:(?::{_H16}){{1,7}}",
    "hostname": _LABEL + r"(?:\." + _LABEL + ")*",
    "duration": r"P(?:[0-9]+W|(?:[0-9]+Y)?(?:[0-9]+M)?[0-9]+D|[0-9]+Y(?:[0-9]+M)?|[0-9]+M)"
    r"|P(?:[0-9]+D)?T[0-9]+H(?:[0-9]+M)?(?:[0-9]+S)?",
}


def literal(value) -> str:
    """Regex for exactly one JSON value written compactly (object keys in the value's order)."""
    return re.escape(json.dumps(value, separators=(",", ":"), ensure_ascii=False))


def string_regex(min_length: int, max_length: int | None, lookaheads: list[str]) -> str:
    """A JSON string of min..max characters; `lookaheads` constrain its unescaped content.

    Without lookaheads any escape may appear. With them (pattern, format) the content is written
    without escapes, so each lookahead sees the decoded characters. Each lookahead must have a
    minimum length <= min_length (raise it first), which keeps interegular's intersection in bounds.
    """
    upper = "" if max_length is None else str(max_length)
    if not lookaheads:
        return f'"{STRING_CHAR}{{{min_length},{upper}}}"'
    guards = "".join(f'(?=(?:{inner})".*)' for inner in lookaheads)
    return f'"(?:{guards}{PLAIN_CHAR}{{{min_length},{upper}}}")'


def integer_range(low: int | None, high: int | None) -> str:
    """Exact regex for the integers in [low, high] (None = unbounded), canonical spelling."""
    if low is None and high is None:
        return INTEGER
    parts = []
    if low is None or low < 0:
        magnitude_high = None if low is None else -low
        magnitude_low = 1 if high is None or high >= 0 else -high
        if magnitude_high is None or magnitude_low <= magnitude_high:
            parts.append("-" + _natural_range(magnitude_low, magnitude_high))
    if high is None or high >= 0:
        lo = 0 if low is None else max(low, 0)
        if high is None or lo <= high:
            parts.append(_natural_range(lo, high))
    return _group(parts)


def number_range(low, high, exclusive_low: bool, exclusive_high: bool) -> str:
    """Decimal numbers (no exponent) in the interval; bounds must be integers or None."""
    parts = []
    if low is None or low < 0:  # negative side, as -magnitude with magnitude in [m_low, m_high]
        m_high, m_high_open = (None, False) if low is None else (-low, exclusive_low)
        m_low, m_low_open = (0, True) if high is None or high >= 0 else (-high, exclusive_high)
        parts += ["-" + p for p in _magnitude_range(m_low, m_high, m_low_open, m_high_open)]
    if high is None or high >= 0:
        lo, lo_open = (0, False) if low is None or low < 0 else (low, exclusive_low)
        parts += _magnitude_range(lo, high, lo_open, exclusive_high)
    return _group(parts)


def _magnitude_range(low: int, high: int | None, low_open: bool, high_open: bool) -> list[str]:
    """Non-negative decimals x with low <(=) x <(=) high, as a list of alternatives."""
    any_fraction, zero_fraction = r"(?:\.[0-9]+)?", r"(?:\.0+)?"
    nonzero_fraction = r"\.[0-9]*[1-9][0-9]*"
    parts = []
    if high is not None and high < low or (high == low and (low_open or high_open)):
        return parts
    if high == low:
        return [str(low) + zero_fraction]
    first_whole = low + 1 if low_open else low
    if low_open:
        parts.append(str(low) + nonzero_fraction)
    last_whole = None if high is None else high - 1
    if last_whole is None or first_whole <= last_whole:
        parts.append(_natural_range(first_whole, last_whole) + any_fraction)
    if high is not None and not high_open:
        parts.append(str(high) + zero_fraction)
    return parts


def _natural_range(low: int, high: int | None) -> str:
    """Exact regex for integers in [low, high] >= 0 without leading zeros."""
    parts = []
    top = high if high is not None else 10 ** len(str(low)) - 1
    for digits in range(len(str(low)), len(str(top)) + 1):
        lo = max(low, 10 ** (digits - 1) if digits > 1 else 0)
        hi = min(top, 10**digits - 1)
        if lo <= hi:
            parts.append(_same_length_range(str(lo), str(hi)))
    if high is None:
        parts.append(f"[1-9][0-9]{{{len(str(low))},}}")
    return _group(parts)


def _same_length_range(a: str, b: str) -> str:
    """Regex for the decimal strings between a and b of equal length."""
    if a == b:
        return a
    if a[1:] == "0" * (len(a) - 1) and b[1:] == "9" * (len(b) - 1):
        head = a[0] if a[0] == b[0] else f"[{a[0]}-{b[0]}]"
        return head + (f"[0-9]{{{len(a) - 1}}}" if len(a) > 1 else "")
    if a[0] == b[0]:
        return a[0] + _wrap(_same_length_range(a[1:], b[1:]))
    rest = len(a) - 1
    parts = [a[0] + _wrap(_same_length_range(a[1:], "9" * rest))]
    if int(a[0]) + 1 <= int(b[0]) - 1:
        parts.append(f"[{int(a[0]) + 1}-{int(b[0]) - 1}][0-9]{{{rest}}}")
    parts.append(b[0] + _wrap(_same_length_range("0" * rest, b[1:])))
    return _group(parts)


def integer_bounds(schema: dict) -> tuple[int | None, int | None]:
    """Inclusive integer bounds from minimum/maximum/exclusive* (draft 4 booleans and draft 6+ numbers)."""
    low, high = schema.get("minimum"), schema.get("maximum")
    if low is not None:
        low = math.floor(low) + 1 if schema.get("exclusiveMinimum") is True and low == int(low) else math.ceil(low)
    if high is not None:
        high = math.ceil(high) - 1 if schema.get("exclusiveMaximum") is True and high == int(high) else math.floor(high)
    exclusive_low, exclusive_high = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if _is_number(exclusive_low):
        bound = math.floor(exclusive_low) + 1
        low = bound if low is None else max(low, bound)
    if _is_number(exclusive_high):
        bound = math.ceil(exclusive_high) - 1
        high = bound if high is None else min(high, bound)
    return low, high


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _wrap(regex: str) -> str:
    return regex if len(regex) == 1 or regex.startswith("(?:") and _balanced(regex[3:-1]) else f"(?:{regex})"


def _balanced(inner: str) -> bool:
    depth = 0
    for i, c in enumerate(inner):
        if c == "(" and (i == 0 or inner[i - 1] != "\\"):
            depth += 1
        elif c == ")" and (i == 0 or inner[i - 1] != "\\"):
            depth -= 1
            if depth < 0:
                return False
    return depth == 0


def _group(parts: list[str]) -> str:
    if not parts:
        return NOTHING
    return parts[0] if len(parts) == 1 else "(?:" + "|".join(parts) + ")"

"""JSON text as `rx` terms: strings, numbers (exact integer ranges, multipleOf), literals, any value.

Every term here is a set of JSON texts; the compiler in fsm/schema.py combines them. A string
"character" is one code point, written plainly or as one escape (a surrogate pair is one escape
unit, lone surrogates are left out), so `repeat(STRING_CHAR, n, m)` counts exactly like a validator.
"""

from __future__ import annotations

import json
from functools import lru_cache

from fsm import rx, utf8
from fsm.rx import alt, literal, optional, repeat, seq, star

DIGIT = rx.byte_range(0x30, 0x39)
NONZERO = rx.byte_range(0x31, 0x39)
HEX = alt(DIGIT, rx.byte_range(0x41, 0x46), rx.byte_range(0x61, 0x66))
QUOTE = literal('"')
BACKSLASH = literal("\\")

PLAIN_CHAR = utf8.chars_except([(0, 0x1F), (0x22, 0x22), (0x5C, 0x5C)])  # written as itself in a string


def _set(chars: str) -> rx.Rx:
    return alt(*(literal(c) for c in chars))


_NOT_D = alt(DIGIT, _set("abcefABCEF"))
_HEX4 = alt(seq(_NOT_D, HEX, HEX, HEX), seq(_set("dD"), rx.byte_range(0x30, 0x37), HEX, HEX))  # no surrogates
_PAIR = seq(
    literal("\\u"), _set("dD"), _set("89abAB"), HEX, HEX, literal("\\u"), _set("dD"), _set("cdefCDEF"), HEX, HEX
)
ESCAPE = alt(seq(BACKSLASH, _set('"\\/bfnrt')), seq(literal("\\u"), _HEX4), _PAIR)
STRING_CHAR = alt(PLAIN_CHAR, ESCAPE)
STRING = seq(QUOTE, star(STRING_CHAR), QUOTE)
# Any JSON string at all (lone surrogate escapes too): for over-approximations.
LOOSE_STRING = seq(
    QUOTE, star(alt(PLAIN_CHAR, seq(BACKSLASH, _set('"\\/bfnrt')), seq(literal("\\u"), HEX, HEX, HEX, HEX))), QUOTE
)

NATURAL = alt(literal("0"), seq(NONZERO, star(DIGIT)))
INTEGER = seq(optional(literal("-")), NATURAL)
_FRACTION = seq(literal("."), repeat(DIGIT, 1))
_EXPONENT = seq(_set("eE"), optional(_set("+-")), repeat(DIGIT, 1))
NUMBER = seq(INTEGER, optional(_FRACTION), optional(_EXPONENT))
BOOLEAN = alt(literal("true"), literal("false"))
NULL = literal("null")
SCALAR = alt(STRING, NUMBER, BOOLEAN, NULL)

_DIGITS = [literal(str(d)) for d in range(10)]
MAX_MULTIPLE_DIGITS = 15  # multipleOf automata cover integers up to this many digits (exact in floats)


def string(low: int = 0, high: int | None = None) -> rx.Rx:
    """A JSON string with low..high characters (escapes allowed)."""
    return seq(QUOTE, repeat(STRING_CHAR, low, high), QUOTE)


def value_literal(value) -> rx.Rx:
    """Exactly one JSON value written compactly (object keys in the value's order)."""
    return literal(json.dumps(value, separators=(",", ":"), ensure_ascii=False))


def key(name: str) -> rx.Rx:
    return literal(json.dumps(name, ensure_ascii=False))


def plain_key_except(names) -> rx.Rx:
    """A JSON key written without escapes that differs from every name in `names`."""
    content = rx.inter(star(PLAIN_CHAR), rx.complement(alt(*(literal(n) for n in names))))
    return seq(QUOTE, content, QUOTE)


# -- containers ------------------------------------------------------------------------------------


def delimited(open_: str, close: str, body: rx.Rx, ws: rx.Rx) -> rx.Rx:
    return seq(literal(open_), ws, body, ws, literal(close))


def listing(item: rx.Rx, ws: rx.Rx, low: int = 0, high: int | None = None) -> rx.Rx:
    """low..high copies of `item` separated by commas (the inside of [] or {})."""
    sep = seq(ws, literal(","), ws)
    more = repeat(seq(sep, item), max(low - 1, 0), None if high is None else high - 1)
    some = seq(item, more) if high is None or high >= 1 else rx.NOTHING
    return alt(some, rx.EPSILON) if low == 0 else some


def member(key_term: rx.Rx, value: rx.Rx, ws: rx.Rx) -> rx.Rx:
    return seq(key_term, ws, literal(":"), ws, value)


@lru_cache(maxsize=64)
def any_value(ws: rx.Rx, depth: int | None = None) -> rx.Rx:
    """Any JSON value (strings with escapes, any key order) with arrays/objects nested <= depth (None: any depth).

    Cached, so held: every compile starts from these terms, and a compile's count of new terms (its budget) must not
    depend on whether a garbage collection freed the last compile's copies (terms are interned weakly)."""
    if depth is None:
        return _any_value(ws)
    if depth <= 0:
        return SCALAR
    return _container_or_scalar(any_value(ws, depth - 1), ws)


def _container_or_scalar(inner: rx.Rx, ws: rx.Rx) -> rx.Rx:
    array = delimited("[", "]", listing(inner, ws), ws)
    obj = delimited("{", "}", listing(member(STRING, inner, ws), ws), ws)
    return alt(SCALAR, array, obj)


def _any_value(ws: rx.Rx) -> rx.Rx:
    """Any JSON value at any depth: a call of a rule whose body holds calls of itself in its arrays and objects."""
    rule = rx.Rule("any JSON value")
    value = rx.call(rule, plain=ws.plain)
    rx.define(rule, _container_or_scalar(value, ws))
    problem = rx.check_rule(value)
    if problem is not None:
        raise ValueError(f"any JSON value with whitespace {ws!r}: {problem}")
    return value


def counted(kinds: list[tuple[rx.Rx, int]], ws: rx.Rx, low: int, high: int | None) -> rx.Rx:
    """A comma list of items, each matching a term worth 0 or 1, whose worth sums to low..high."""
    zero = alt(*(t for t, w in kinds if w == 0))
    one = alt(*(t for t, w in kinds if w == 1))
    sep = seq(ws, literal(","), ws)
    zeros_after = star(seq(sep, zero))
    first_one = alt(seq(one, zeros_after), seq(zero, zeros_after, sep, one, zeros_after))
    ones = seq(first_one, repeat(seq(sep, one, zeros_after), max(low - 1, 0), None if high is None else high - 1))
    if high == 0:
        ones = rx.NOTHING
    no_ones = alt(rx.EPSILON, seq(zero, zeros_after)) if low == 0 else rx.NOTHING
    return alt(ones, no_ones)


# -- numbers ---------------------------------------------------------------------------------------


def integer_range(low: int | None, high: int | None) -> rx.Rx:
    """The integers in [low, high] (None = unbounded), canonical spelling, as a term."""
    if low is None and high is None:
        return INTEGER
    parts = []
    if low is None or low < 0:
        magnitude_high = None if low is None else -low
        magnitude_low = 1 if high is None or high >= 0 else -high
        if magnitude_high is None or magnitude_low <= magnitude_high:
            parts.append(seq(literal("-"), natural_range(magnitude_low, magnitude_high)))
    if high is None or high >= 0:
        lo = 0 if low is None else max(low, 0)
        if high is None or lo <= high:
            parts.append(natural_range(lo, high))
    return alt(*parts)


def natural_range(low: int, high: int | None) -> rx.Rx:
    """Integers in [low, high] >= 0 without leading zeros; O(number of digits) terms."""
    a = str(low)
    b = str(high) if high is not None else "9" * len(a)
    if len(a) == len(b):
        parts = [_same_length(a, b)]
    else:
        parts = [_same_length(a, "9" * len(a)), _same_length("1" + "0" * (len(b) - 1), b)]
        if len(b) - len(a) > 1:  # every number with a length strictly between
            parts.append(seq(NONZERO, repeat(DIGIT, len(a), len(b) - 2)))
    if high is None:
        parts.append(seq(NONZERO, repeat(DIGIT, len(a))))
    return alt(*parts)


def _same_length(a: str, b: str) -> rx.Rx:
    """Decimal strings of equal length between a <= b: a common prefix, then one digit that differs."""
    i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
    if i == len(a):
        return literal(a)
    rest = len(a) - i - 1
    middle = (
        seq(rx.byte_range(ord(a[i]) + 1, ord(b[i]) - 1), repeat(DIGIT, rest, rest))
        if int(b[i]) - int(a[i]) > 1
        else rx.NOTHING
    )
    return seq(
        literal(a[:i]), alt(seq(literal(a[i]), _at_least(a[i + 1 :])), middle, seq(literal(b[i]), _at_most(b[i + 1 :])))
    )


def _at_least(a: str) -> rx.Rx:
    """Decimal strings of len(a) digits >= a, built from the last digit back (no recursion)."""
    out = rx.EPSILON
    for k in range(len(a) - 1, -1, -1):
        rest = len(a) - k - 1
        out = alt(seq(literal(a[k]), out), seq(rx.byte_range(ord(a[k]) + 1, 0x39), repeat(DIGIT, rest, rest)))
    return out


def _at_most(b: str) -> rx.Rx:
    """Decimal strings of len(b) digits <= b, built from the last digit back (no recursion)."""
    out = rx.EPSILON
    for k in range(len(b) - 1, -1, -1):
        rest = len(b) - k - 1
        out = alt(seq(literal(b[k]), out), seq(rx.byte_range(0x30, ord(b[k]) - 1), repeat(DIGIT, rest, rest)))
    return out


@lru_cache(maxsize=256)
def multiple_of(step: int, integer: bool, decimals: int = 0) -> rx.Rx:
    """Numbers x with x * 10**decimals divisible by `step` (up to MAX_MULTIPLE_DIGITS integer digits):
    a mod-`step` automaton unrolled over digit positions. `integer` False also allows a fraction
    (its first `decimals` digits count, the rest must be zeros)."""
    @lru_cache(maxsize=None)
    def fraction(remainder: int, left: int, first: bool) -> rx.Rx:  # after the point, `left` digits still count
        if left == 0:
            return repeat(literal("0"), 1 if first else 0) if remainder == 0 else rx.NOTHING
        digits = [seq(_DIGITS[d], fraction((remainder * 10 + d) % step, left - 1, False)) for d in range(10)]
        done = rx.EPSILON if not first and remainder * 10**left % step == 0 else rx.NOTHING
        return alt(done, *digits)

    @lru_cache(maxsize=None)
    def whole(remainder: int) -> rx.Rx:  # what may follow an integer part with this remainder
        end = rx.EPSILON if remainder * 10**decimals % step == 0 else rx.NOTHING
        return end if integer else alt(end, seq(literal("."), fraction(remainder, decimals, True)))

    n = MAX_MULTIPLE_DIGITS
    naturals = [seq(literal("0"), whole(0))]
    for first in range(1, 10):  # unroll the integer digits, then hand over to `whole`
        naturals.append(seq(literal(str(first)), _digits(first % step, n - 1, step, whole)))
    return seq(optional(literal("-")), alt(*naturals))


def _digits(remainder: int, left: int, step: int, then, memo=None) -> rx.Rx:
    """More integer digits (at most `left`), tracking the remainder mod `step`, then `then(remainder)`."""
    memo = {} if memo is None else memo
    if (remainder, left) not in memo:
        more = (
            [seq(_DIGITS[d], _digits((remainder * 10 + d) % step, left - 1, step, then, memo)) for d in range(10)]
            if left
            else []
        )
        memo[remainder, left] = alt(then(remainder), *more)
    return memo[remainder, left]


# -- every spelling of a string (for over-approximations) -----------------------------------------

_SHORT = {'"': '"', "\\": "\\", "/": "/", "\b": "b", "\f": "f", "\n": "n", "\r": "r", "\t": "t"}


@lru_cache(maxsize=4096)
def spellings(text: str) -> rx.Rx:
    """Every way to write the content of the JSON string `text` (plain, short or \\u escapes)."""
    return seq(*(_char_spellings(c) for c in text))


@lru_cache(maxsize=4096)
def _char_spellings(c: str) -> rx.Rx:
    options = [] if c in '"\\' or ord(c) < 0x20 else [literal(c)]
    if c in _SHORT:
        options.append(literal("\\" + _SHORT[c]))
    units = c.encode("utf-16-be")
    hexes = [f"{int.from_bytes(units[i:i + 2], 'big'):04x}" for i in range(0, len(units), 2)]
    options.append(seq(*(seq(literal("\\u"), *(_hex_digit(h) for h in unit)) for unit in hexes)))
    return alt(*options)


def _hex_digit(h: str) -> rx.Rx:
    return alt(literal(h), literal(h.upper()))

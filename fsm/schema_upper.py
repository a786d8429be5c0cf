"""Over-approximation U(S): a term containing every JSON text (in the compiler's whitespace policy)
that is valid under S. Ignoring a keyword is always safe here, so U only follows the keywords that
make `not`, `oneOf` and `if` useful: types, constants, string patterns, required keys with their values.

    L(not S) = L(rest) ∩ ¬U(S)        U(not S) = ¬L(S)
"""

from __future__ import annotations

from fsm import json_terms as jt
from fsm import rx
from fsm.budget import GuideBudgetError
from fsm.dialects import WHOLE_INTEGERS
from fsm.errors import SchemaError
from fsm.float_bounds import bounded_numbers
from fsm.keywords import exact_decimal, numeric_bounds
from fsm.patterns import pattern_upper
from fsm.upper_objects import object_upper
from fsm.utf8 import ANY_CHAR

ANY = rx.ANYTHING
MAX_OPTIONAL = 8  # properties not required whose values U checks where present (each costs an intersection)
OBJECT = rx.seq(rx.literal("{"), ANY)
ARRAY = rx.seq(rx.literal("["), ANY)
ESCAPED_STRING = rx.inter(jt.LOOSE_STRING, rx.seq(ANY, jt.BACKSLASH, ANY))
UPPER_TYPES = {"null": jt.NULL, "boolean": jt.BOOLEAN, "array": ARRAY}
_EXPONENT_FORMS = rx.inter(jt.NUMBER, rx.seq(ANY, rx.alt(rx.literal("e"), rx.literal("E")), ANY))
_NEGATIVE_ZERO = rx.seq(rx.literal("-0"), rx.optional(rx.seq(rx.literal("."), rx.repeat(rx.literal("0"), 1))))
INTEGER_SPELLINGS = rx.alt(
    jt.INTEGER, rx.seq(jt.INTEGER, rx.literal("."), rx.repeat(rx.literal("0"), 1)), _EXPONENT_FORMS
)


class Upper:
    """U for the schemas of one compiler (same root, whitespace and L for `not` inside)."""

    def __init__(self, compiler):
        self.c, self.memo, self.active = compiler, {}, set()

    def __call__(self, schema, pointer: str) -> rx.Rx:
        if schema is True or schema == {} or not isinstance(schema, (dict, bool)):
            return ANY
        if schema is False:
            return rx.NOTHING
        if "$ref" in schema:  # drafts up to 7 ignore its siblings: U of the target alone is safe for all
            return self._ref(schema["$ref"], pointer)
        parts = [self._typed(schema)]
        parts += [self(s, pointer) for s in _list(schema.get("allOf"))]
        for keyword in ("anyOf", "oneOf"):
            if _list(schema.get(keyword)):
                parts.append(rx.alt(*(self(s, pointer) for s in schema[keyword])))
        if "not" in schema:
            parts.append(self._negated(schema["not"], pointer))
        if "if" in schema:
            parts.append(rx.alt(self(schema.get("then", True), pointer), self(schema.get("else", True), pointer)))
        if "const" in schema or isinstance(schema.get("enum"), list):
            values = [schema["const"]] if "const" in schema else schema["enum"]
            parts.append(rx.alt(*(_value(v) for v in values)))
        return rx.inter(*parts)

    def _ref(self, ref, pointer: str) -> rx.Rx:
        if not isinstance(ref, str) or ref in self.active:
            return ANY  # a cycle: anything is a safe over-approximation
        try:
            target = self.c.resolve(ref, pointer)  # every time: a $ref across dialects is refused by its pointer
        except SchemaError:
            return ANY
        if ref not in self.memo:
            self.active.add(ref)
            try:
                self.memo[ref] = self(target, ref)
            finally:
                self.active.discard(ref)
        return self.memo[ref]

    def _negated(self, schema, pointer: str) -> rx.Rx:
        try:
            return rx.complement(self.c.compile(schema, f"{pointer}/not"))
        except GuideBudgetError:
            raise
        except SchemaError:
            return ANY

    def _typed(self, schema: dict) -> rx.Rx:
        types = schema.get("type", ["null", "boolean", "array", "string", "object", "number"])
        types = [types] if isinstance(types, str) else types if isinstance(types, list) else []
        build = {
            "string": self._string,
            "object": self._object,
            "number": lambda s: rx.inter(_number(s), _multiple(s)),
            "integer": lambda s: rx.inter(
                _number(s), _multiple(s), jt.INTEGER if s.get(WHOLE_INTEGERS) else INTEGER_SPELLINGS
            ),
        }
        return rx.alt(*(build[t](schema) if t in build else UPPER_TYPES.get(t, ANY) for t in types)) if types else ANY

    def _string(self, schema: dict) -> rx.Rx:
        patterns = schema.get("pattern", [])
        content = [pattern_upper(p) for p in (patterns if isinstance(patterns, list) else [patterns])]
        low, high = schema.get("minLength", 0), schema.get("maxLength")
        if isinstance(low, int) and (high is None or isinstance(high, int)):
            content.append(rx.repeat(ANY_CHAR, low, high))
        plain = rx.seq(jt.QUOTE, rx.inter(rx.star(jt.PLAIN_CHAR), *content), jt.QUOTE)
        return rx.alt(plain, ESCAPED_STRING)  # lengths and patterns are not checked through escapes

    def _object(self, schema: dict) -> rx.Rx:
        """Objects with each required key at the top level followed by a value in its U, and each other declared
        key (up to MAX_OPTIONAL whose U says something) absent there or followed by a value in its U."""
        properties = schema.get("properties", {}) if isinstance(schema.get("properties"), dict) else {}
        names = [n for n in _list(schema.get("required")) if isinstance(n, str)]
        required = [(_key(n), self(properties.get(n, True), "#")) for n in dict.fromkeys(names)]
        optional = []
        for name, sub in properties.items():
            value = self(sub, "#") if name not in names and len(optional) < MAX_OPTIONAL else ANY
            if value is not ANY:
                optional.append((_key(name), value))
        return object_upper(required, optional, self.c.ws)


def _key(name: str) -> rx.Rx:
    """Every spelling of the key `name`, quoted."""
    return rx.seq(jt.QUOTE, jt.spellings(name), jt.QUOTE)


def _number(schema: dict) -> rx.Rx:
    """Numbers within the bounds as jsonschema compares them (any spelling), else any number."""
    try:
        bounds = numeric_bounds(schema, "#")
        if not bounds:
            return jt.NUMBER
        within = bounded_numbers(bounds, "#", upper=True)
    except SchemaError:
        return jt.NUMBER
    return rx.alt(within, _EXPONENT_FORMS, _NEGATIVE_ZERO)


def _multiple(schema: dict) -> rx.Rx:
    """Multiples of `multipleOf` (the exact automaton, plus what it leaves out: long numbers, exponents)."""
    step = schema.get("multipleOf")
    if isinstance(step, bool) or not isinstance(step, (int, float)) or step <= 0 or exact_decimal(step) is None:
        return ANY
    m, decimals = exact_decimal(step)
    if m > 1000:
        return ANY
    long = rx.seq(rx.optional(rx.literal("-")), jt.NONZERO, rx.repeat(jt.DIGIT, jt.MAX_MULTIPLE_DIGITS), ANY)
    return rx.alt(jt.multiple_of(m, False, decimals), long, _EXPONENT_FORMS)


def _value(value) -> rx.Rx:
    """Every spelling of `value` (coarse for numbers, arrays and objects)."""
    if value is None or isinstance(value, bool):
        return jt.value_literal(value)
    if isinstance(value, str):
        return rx.seq(jt.QUOTE, jt.spellings(value), jt.QUOTE)
    if isinstance(value, (int, float)):
        return _number_spellings(value)
    return ARRAY if isinstance(value, list) else OBJECT


def _number_spellings(value: int | float) -> rx.Rx:
    """Every decimal spelling of a number (trailing zeros, -0) plus every exponent form."""
    text = str(int(value)) if float(value).is_integer() and abs(value) < 1e16 else jt.json.dumps(value)
    if "e" in text or "inf" in text.lower() or "nan" in text.lower():
        return jt.NUMBER
    zeros = rx.star(rx.literal("0"))
    decimal = rx.seq(
        rx.literal(text), rx.seq(rx.literal("."), rx.repeat(rx.literal("0"), 1)) if "." not in text else zeros
    )
    return rx.alt(rx.literal(text), decimal, _EXPONENT_FORMS, _NEGATIVE_ZERO if value == 0 else rx.NOTHING)


def _list(value) -> list:
    return value if isinstance(value, list) else []

"""Typed schemas -> terms: scalars, strings, numbers, arrays; `enum`/`const`; `dependencies` by cases."""

from __future__ import annotations

import json

from fsm import json_terms as jt
from fsm import rx
from fsm.budget import GuideBudgetError
from fsm.dialects import WHOLE_INTEGERS
from fsm.errors import SchemaError
from fsm.formats import format_term
from fsm.float_bounds import bounded_numbers, integer_bounds
from fsm.keywords import exact_decimal, natural, numeric_bounds
from fsm.patterns import pattern_term
from fsm.schema_arrays import type_array
from fsm.schema_objects import type_object
from fsm.utf8 import ANY_CHAR

ALL_TYPES = ("object", "array", "string", "integer", "number", "boolean", "null")
MAX_MULTIPLE = 1000  # larger multipleOf steps raise (the automaton has step x digits states)
MAX_DEPENDENCY_CASES = 16


def typed(c, schema: dict, pointer: str) -> rx.Rx:
    types = schema.get("type")
    if types is None:  # every type, as validators read it (keywords constrain only their own type)
        types = list(ALL_TYPES)
    types = [types] if isinstance(types, str) else types
    if not isinstance(types, list) or not types:
        raise SchemaError(f"must be a type name or a non-empty list of them, not {types!r}", keyword="type",
                          pointer=pointer)
    unknown = [t for t in types if not isinstance(t, str) or t not in ALL_TYPES]
    if unknown:
        raise SchemaError(
            f"unknown type {unknown[0]!r} (known: {', '.join(ALL_TYPES)})", keyword="type", pointer=pointer
        )
    if "integer" in types and "number" in types:
        types = [t for t in types if t != "integer"]
    build = {
        "null": lambda *_: jt.NULL,
        "boolean": lambda *_: jt.BOOLEAN,
        "string": type_string,
        "integer": type_integer,
        "number": type_number,
        "array": type_array,
        "object": type_object,
    }
    return rx.alt(*(build[t](c, schema, pointer) for t in types))


def constants(c, schema: dict, pointer: str) -> rx.Rx:
    """The listed values that the other keywords' term also matches."""
    keyword = "const" if "const" in schema else "enum"
    values = [schema["const"]] if keyword == "const" else schema["enum"]
    if not isinstance(values, list) or (keyword == "enum" and not values):
        raise SchemaError("must be a non-empty array", keyword=keyword, pointer=pointer)
    rest = {k: v for k, v in schema.items() if k not in ("enum", "const")}
    check = c.compile(rest, pointer) if rest else None
    texts = {json.dumps(v, separators=(",", ":"), ensure_ascii=False): v for v in values}
    if check is not None and c.whole_integers:  # draft-04: enum [1.0] holds 1, but 1.0 is no integer
        return rx.alt(*(rx.inter(value_spellings(v), check) for v in texts.values()))
    return rx.alt(*(value_spellings(v) for t, v in texts.items() if check is None or rx.matches(check, t)))


def value_spellings(value) -> rx.Rx:
    """The compact texts of `value` with every number spelled as the same value may be (1, 1.0, 1.00;
    2.5, 2.50): validators compare numbers by value. Strings and keys are written one way."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return jt.value_literal(value)
    if isinstance(value, (int, float)):
        return _number_spellings(value)
    if isinstance(value, list):
        inner = [value_spellings(v) for v in value]
        items = [x for i, v in enumerate(inner) for x in ((rx.literal(","),) if i else ()) + (v,)]
        return rx.seq(rx.literal("["), *items, rx.literal("]"))
    if isinstance(value, dict):
        members = [rx.seq(jt.key(k), rx.literal(":"), value_spellings(v)) for k, v in value.items()]
        items = [x for i, m in enumerate(members) for x in ((rx.literal(","),) if i else ()) + (m,)]
        return rx.seq(rx.literal("{"), *items, rx.literal("}"))
    return jt.value_literal(value)


ZERO_FRACTION = rx.seq(rx.literal("."), rx.repeat(rx.literal("0"), 1))  # 1.0, 1.00: the same integer


def _number_spellings(value: int | float) -> rx.Rx:
    text = json.dumps(value)
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        text = str(int(value))
    if "e" in text or "n" in text.lower():  # exponent forms, inf, nan: as written
        return rx.literal(text)
    if "." in text:
        return rx.seq(rx.literal(text), rx.star(rx.literal("0")))
    spelled = rx.seq(rx.literal(text), rx.optional(ZERO_FRACTION))
    return rx.alt(spelled, rx.seq(rx.literal("-0"), rx.optional(ZERO_FRACTION))) if text == "0" else spelled


def dependencies(c, schema: dict, pointer: str) -> rx.Rx:
    """dependentRequired / dependentSchemas / dependencies as a union of cases: trigger absent | present."""
    rules = {
        **schema.get("dependencies", {}),
        **schema.get("dependentRequired", {}),
        **schema.get("dependentSchemas", {}),
    }
    rest = {k: v for k, v in schema.items() if k not in ("dependencies", "dependentRequired", "dependentSchemas")}
    required = set(rest.get("required", []))
    cases = [rest]
    for name, rule in rules.items():
        if not isinstance(rule, (list, dict, bool)):
            raise SchemaError("must be an array of names or a schema", keyword="dependencies", pointer=pointer)
        present = ({"required": rule} if isinstance(rule, list) else rule)
        if name in required:
            cases = [{"allOf": [case, present]} for case in cases]
        else:
            absent = {"properties": {name: False}}
            present = {"allOf": [{"required": [name]}, present]}
            cases = [{"allOf": [case, part]} for case in cases for part in (absent, present)]
        if len(cases) > MAX_DEPENDENCY_CASES:
            raise SchemaError("too many dependencies to split into cases", keyword="dependencies", pointer=pointer)
    return rx.alt(*(c.compile(case, pointer) for case in cases))


# -- strings and numbers ---------------------------------------------------------------------------


def type_string(c, schema: dict, pointer: str) -> rx.Rx:
    low = natural(schema, "minLength", pointer, 0)
    high = natural(schema, "maxLength", pointer, None)
    if high is not None and low > high:
        raise SchemaError(
            f"no string is between {low} and {high} characters long", keyword="maxLength", pointer=pointer
        )
    patterns = schema.get("pattern", [])
    content = [pattern_term(p, pointer) for p in (patterns if isinstance(patterns, list) else [patterns])]
    if "format" in schema:
        content += _format(c, schema["format"], pointer)
    if not content:
        return jt.string(low, high)
    inside = rx.inter(rx.star(jt.PLAIN_CHAR), rx.repeat(ANY_CHAR, low, high), *content)  # no escapes
    if patterns and proved_empty(inside) and not proved_empty(rx.inter(rx.repeat(ANY_CHAR, low, high), *content)):
        raise SchemaError("matches only strings with a character JSON must escape ('\"', '\\' or a control "
                          "character); patterns over escaped characters are not supported", keyword="pattern",
                          pointer=pointer)
    return rx.seq(jt.QUOTE, inside, jt.QUOTE)


def proved_empty(term: rx.Rx, limit: int = 2_000) -> bool:
    """True only when a bounded search proves `term` empty (False when unsure)."""
    try:
        return rx.is_empty(term, limit=limit)
    except GuideBudgetError:
        raise
    except ValueError:
        return False


def _format(c, name, pointer: str) -> list[rx.Rx]:
    if not isinstance(name, str):
        raise SchemaError(f"must be a string, not {name!r}", keyword="format", pointer=pointer)
    try:
        term = format_term(name)
    except KeyError:
        raise SchemaError(
            f"format {name!r} is checked by validators but not supported", keyword="format", pointer=pointer
        ) from None
    if term is None:
        c.notes.append(f"format {name!r} ignored at {pointer} (validators ignore it)")
        return []
    return [term]


def type_integer(c, schema: dict, pointer: str) -> rx.Rx:
    low, high = integer_bounds(numeric_bounds(schema, pointer))
    term = jt.integer_range(low, high)
    if term is rx.NOTHING:
        raise SchemaError("no integer satisfies the bounds", keyword="minimum", pointer=pointer)
    fraction = rx.EPSILON if schema.get(WHOLE_INTEGERS) else rx.optional(ZERO_FRACTION)  # 1.0: not in draft-04
    if any(abs(b) > 2**53 for b in (low, high) if b is not None):  # N.0 is a float there, rounded past the bound
        fraction = rx.EPSILON
    return rx.seq(rx.inter(term, _multiple(schema, pointer, integer=True)), fraction)


def type_number(c, schema: dict, pointer: str) -> rx.Rx:
    bounds = numeric_bounds(schema, pointer)
    term = jt.NUMBER
    if bounds:  # compared as jsonschema does: texts with a fraction as binary floats
        term = bounded_numbers(bounds, pointer)
        if term is rx.NOTHING:
            raise SchemaError("no number satisfies the bounds", keyword="minimum", pointer=pointer)
    return rx.inter(term, _multiple(schema, pointer, integer=False))


def _multiple(schema: dict, pointer: str, integer: bool) -> rx.Rx:
    step = schema.get("multipleOf")
    if step is None:
        return rx.ANYTHING
    if isinstance(step, bool) or not isinstance(step, (int, float)) or step <= 0:
        raise SchemaError(f"must be a positive number, not {step!r}", keyword="multipleOf", pointer=pointer)
    if integer and isinstance(step, float) and (1 / step).is_integer():
        return rx.ANYTHING  # every integer is a multiple of 1/n
    scaled = exact_decimal(step)  # (m, s): step = m / 10**s exactly, and a binary fraction
    if scaled is not None and scaled[0] <= MAX_MULTIPLE:
        m, decimals = scaled
        return rx.ANYTHING if (m, decimals) == (1, 0) and integer else jt.multiple_of(m, integer, decimals)
    raise SchemaError(
        f"multipleOf {step} is not supported (steps m/10^s up to m={MAX_MULTIPLE} that floats hold exactly)",
        keyword="multipleOf",
        pointer=pointer,
    )



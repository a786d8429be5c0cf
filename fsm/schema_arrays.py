"""Array schemas -> terms: prefixItems/items, lengths, contains/minContains/maxContains, uniqueItems."""

from __future__ import annotations

import json

from fsm import json_terms as jt
from fsm import rx
from fsm.errors import SchemaError
from fsm.keywords import natural

MAX_UNIQUE_CHOICES = 8  # uniqueItems over a finite item set: one term per subset of used values


def type_array(c, schema: dict, pointer: str) -> rx.Rx:
    items = schema.get("items")
    tuple_form = isinstance(items, list)
    prefix = schema.get("prefixItems", items if tuple_form else [])
    rest = schema.get("additionalItems", True) if tuple_form else (True if items is None else items)
    low, high = natural(schema, "minItems", pointer, 0), natural(schema, "maxItems", pointer, None)
    if high is not None and low > high:
        raise SchemaError(f"minItems {low} > maxItems {high}", keyword="minItems", pointer=pointer)
    prefix_terms = [c.compile(s, f"{pointer}/prefixItems/{i}") for i, s in enumerate(prefix)]
    rest_term = c.compile(rest, f"{pointer}/items")
    if schema.get("uniqueItems") is True and (high is None or high > 1):
        body = _unique(c, prefix, rest, low, high, pointer)
    else:
        body = sequence(prefix_terms, rest_term, low, high, c.ws)
    term = jt.delimited("[", "]", body, c.ws)
    if "contains" in schema:
        term = rx.inter(term, _contains(c, schema, pointer))
    return term


def sequence(prefix: list[rx.Rx], rest: rx.Rx, low: int, high: int | None, ws: rx.Rx) -> rx.Rx:
    """The inside of `[...]`: prefix items in order, then `rest` items, low..high in all."""
    n, sep = len(prefix), rx.seq(ws, rx.literal(","), ws)
    if high == 0:
        return rx.EPSILON
    if n == 0:
        body = rx.seq(rest, rx.repeat(rx.seq(sep, rest), max(low - 1, 0), None if high is None else high - 1))
        return rx.alt(body, rx.EPSILON) if low == 0 else body
    after = rx.repeat(rx.seq(sep, rest), max(low - n, 0), None if high is None else high - n)  # after n items
    for k in range(n - 1, 0, -1):  # after: what may follow the first k items
        stop = rx.EPSILON if low <= k and (high is None or k <= high) else rx.NOTHING
        after = rx.alt(stop, rx.seq(sep, prefix[k], after))
    body = rx.seq(prefix[0], after)
    return rx.alt(body, rx.EPSILON) if low == 0 else body


def _contains(c, schema: dict, pointer: str) -> rx.Rx:
    """Arrays with minContains..maxContains items valid under `contains` (counted exactly or safely)."""
    low = natural(schema, "minContains", pointer, 1)
    high = natural(schema, "maxContains", pointer, None)
    sure = c.compile(schema["contains"], f"{pointer}/contains")  # surely valid under contains
    maybe = c.upper(schema["contains"], f"{pointer}/contains")  # everything that might be valid
    any_item = c.skeleton
    at_least = jt.counted([(sure, 1), (any_item, 0)], c.ws, low, None)
    at_most = jt.counted([(rx.inter(any_item, rx.complement(maybe)), 0), (any_item, 1)], c.ws, 0, high)
    return jt.delimited("[", "]", rx.inter(at_least, at_most) if high is not None else at_least, c.ws)


def _unique(c, prefix: list, rest, low: int, high: int | None, pointer: str) -> rx.Rx:
    """uniqueItems when every item is one of a few scalar constants: no constant twice."""
    values = _finite_scalars(c, rest) if not prefix else None
    if values is None or len(values) > MAX_UNIQUE_CHOICES:
        raise SchemaError(
            "uniqueItems is supported only for items from at most "
            f"{MAX_UNIQUE_CHOICES} scalar constants (or maxItems <= 1)",
            keyword="uniqueItems",
            pointer=pointer,
        )
    sep, memo = rx.seq(c.ws, rx.literal(","), c.ws), {}

    def more(used: frozenset, count: int) -> rx.Rx:  # what may follow `count` distinct items
        if used not in memo:
            stop = rx.EPSILON if count >= low else rx.NOTHING
            room = high is None or count < high
            memo[used] = rx.alt(
                stop,
                *(rx.seq(sep, rx.literal(v), more(used | {v}, count + 1)) for v in values if room and v not in used),
            )
        return memo[used]

    first = rx.alt(*(rx.seq(rx.literal(v), more(frozenset([v]), 1)) for v in values)) if high != 0 else rx.NOTHING
    return rx.alt(first, rx.EPSILON) if low == 0 else first


def _finite_scalars(c, schema) -> list[str] | None:
    """The compact texts of the values `schema` allows when they are a few distinct scalars, else None."""
    if not isinstance(schema, dict):
        return None
    if "$ref" in schema and len(schema) == 1:
        return _finite_scalars(c, c.resolve(schema["$ref"], "#"))
    if schema.get("type") == "boolean" and set(schema) <= {"type", "description", "title"}:
        return ["true", "false"]
    values = [schema["const"]] if "const" in schema else schema.get("enum")
    if not isinstance(values, list) or any(isinstance(v, (dict, list, float)) for v in values):
        return None
    term = c.compile(schema, "#")
    texts = [json.dumps(v, ensure_ascii=False) for v in values]
    return [t for t in dict.fromkeys(texts) if rx.matches(term, t)]

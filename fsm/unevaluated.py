"""`unevaluatedProperties` / `unevaluatedItems` -> plain keywords, exactly (2020-12 core 11.2, 11.3).

A property (item) is evaluated when the schema itself or one of its *successful* in-place applicators
(`allOf`, `$ref`, ...) annotates it; siblings never see each other's annotations. Where every in-place
applicator below the keyword always succeeds when the whole schema does (`allOf` and `$ref`; `not`
contributes nothing), the evaluated set is a fixed union of names, patterns and prefix lengths:

    unevaluatedProperties: S  ->  allOf part {properties: {n: true}, patternProperties: {p: true},
                                              additionalProperties: S}
    unevaluatedItems: S       ->  allOf part {prefixItems: [true] * n, items: S}

Conditional applicators (`anyOf`, `oneOf`, `if`/`then`/`else`, `dependentSchemas`, `contains` for items)
that annotate something make the set depend on the instance: those raise `SchemaError` naming the
keyword and its pointer.
"""

from __future__ import annotations

from typing import NamedTuple

from fsm.errors import SchemaError

KEYWORDS = ("unevaluatedProperties", "unevaluatedItems")


class _Seen(NamedTuple):
    names: dict  # property names (ordered)
    patterns: dict  # patternProperties patterns (ordered)
    prefix: int  # items annotated by position
    everything: bool  # every property (item) is evaluated


def close_unevaluated(schema, pointer: str, resolve):
    """`schema` with its own unevaluated* keywords replaced by equivalent allOf parts (or SchemaError)."""
    if not isinstance(schema, dict) or not any(k in schema for k in KEYWORDS):
        return schema
    rest = {k: v for k, v in schema.items() if k not in KEYWORDS}
    parts = [rest]
    for keyword in KEYWORDS:
        if keyword not in schema:
            continue
        seen = _collect(rest, keyword, pointer, resolve, set())
        if seen.everything:
            continue
        if keyword == "unevaluatedProperties":
            parts.append(
                {
                    "properties": {n: True for n in seen.names},
                    "patternProperties": {p: True for p in seen.patterns},
                    "additionalProperties": schema[keyword],
                }
            )
        else:
            parts.append({"prefixItems": [True] * seen.prefix, "items": schema[keyword]})
    return {"allOf": parts} if len(parts) > 1 else rest


def _collect(schema, keyword: str, pointer: str, resolve, refs: set) -> _Seen:
    """What `schema` and its unconditional in-place applicators evaluate."""
    if not isinstance(schema, dict):
        return _Seen({}, {}, 0, False)
    seen = _own(schema, keyword)
    children = list(schema.get("allOf", [])) if isinstance(schema.get("allOf"), list) else []
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref not in refs:
        refs.add(ref)
        children.append(resolve(ref, pointer))
    for child in children:
        seen = _union(seen, _collect(child, keyword, pointer, resolve, refs))
    for name, child in _conditional(schema, keyword):
        if _collect(child, keyword, pointer, resolve, refs) != NOTHING_SEEN:
            raise SchemaError(f"which members count as evaluated depends on the instance through {name!r}, "
                              "which is not supported", keyword=keyword, pointer=pointer)
    return seen


def _conditional(schema: dict, keyword: str):
    """(keyword, subschema) for the in-place applicators whose annotations count only when they succeed."""
    for name in ("$dynamicRef", "$recursiveRef"):
        if name in schema:
            yield name, {keyword: True}  # unknown target: assume it evaluates something
    for name in ("anyOf", "oneOf"):
        for child in schema.get(name, []) if isinstance(schema.get(name), list) else []:
            yield name, child
    for name in ("if", "then", "else"):
        if name in schema:
            yield name, schema[name]
    for name in ("dependentSchemas", "dependencies"):
        rules = schema.get(name)
        for child in rules.values() if isinstance(rules, dict) else []:
            if isinstance(child, dict):
                yield name, child
    if keyword == "unevaluatedItems" and "contains" in schema:
        yield "contains", {keyword: True}


def _own(schema: dict, keyword: str) -> _Seen:
    if keyword in schema:  # a nested unevaluated* that succeeded has evaluated everything left
        return _Seen({}, {}, 0, True)
    if keyword == "unevaluatedProperties":
        names = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        patterns = schema.get("patternProperties") if isinstance(schema.get("patternProperties"), dict) else {}
        return _Seen(dict.fromkeys(names), dict.fromkeys(patterns), 0, "additionalProperties" in schema)
    items = schema.get("items")
    if "prefixItems" in schema:
        return _Seen({}, {}, len(schema["prefixItems"]), "items" in schema)
    if isinstance(items, list):
        return _Seen({}, {}, len(items), "additionalItems" in schema)
    return _Seen({}, {}, 0, "items" in schema)


NOTHING_SEEN = _Seen({}, {}, 0, False)


def _union(a: _Seen, b: _Seen) -> _Seen:
    return _Seen(
        {**a.names, **b.names}, {**a.patterns, **b.patterns}, max(a.prefix, b.prefix), a.everything or b.everything
    )

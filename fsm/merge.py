"""`allOf` merging and local `$ref` resolution for the schema compiler."""

from __future__ import annotations

import json
from urllib.parse import unquote

from fsm.errors import SchemaError

_LOWER = ("minimum", "minLength", "minItems", "exclusiveMinimum", "minProperties", "minContains")  # merged by max
_UPPER = ("maximum", "maxLength", "maxItems", "exclusiveMaximum", "maxProperties", "maxContains")  # merged by min
VALIDATION = frozenset(
    "type enum const multipleOf maximum exclusiveMaximum minimum exclusiveMinimum maxLength minLength pattern "
    "format maxItems minItems uniqueItems contains maxContains minContains maxProperties minProperties required "
    "dependentRequired dependentSchemas dependencies properties patternProperties additionalProperties "
    "propertyNames items prefixItems additionalItems allOf anyOf oneOf not if then else $ref "
    "unevaluatedProperties unevaluatedItems $dynamicRef $recursiveRef".split()
)  # every other keyword is an annotation
MAX_UNION_PRODUCT = 64


class Unsatisfiable(SchemaError):
    """allOf parts that no value satisfies together (the compiler turns this into the empty term)."""


def resolve_pointer(root, ref, pointer: str):
    """The subschema a local `$ref` ("#", "#/a/b") points to."""
    if not isinstance(ref, str) or not ref.startswith("#"):
        raise SchemaError(f"only local references ('#/...') are supported, got {ref!r}", keyword="$ref", pointer=pointer)
    node = root
    for part in filter(None, ref[1:].split("/")):
        key = unquote(part).replace("~1", "/").replace("~0", "~")
        if isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        elif isinstance(node, dict) and key in node:
            node = node[key]
        else:
            raise SchemaError(f"reference {ref!r} does not resolve", keyword="$ref", pointer=pointer)
    return node


def merge_all(schema: dict, pointer: str, resolve) -> dict:
    """One schema equivalent to `schema` with its allOf parts merged (SchemaError if impossible)."""
    parts = _flatten(schema, pointer, resolve, depth=0)
    merged: dict = {}
    for i, part in enumerate(parts):
        merged = _merge(merged, part, f"{pointer}/allOf/{i}")
    return merged


def _flatten(schema, pointer: str, resolve, depth: int) -> list[dict]:
    if depth > 16:
        raise SchemaError("allOf/$ref chain is too deep to merge", keyword="allOf", pointer=pointer)
    if schema is True:
        return []
    if schema is False or not isinstance(schema, dict):
        raise SchemaError("allOf parts must be schemas that accept something", keyword="allOf", pointer=pointer)
    parts, rest = [], {k: v for k, v in schema.items() if k not in ("allOf", "$ref") and k in VALIDATION}
    if "$ref" in schema:
        parts += _flatten(resolve(schema["$ref"], pointer), pointer, resolve, depth + 1)
    for i, sub in enumerate(schema.get("allOf", [])):
        parts += _flatten(sub, f"{pointer}/allOf/{i}", resolve, depth + 1)
    return parts + ([rest] if rest else [])


def _merge(a: dict, b: dict, pointer: str) -> dict:
    out = dict(a)
    for key, value in b.items():
        if key not in out:
            out[key] = value
        elif out[key] != value:
            out[key] = _merge_keyword(key, out[key], value, out, b, pointer)
    _apply_additional_schemas(out, a, b)
    _apply_closed_objects(out, a, b, pointer)
    return out


def _apply_additional_schemas(out: dict, a: dict, b: dict) -> None:
    """A part's additionalProperties schema also binds the other part's properties it does not list."""
    for part in (a, b):
        extra = part.get("additionalProperties")
        if isinstance(extra, dict) and "properties" in out:
            allowed = _allowed_names(part)
            out["properties"] = {n: s if allowed(n) else {"allOf": [s, extra]} for n, s in out["properties"].items()}


def _merge_keyword(key: str, x, y, left: dict, right: dict, pointer: str):
    if key in _LOWER and _numbers(x, y):
        return max(x, y)
    if key in _UPPER and _numbers(x, y):
        return min(x, y)
    if key == "type":
        return _merge_types(x, y, pointer)
    if key == "required":
        return list(dict.fromkeys(x + y))
    if key in ("properties", "patternProperties") and isinstance(x, dict) and isinstance(y, dict):
        return {n: x[n] if n not in y else y[n] if n not in x else {"allOf": [x[n], y[n]]} for n in {**x, **y}}
    if key == "not":
        return {"anyOf": [x, y]}  # not A and not B = not (A or B)
    if key == "propertyNames":
        return {"allOf": [x, y]}
    if key == "additionalProperties" and (x is False or y is False):
        return False
    if key in ("items", "additionalProperties") and isinstance(x, dict) and isinstance(y, dict):
        return {"allOf": [x, y]}
    if key in ("enum", "const"):
        return _merge_values(key, x, y, pointer)
    if key == "pattern":
        return (x if isinstance(x, list) else [x]) + (y if isinstance(y, list) else [y])
    if key == "anyOf":
        if len(x) * len(y) > MAX_UNION_PRODUCT:
            raise SchemaError("allOf of two large anyOf unions is too big to merge", keyword="anyOf", pointer=pointer)
        return [{"allOf": [p, q]} for p in x for q in y]
    if key == "uniqueItems":
        return x or y
    raise SchemaError(f"allOf parts disagree on {key!r} ({_short(x)} vs {_short(y)}) and cannot be merged", keyword=key, pointer=pointer)


def _apply_closed_objects(out: dict, a: dict, b: dict, pointer: str) -> None:
    """A part with additionalProperties false only lets its own properties (and patterns) through."""
    closed = [p for p in (a, b) if p.get("additionalProperties") is False]
    for part in closed:
        patterns = part.get("patternProperties", {})
        allowed = _allowed_names(part)
        banned = [n for n in out.get("required", []) if not allowed(n)]
        if banned:
            raise Unsatisfiable(f"required property {banned[0]!r} is excluded by additionalProperties false", keyword="additionalProperties", pointer=pointer)
        out["properties"] = {n: s for n, s in out.get("properties", {}).items() if allowed(n)}
        if "patternProperties" in out:  # keys matching only the other part's patterns are excluded here
            out["patternProperties"] = {p: s for p, s in out["patternProperties"].items() if p in patterns}
        out["additionalProperties"] = False


def _allowed_names(part: dict):
    from fsm.patterns import search

    names, patterns = set(part.get("properties", {})), list(part.get("patternProperties", {}))
    return lambda name: name in names or any(search(p, name, "#") for p in patterns)


def _merge_types(x, y, pointer: str) -> list[str]:
    xs, ys = ({x} if isinstance(x, str) else set(x)), ({y} if isinstance(y, str) else set(y))
    both = xs & ys
    if ("number" in xs and "integer" in ys) or ("integer" in xs and "number" in ys):
        both.add("integer")
    if not both:
        raise Unsatisfiable(f"allOf parts require disjoint types {sorted(xs)} and {sorted(ys)}", keyword="type", pointer=pointer)
    return sorted(both)


def _merge_values(key: str, x, y, pointer: str):
    xs, ys = ([x] if key == "const" else x), ([y] if key == "const" else y)
    keys = {_canonical(v) for v in ys}
    both = [v for v in xs if _canonical(v) in keys]
    if not both:
        raise Unsatisfiable("allOf parts allow no common value", keyword=key, pointer=pointer)
    return both[0] if key == "const" else both


def _canonical(value) -> str:
    return json.dumps(value, sort_keys=True) + type(value).__name__


def _numbers(*values) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def _short(value) -> str:
    text = json.dumps(value)
    return text if len(text) < 40 else text[:37] + "..."

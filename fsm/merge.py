"""`allOf` merging and local `$ref` resolution for the schema compiler."""

from __future__ import annotations

import json
from urllib.parse import unquote

from fsm.dialects import WHOLE_INTEGERS
from fsm.errors import SchemaError

_LOWER = ("minimum", "minLength", "minItems", "exclusiveMinimum", "minProperties", "minContains")  # merged by max
_UPPER = ("maximum", "maxLength", "maxItems", "exclusiveMaximum", "maxProperties", "maxContains")  # merged by min
VALIDATION = frozenset(
    "type enum const multipleOf maximum exclusiveMaximum minimum exclusiveMinimum maxLength minLength pattern "
    "format maxItems minItems uniqueItems contains maxContains minContains maxProperties minProperties required "
    "dependentRequired dependentSchemas dependencies properties patternProperties additionalProperties "
    "propertyNames items prefixItems additionalItems allOf anyOf oneOf not if then else $ref "
    "unevaluatedProperties unevaluatedItems $dynamicRef $recursiveRef".split()
) | {WHOLE_INTEGERS}  # every other keyword is an annotation
MAX_UNION_PRODUCT = 64


class Unsatisfiable(SchemaError):
    """allOf parts that no value satisfies together (the compiler turns this into the empty term)."""


def resolve_pointer(root, ref, pointer: str):
    """The subschema a local `$ref` ("#", "#/a/b") points to."""
    if not isinstance(ref, str) or not ref.startswith("#"):
        raise SchemaError(
            f"only local references ('#/...') are supported, got {ref!r}", keyword="$ref", pointer=pointer
        )
    if ref not in ("#", "#/") and not ref.startswith("#/"):
        raise SchemaError(f"reference {ref!r} names an anchor that does not resolve", keyword="$ref", pointer=pointer)
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
    from fsm.unevaluated import close_unevaluated

    schema = close_unevaluated(schema, pointer, resolve)
    if depth > 16:
        raise SchemaError("allOf/$ref chain is too deep to merge", keyword="allOf", pointer=pointer)
    if schema is True:
        return []
    if schema is False:  # a part no value satisfies: nor does the whole
        raise Unsatisfiable("an allOf part is false", keyword="allOf", pointer=pointer)
    if not isinstance(schema, dict):
        raise SchemaError("allOf parts must be schemas that accept something", keyword="allOf", pointer=pointer)
    parts, rest = [], {k: v for k, v in schema.items() if k not in ("allOf", "$ref") and k in VALIDATION}
    if "$ref" in schema:
        parts += _flatten(resolve(schema["$ref"], pointer), pointer, resolve, depth + 1)
    for i, sub in enumerate(schema.get("allOf", [])):
        parts += _flatten(sub, f"{pointer}/allOf/{i}", resolve, depth + 1)
    return parts + ([rest] if rest else [])


def _merge(a: dict, b: dict, pointer: str) -> dict:
    b = _normalized(b)
    out = {k: v for k, v in a.items() if k not in ARRAY_KEYWORDS}
    for key, value in b.items():
        if key in ARRAY_KEYWORDS:
            continue
        if key not in out:
            out[key] = value
        elif out[key] != value:
            out[key] = _merge_keyword(key, out[key], value, out, b, pointer)
    out.update(merge_arrays(a, b))
    _apply_additional_schemas(out, a, b, pointer)
    _apply_closed_objects(out, a, b, pointer)
    return out


ARRAY_KEYWORDS = ("prefixItems", "items", "additionalItems")


def _normalized(part: dict) -> dict:
    """`part` without keywords that mean nothing there (then/else without if, min/maxContains without
    contains) and with the default minContains 1 spelled out, so that merging them keyword by keyword is exact."""
    out = {k: v for k, v in part.items() if not (k in ("then", "else") and "if" not in part)
           and not (k in ("minContains", "maxContains") and "contains" not in part)}
    if "contains" in out:
        out.setdefault("minContains", 1)
    return out


def merge_arrays(a: dict, b: dict) -> dict:
    """prefixItems/items/additionalItems of two parts as one prefix and one rest (each position: both apply)."""
    if not any(k in part for part in (a, b) for k in ARRAY_KEYWORDS):
        return {}
    (pa, ra), (pb, rb) = _array_form(a), _array_form(b)
    if not pa and not pb:
        return {"items": _both(ra, rb)}
    n = max(len(pa), len(pb))
    prefix = [_both(pa[i] if i < len(pa) else ra, pb[i] if i < len(pb) else rb) for i in range(n)]
    return {"prefixItems": prefix, "items": _both(ra, rb)}


def _array_form(part: dict) -> tuple[list, object]:
    """(schemas by position, schema for the rest) of a part, in any draft's spelling."""
    items = part.get("items", True)
    if "prefixItems" in part:
        return list(part["prefixItems"]), items
    if isinstance(items, list):
        return list(items), part.get("additionalItems", True)
    return [], items


def _both(x, y):
    if x is True or x == y:
        return y
    if y is True:
        return x
    if x is False or y is False:
        return False
    return {"allOf": [x, y]}


def _apply_additional_schemas(out: dict, a: dict, b: dict, pointer: str) -> None:
    """A part's additionalProperties schema also binds the other part's properties (and patterns) it does not list."""
    for part, other in ((a, b), (b, a)):
        extra = part.get("additionalProperties")
        if extra is None or extra is True or extra is False or extra == {}:
            continue
        foreign = [p for p in other.get("patternProperties", {}) if p not in part.get("patternProperties", {})]
        if foreign:
            raise SchemaError(
                f"allOf parts: patternProperties {foreign[0]!r} against another part's additionalProperties "
                "cannot be merged",
                keyword="additionalProperties",
                pointer=pointer,
            )
        if "properties" in out:
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
    if key == "additionalProperties" and (x is True or x == {} or y is True or y == {}):
        return y if x is True or x == {} else x
    if key == "additionalProperties" and isinstance(x, dict) and isinstance(y, dict):
        return {"allOf": [x, y]}
    if key in ("then", "else") and left.get("if") == right.get("if"):
        return {"allOf": [x, y]}  # the same condition: both consequences apply
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
    raise SchemaError(
        f"allOf parts disagree on {key!r} ({_short(x)} vs {_short(y)}) and cannot be merged",
        keyword=key,
        pointer=pointer,
    )


def _apply_closed_objects(out: dict, a: dict, b: dict, pointer: str) -> None:
    """A part with additionalProperties false only lets its own properties (and patterns) through."""
    closed = [p for p in (a, b) if p.get("additionalProperties") is False]
    for part in closed:
        patterns = part.get("patternProperties", {})
        allowed = _allowed_names(part)
        dropped = {p: s for p, s in out.get("patternProperties", {}).items() if p not in patterns}
        out["properties"] = {
            n: _with_patterns(n, s, dropped) for n, s in out.get("properties", {}).items() if allowed(n)
        }
        if "patternProperties" in out:  # keys matching only the other part's patterns are excluded here
            out["patternProperties"] = {p: s for p, s in out["patternProperties"].items() if p in patterns}
        out["additionalProperties"] = False


def _with_patterns(name: str, schema, patterns: dict):
    """`schema` of property `name` with every pattern schema that matches the name (they still apply)."""
    from fsm.patterns import search

    matched = [s for p, s in patterns.items() if search(p, name, "#")]
    return {"allOf": [schema, *matched]} if matched else schema


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
        raise Unsatisfiable(
            f"allOf parts require disjoint types {sorted(xs)} and {sorted(ys)}", keyword="type", pointer=pointer
        )
    return sorted(both)


def _merge_values(key: str, x, y, pointer: str):
    xs, ys = ([x] if key == "const" else x), ([y] if key == "const" else y)
    keys = {_canonical(v) for v in ys}
    both = [v for v in xs if _canonical(v) in keys]
    if not both:
        raise Unsatisfiable("allOf parts allow no common value", keyword=key, pointer=pointer)
    return both[0] if key == "const" else both


def _canonical(value) -> str:
    """Equal JSON values (numbers by value, 1 == 1.0, but true != 1) give equal texts."""
    return json.dumps(_by_value(value), sort_keys=True)


def _by_value(value):
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_by_value(v) for v in value]
    if isinstance(value, dict):
        return {k: _by_value(v) for k, v in value.items()}
    return value


def _numbers(*values) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def _short(value) -> str:
    text = json.dumps(value)
    return text if len(text) < 40 else text[:37] + "..."

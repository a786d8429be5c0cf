"""`not` and `oneOf` on object schemas at the schema level: complements pushed down to property values.

`not S`, where S holds only objects (or says nothing of the others) with required keys and property schemas, is
written as cases: another type, or an object that lacks a required key or holds a value S's property schema
rejects (`{"properties": {k: {"not": S_k}}}`). Each case asks for a complement of one property value, not of a whole
object: the guide decides it by structure where the complement of the object (open keys in any order, nested
values) would need a search. The cases keep only some of S's conjuncts (those that surely hold: through `$ref` and
`allOf`), so they describe a subset of `not S`: the language only narrows.

`oneOf` options that no value satisfies together (disjoint types, or a key one of them requires whose values the
two allow disjointly: GeoJSON's "type", a state machine's "type") need no complement at all: exactly one holds
wherever any does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from fsm import rx
from fsm.errors import SchemaError
from fsm.merge import VALIDATION

TYPES = ("null", "boolean", "object", "array", "string", "number")  # "integer" is a kind of number
MAX_CASES = 16  # cases of one negation (else the complement of its over-approximation is used)
MAX_DEPTH = 16  # $ref / allOf links followed to collect what surely holds
DISJOINT_SEARCH = 2_000  # terms explored to prove two property values disjoint


@dataclass(frozen=True)
class Facts:
    """What surely holds for a value valid under a schema (from its conjuncts through `$ref` and `allOf`)."""

    types: frozenset | None = None  # JSON types it may have (TYPES, "integer"); None: any
    required: tuple = ()  # keys an object must have
    properties: dict = field(default_factory=dict)  # key -> subschemas that all hold for its value
    exact: bool = True  # False where a conjunct could not be read (a $ref that does not resolve)


def facts(schema, resolve, depth: int = 0) -> Facts:
    """The Facts of `schema`; `resolve(ref, pointer)` reads a `$ref` target."""
    if schema is True or not isinstance(schema, dict):
        return Facts(frozenset() if schema is False else None)
    if depth > MAX_DEPTH:
        return Facts(exact=False)
    parts = [_own(schema)]
    if isinstance(schema.get("$ref"), str):
        try:
            parts.append(facts(resolve(schema["$ref"], "#"), resolve, depth + 1))
        except SchemaError:
            parts.append(Facts(exact=False))
    for sub in schema.get("allOf", []) if isinstance(schema.get("allOf"), list) else []:
        parts.append(facts(sub, resolve, depth + 1))
    return _together(parts)


def _own(schema: dict) -> Facts:
    types = schema.get("type")
    types = frozenset([types] if isinstance(types, str) else types) if isinstance(types, (str, list)) else None
    if "const" in schema or isinstance(schema.get("enum"), list):
        values = [schema["const"]] if "const" in schema else schema["enum"]
        found = frozenset(t for v in values for t in _types_of(v))
        types = found if types is None else _meet(types, found)
    if types is not None and "number" in types:
        types = types | {"integer"}
    required = tuple(n for n in schema.get("required", []) if isinstance(n, str)) \
        if isinstance(schema.get("required"), list) else ()
    properties = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    return Facts(types, required, {k: (v,) for k, v in properties.items()})


def _types_of(value) -> tuple:
    if value is None:
        return ("null",)
    if isinstance(value, bool):
        return ("boolean",)
    if isinstance(value, (int, float)):
        return ("number", "integer") if float(value).is_integer() else ("number",)
    return ("string",) if isinstance(value, str) else ("array",) if isinstance(value, list) else ("object",)


def _meet(a: frozenset, b: frozenset) -> frozenset:
    out = a & b
    if ("number" in a and "integer" in b) or ("integer" in a and "number" in b):
        out |= {"integer"}
    return out


def _together(parts: list[Facts]) -> Facts:
    types, required, properties = None, [], {}
    for part in parts:
        if part.types is not None:
            types = part.types if types is None else _meet(types, part.types)
        required += [n for n in part.required if n not in required]
        for name, subs in part.properties.items():
            properties[name] = properties.get(name, ()) + subs
    return Facts(types, tuple(required), properties, all(p.exact for p in parts))


def _value_schema(subs: tuple):
    return subs[0] if len(subs) == 1 else {"allOf": list(subs)}


def negated_cases(schema, resolve, extra: int = 0, within=None) -> list | None:
    """Schemas whose union is a subset of `not schema` (see the module docstring): other types, a required key absent
    or with a value its schema rejects, and up to `extra` declared keys whose schema allows only scalars present with
    such a value (as many as fit in MAX_CASES where none is required); [] where nothing is left. None where S is not
    an object schema with a key to negate.

    `within`: the schema the cases will be merged with; cases it contradicts for sure are left out (a key it requires
    absent, a value of a key under the very subschemas of S that it also applies)."""
    found, own = facts(schema, resolve), facts(within, resolve) if within is not None else Facts()
    if not found.exact or (found.types is not None and "object" not in found.types) or not found.properties \
            and not found.required:
        return None
    cases = []
    if found.types is not None:
        others = [t for t in TYPES if t not in found.types and not (t == "number" and "integer" in found.types)
                  and (own.types is None or t in own.types or (t == "number" and "integer" in own.types))]
        cases += [{"type": others}] if others else []
    for name in found.required:
        subs = found.properties.get(name, ())
        if not _implied(own, name, subs):
            cases.append({"type": "object", "properties": {name: {"not": _value_schema(subs)}}})
        elif name not in own.required:  # only "absent" is left
            cases.append({"type": "object", "properties": {name: False}})
    optional = [(n, subs) for n, subs in found.properties.items() if n not in found.required
                and _scalar(_value_schema(subs), resolve) and not _implied(own, n, subs)]
    for name, subs in optional[:extra if found.required else max(extra, MAX_CASES - len(cases))]:
        cases.append({"type": "object", "required": [name], "properties": {name: {"not": _value_schema(subs)}}})
    return cases


def _scalar(schema, resolve) -> bool:
    """Whether `schema` says something and allows no array or object: its negation is cheap (no nested cases)."""
    types = facts(schema, resolve).types
    return types is not None and not types & {"object", "array"}


def lean(cases: list) -> list:
    """One case of each kind (another type; an object) out of `cases`: a subset, so still inside `not S`."""
    kinds = {}
    for case in cases:
        kinds.setdefault(case.get("type") == "object", case)
    return list(kinds.values())


def _implied(own: Facts, name: str, subs: tuple) -> bool:
    """Whether every value `own` allows for `name` is valid under all of `subs` (each is among own's subschemas, as
    far as their validation keywords go: descriptions differ between copies of one property)."""
    mine = {_canonical(s) for s in own.properties.get(name, ())}
    return all(s is True or s == {} or _canonical(s) in mine for s in subs)


def _canonical(schema) -> str:
    if isinstance(schema, dict):
        schema = {k: v for k, v in schema.items() if k in VALIDATION}
    return json.dumps(schema, sort_keys=True, default=repr)


def disjoint(a, b, resolve, upper) -> bool:
    """Whether no value is valid under both `a` and `b` (proved: False when unsure). `upper(schema)`: its U term."""
    fa, fb = facts(a, resolve), facts(b, resolve)
    if not (fa.exact and fb.exact):
        return False
    shared = None if fa.types is None or fb.types is None else _meet(fa.types, fb.types)
    if shared is not None and not shared:
        return True
    if shared is None or not shared <= {"object"}:
        return False
    for name in dict.fromkeys((*fa.required, *fb.required)):
        if name in fa.properties and name in fb.properties:
            ua, ub = upper(_value_schema(fa.properties[name])), upper(_value_schema(fb.properties[name]))
            if _proved_empty(rx.inter(ua, ub)):
                return True
    return False


def _proved_empty(term: rx.Rx) -> bool:
    try:
        return rx.is_empty(term, limit=DISJOINT_SEARCH)
    except rx.UndecidedError:
        return False

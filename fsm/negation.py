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
from fsm.patterns import pattern_upper

TYPES = ("null", "boolean", "object", "array", "string", "number")  # "integer" is a kind of number
MAX_CASES = 16  # cases of one negation (else the complement of its over-approximation is used)
MAX_DEPTH = 16  # $ref / allOf links followed to collect what surely holds
DISJOINT_SEARCH = 2_000  # terms explored to prove two property values disjoint
READ = frozenset("type required properties additionalProperties not allOf $ref".split())  # what Facts hold whole


@dataclass(frozen=True)
class Facts:
    """What surely holds for a value valid under a schema (from its conjuncts through `$ref` and `allOf`)."""

    types: frozenset | None = None  # JSON types it may have (TYPES, "integer"); None: any
    required: tuple = ()  # keys an object must have
    properties: dict = field(default_factory=dict)  # key -> subschemas that all hold for its value
    exact: bool = True  # False where a conjunct could not be read (a $ref that does not resolve)
    closed: frozenset | None = None  # the only keys an object may have (additionalProperties false); None: any
    negated: tuple = ()  # subschemas of its `not`s: a value valid under one is not valid here
    complete: bool = True  # whether these facts are all its conjuncts say (no other keyword)


def facts(schema, resolve, depth: int = 0) -> Facts:
    """The Facts of `schema`; `resolve(ref, pointer)` reads a `$ref` target."""
    if schema is True or not isinstance(schema, dict):
        return Facts(frozenset() if schema is False else None)
    if depth > MAX_DEPTH:
        return Facts(exact=False, complete=False)
    parts = [_own(schema)]
    if isinstance(schema.get("$ref"), str):
        try:
            parts.append(facts(resolve(schema["$ref"], "#"), resolve, depth + 1))
        except SchemaError:
            parts.append(Facts(exact=False))
    for sub in schema.get("allOf", []) if isinstance(schema.get("allOf"), list) else []:
        parts.append(facts(sub, resolve, depth + 1))
    return _together(parts)


class SchemaFacts:
    """The Facts of one root's subschemas, memoised by object (an entry keeps its schema alive: ids are not reused);
    `resolve(ref, pointer)` reads a `$ref` target. A oneOf's options are each compared with every other."""

    def __init__(self, resolve):
        self.resolve, self._memo = resolve, {}

    def __call__(self, schema) -> Facts:
        found = self._memo.get(id(schema))
        if found is None:
            found = self._memo[id(schema)] = (schema, facts(schema, self.resolve))
        return found[1]


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
    closed = frozenset(properties) if schema.get("additionalProperties") is False \
        and not schema.get("patternProperties") else None
    negated = (schema["not"],) if "not" in schema else ()
    complete = not set(schema) & VALIDATION - READ and schema.get("additionalProperties", False) in (False, True, {})
    return Facts(types, required, {k: (v,) for k, v in properties.items()}, closed=closed, negated=negated,
                 complete=complete)


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
    types, required, properties, closed, negated = None, [], {}, None, ()
    for part in parts:
        if part.types is not None:
            types = part.types if types is None else _meet(types, part.types)
        if part.closed is not None:
            closed = part.closed if closed is None else closed & part.closed
        negated += part.negated
        required += [n for n in part.required if n not in required]
        for name, subs in part.properties.items():
            properties[name] = properties.get(name, ()) + subs
    return Facts(types, tuple(required), properties, all(p.exact for p in parts), closed, negated,
                 all(p.complete for p in parts))


def _value_schema(subs: tuple):
    """One schema for all of `subs` (False if one is False; `true` ones left out)."""
    if any(s is False for s in subs):
        return False
    subs = [s for s in subs if s is not True and s != {}] or [True]
    return subs[0] if len(subs) == 1 else {"allOf": subs}


def negated_cases(schema, known: "SchemaFacts", extra: int = 0, within=None) -> list | None:
    """Schemas whose union is a subset of `not schema` (see the module docstring): other types, a required key absent
    or with a value its schema rejects, and up to `extra` declared keys whose schema allows only scalars present with
    such a value (as many as fit in MAX_CASES where none is required); [] where nothing is left. None where S is not
    an object schema with a key to negate.

    `within`: the schema the cases will be merged with; cases it contradicts for sure are left out (a key it requires
    absent, a value of a key under the very subschemas of S that it also applies)."""
    branches = _branches(_objects_spelled_out(schema))
    if branches is not None:  # not (A or B) = not A and not B (and a subset of not oneOf [A, B])
        return _every_negated(branches, known, extra, within)
    found, own = known(schema), known(within) if within is not None else Facts()
    if not found.exact or (found.types is not None and "object" not in found.types) or not found.properties \
            and not found.required and found.closed is None and not found.negated:
        return None
    cases = []
    if found.types is not None:
        others = [t for t in TYPES if t not in found.types and not (t == "number" and "integer" in found.types)
                  and (own.types is None or t in own.types or (t == "number" and "integer" in own.types))]
        cases += [{"type": others}] if others else []
    if found.closed is not None:  # a key S does not allow, among those the merged schema declares
        cases += [{"type": "object", "required": [k]} for k in own.properties if k not in found.closed][:1]
    for name in found.required:
        subs = found.properties.get(name, ())
        if not _implied(own, name, subs):
            cases.append({"type": "object", "properties": {name: {"not": _value_schema(subs)}}})
        elif name not in own.required:  # only "absent" is left
            cases.append({"type": "object", "properties": {name: False}})
    cases += list(found.negated)  # a value valid under what S negates is not valid under S
    optional = [(n, subs) for n, subs in found.properties.items() if n not in found.required
                and _scalar(_value_schema(subs), known) and not _implied(own, n, subs)]
    for name, subs in optional[:extra if found.required else max(extra, MAX_CASES - len(cases))]:
        cases.append({"type": "object", "required": [name], "properties": {name: {"not": _value_schema(subs)}}})
    return cases if cases or found.complete else None  # S says more than its facts: the complement of U does


def _scalar(schema, known: "SchemaFacts") -> bool:
    """Whether `schema` says something and allows no array or object: its negation is cheap (no nested cases)."""
    types = known(schema).types
    return types is not None and not types & {"object", "array"}


def _branches(schema) -> list | None:
    """The branches of a schema that is only a union (`anyOf` or `oneOf`, nested ones flattened), else None."""
    if not isinstance(schema, dict) or set(schema) & VALIDATION not in ({"anyOf"}, {"oneOf"}):
        return None
    options = schema.get("anyOf", schema.get("oneOf"))
    if not isinstance(options, list) or not options:
        return None
    out = []
    for option in options:
        out += _branches(option) or [option]
    return out


def _objects_spelled_out(schema):
    """An `enum` / `const` of objects only as the same set of object schemas: {"a": 1} is exactly the objects with
    the keys {a} whose value at "a" equals 1 (`enum`, which every draft reads), so its negation gets cases."""
    if not isinstance(schema, dict) or len(set(schema) & VALIDATION) != 1:
        return schema
    values = schema.get("enum") if "enum" in schema else [schema["const"]] if "const" in schema else None
    if not isinstance(values, list) or not values or not all(isinstance(v, dict) for v in values):
        return schema
    return {"anyOf": [{"type": "object", "required": list(v), "properties": {k: {"enum": [x]} for k, x in v.items()},
                       "additionalProperties": False} for v in values]}


def _every_negated(branches: list, known: "SchemaFacts", extra: int, within) -> list | None:
    """Cases of `not B` for every branch B at once (one allOf per combination), or None past MAX_CASES."""
    combined = [[]]
    for branch in branches:
        cases = negated_cases(branch, known, extra, within)
        if cases is None or len(combined) * len(cases) > MAX_CASES:
            return None
        combined = [[*done, case] for done in combined for case in cases]
    return [parts[0] if len(parts) == 1 else {"allOf": parts} for parts in combined]


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
    try:
        return json.dumps(schema, sort_keys=True, default=repr)
    except ValueError:  # an integer past Python's 4,300 digits: never equal to another text
        return repr(id(schema))


def disjoint(a, b, known: "SchemaFacts", upper) -> bool:
    """Whether no value is valid under both `a` and `b` (proved: False when unsure). `upper(schema)`: its U term."""
    fa, fb = known(a), known(b)
    if not (fa.exact and fb.exact):
        return False
    shared = None if fa.types is None or fb.types is None else _meet(fa.types, fb.types)
    if shared is not None and not shared:
        return True
    if shared is None or not shared <= {"object"}:
        return False
    if any(k not in f.closed for f, g in ((fa, fb), (fb, fa)) if f.closed is not None for k in g.required):
        return True  # a key one requires is one the other does not allow
    for name in dict.fromkeys((*fa.required, *fb.required)):
        if name in fa.properties and name in fb.properties:
            va, vb = _value_schema(fa.properties[name]), _value_schema(fb.properties[name])
            if _strings_disjoint(va, vb, known) or _proved_empty(rx.inter(upper(va), upper(vb))):
                return True
    return False


def _strings_disjoint(a, b, known: "SchemaFacts") -> bool:
    """Whether two schemas that allow only strings allow no common string: their patterns and listed values are
    compared on the decoded contents (U compares texts, where any escaped spelling may match any pattern)."""
    ca, cb = _contents(a, known), _contents(b, known)
    return ca is not None and cb is not None and _proved_empty(rx.inter(ca, cb))


def _contents(schema, known: "SchemaFacts") -> rx.Rx | None:
    """A superset of the decoded contents of the strings `schema` allows (None unless it allows only strings)."""
    if known(schema).types != frozenset({"string"}):
        return None
    parts, todo, seen = [], [schema], 0
    while todo and seen < MAX_DEPTH:
        node, seen = todo.pop(), seen + 1
        if not isinstance(node, dict):
            continue
        patterns = node.get("pattern", [])
        parts += [pattern_upper(p) for p in (patterns if isinstance(patterns, list) else [patterns])]
        if "const" in node or isinstance(node.get("enum"), list):
            values = [node["const"]] if "const" in node else node["enum"]
            parts.append(rx.alt(*(rx.literal(v) for v in values if isinstance(v, str))))
        if isinstance(node.get("$ref"), str):
            try:
                todo.append(known.resolve(node["$ref"], "#"))
            except SchemaError:
                pass
        todo += node.get("allOf", []) if isinstance(node.get("allOf"), list) else []
    return rx.inter(*parts) if parts else None


def _proved_empty(term: rx.Rx) -> bool:
    try:
        return rx.is_empty(term, limit=DISJOINT_SEARCH)
    except rx.UndecidedError:
        return False

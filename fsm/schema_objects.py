"""Object schemas -> terms: properties in schema order (or in any order, `property_order="any"`),
extra keys (additionalProperties, patternProperties, propertyNames), and minProperties/maxProperties
as an intersection with a count."""

from __future__ import annotations

import json
from itertools import product
from typing import NamedTuple

from fsm import json_terms as jt
from fsm import rx
from fsm.budget import GuideBudgetError
from fsm.errors import SchemaError
from fsm.keywords import natural
from fsm.patterns import pattern_term, pattern_upper, search

MAX_PATTERNS = 4  # patternProperties: extra keys are split by which patterns they match (2^n cases)


def type_object(c, schema: dict, pointer: str) -> rx.Rx:
    properties, required = schema.get("properties", {}), schema.get("required", [])
    if not isinstance(properties, dict) or not isinstance(required, list):
        raise SchemaError("properties must be an object and required an array", keyword="properties", pointer=pointer)
    patterns = _patterns(schema, pointer)
    closed = schema.get("unevaluatedProperties") is False or not c.open_objects
    extra = schema.get("additionalProperties", False if closed else True)
    names = c.compile(schema["propertyNames"], f"{pointer}/propertyNames") if "propertyNames" in schema else None
    declared = dict(properties)
    for name in required:  # required names are never "extra"; matching patterns apply in _declared
        matched = any(search(p.text, name, p.where) for p in patterns) if isinstance(name, str) else False
        declared.setdefault(name, True if matched else schema.get("additionalProperties", True))
    members = [_declared(c, name, sub, name in required, patterns, names, pointer) for name, sub in declared.items()]
    extras = _extras(c, list(declared), patterns, extra, names, pointer)
    body = unordered_members if c.property_order == "any" else ordered_members
    term = jt.delimited("{", "}", body(members, extras, c.ws), c.ws)
    return rx.inter(term, _count(c, schema, list(declared), pointer))


class _Pattern(NamedTuple):
    text: str
    lower: rx.Rx  # keys surely matched (as Python's re.search, which validators use)
    upper: rx.Rx  # keys perhaps matched
    schema: object
    where: str


def _patterns(schema: dict, pointer: str) -> list[_Pattern]:
    found = schema.get("patternProperties", {})
    if not isinstance(found, dict):
        raise SchemaError("must be an object", keyword="patternProperties", pointer=pointer)
    where = f"{pointer}/patternProperties"
    return [_Pattern(p, pattern_term(p, where, "patternProperties"), pattern_upper(p), sub, f"{where}/{_escape(p)}")
            for p, sub in found.items()]


def _declared(c, name: str, subschema, required: bool, patterns, names, pointer: str) -> tuple[rx.Rx, str]:
    """(member term, "required" | "optional"); NOTHING when the property cannot appear."""
    matched = [(p.schema, p.where) for p in patterns if search(p.text, name, p.where)]
    value = c.meet([(subschema, f"{pointer}/properties/{_escape(name)}"), *matched])
    key = jt.key(name)
    if names is not None and not rx.matches(names, json.dumps(name, ensure_ascii=False)):
        value = rx.NOTHING
    return jt.member(key, value, c.ws), "required" if required else "optional"


def _extras(c, declared: list[str], patterns, extra, names, pointer: str) -> rx.Rx:
    """One member whose key is not declared: split by the patterns the key matches."""
    if not patterns and c.compile(extra, f"{pointer}/additionalProperties") is rx.NOTHING:
        return rx.NOTHING  # a closed object: no key of the undeclared ones is built
    plain = rx.without_words(rx.star(jt.PLAIN_CHAR), declared)
    options = []
    for chosen in _pattern_cases(len(patterns), _disjoint([p.upper for p in patterns])):
        content = rx.inter(plain, *(p.lower if hit else rx.complement(p.upper) for p, hit in zip(patterns, chosen)))
        values = [(p.schema, p.where) for p, hit in zip(patterns, chosen) if hit]
        value = c.meet(values or [(extra, f"{pointer}/additionalProperties")])
        key = rx.seq(jt.QUOTE, content, jt.QUOTE)
        options.append(jt.member(rx.inter(key, names) if names is not None else key, value, c.ws))
    return rx.alt(*options)


def _pattern_cases(n: int, disjoint: bool) -> list[tuple[bool, ...]]:
    """Which patterns a key matches: each subset, or (disjoint patterns) at most one of them."""
    if disjoint:
        return [tuple(i == j for j in range(n)) for i in range(n)] + [(False,) * n]
    if n > MAX_PATTERNS:
        raise SchemaError(f"more than {MAX_PATTERNS} overlapping patternProperties", keyword="patternProperties")
    return list(product((True, False), repeat=n))


def _disjoint(terms: list[rx.Rx]) -> bool:
    try:
        return all(rx.is_empty(rx.inter(a, b), limit=500) for i, a in enumerate(terms) for b in terms[i + 1:])
    except GuideBudgetError:
        raise
    except ValueError:
        return False


def ordered_members(members: list[tuple[rx.Rx, str]], extra: rx.Rx, ws: rx.Rx) -> rx.Rx:
    """The inside of `{...}`: members in order (required or optional), then any number of `extra`."""
    sep = rx.seq(ws, rx.literal(","), ws)
    after = rx.star(rx.seq(sep, extra))  # after[i]: members i.. once an earlier one was written
    afters = [after]
    for term, kind in reversed(members):
        one = rx.seq(sep, term)
        after = rx.seq(one if kind == "required" else rx.optional(one), after)
        afters.append(after)
    afters.reverse()
    starts = []
    for i, (term, kind) in enumerate(members):  # the first written member is i
        starts.append(rx.seq(term, afters[i + 1]))
        if kind == "required":
            break
    else:
        starts += [rx.seq(extra, afters[-1]), rx.EPSILON]
    return rx.alt(*starts)


def unordered_members(members: list[tuple[rx.Rx, str]], extra: rx.Rx, ws: rx.Rx) -> rx.Rx:
    """The inside of `{...}` in any order: each member at most once (required ones exactly once),
    any number of `extra` anywhere.

    One `rx.any_order_list` term: a DFA state is (the members still allowed, the position inside
    the current one), built only where a walk goes, with no intersection to search for emptiness.
    """
    if not members:
        return jt.listing(extra, ws)
    sep = rx.seq(ws, rx.literal(","), ws)
    required = [t for t, kind in members if kind == "required"]
    optional = [t for t, kind in members if kind != "required"]
    body = rx.any_order_list(required, optional, extra, sep)
    return body if required else rx.alt(body, rx.EPSILON)


def _count(c, schema: dict, declared: list[str], pointer: str) -> rx.Rx:
    """Objects with min..max members. Extra keys may repeat (a parser keeps one), so the lower bound
    counts declared keys and at most one extra key, and the upper bound counts every member."""
    low, high = natural(schema, "minProperties", pointer, 0), natural(schema, "maxProperties", pointer, None)
    if low == 0 and high is None:
        return rx.ANYTHING
    if low > len(declared) + 1:
        raise SchemaError(f"minProperties {low} needs distinct extra keys, which a regular language cannot track",
                          keyword="minProperties", pointer=pointer)
    any_member = jt.member(jt.STRING, c.skeleton, c.ws)
    declared_member = jt.member(rx.alt(*(jt.key(n) for n in declared)), c.skeleton, c.ws)
    extra_member = jt.member(jt.plain_key_except(declared), c.skeleton, c.ws)
    kinds = [(declared_member, 1), (any_member, 0)]
    at_least = jt.counted(kinds, c.ws, low, None)
    if low >= 1:
        one_extra = jt.counted([(extra_member, 1), (any_member, 0)], c.ws, 1, None)
        at_least = rx.alt(at_least, rx.inter(jt.counted(kinds, c.ws, low - 1, None), one_extra))
    at_most = jt.counted([(any_member, 1)], c.ws, 0, high)
    return jt.delimited("{", "}", rx.inter(at_least, at_most), c.ws)


def _escape(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")

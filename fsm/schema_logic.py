"""`not`, `if`/`then`/`else`, `anyOf` and `oneOf` -> terms (the Compiler's combinators that need a negation).

A negation `not S` is, where S is an object schema, a union of cases that each negate one property value
(`fsm.negation.negated_cases`); elsewhere the complement of S's over-approximation U(S). `oneOf` options proved
disjoint (`fsm.negation.disjoint`) are not negated at all. Both only narrow what is generated.
"""

from __future__ import annotations

from fsm import rx
from fsm.negation import MAX_CASES, disjoint, lean, negated_cases
from fsm.rewrites import exclusive_required_cases
from fsm.schema_types import proved_empty
from fsm.budget import GuideBudgetError
from fsm.errors import SchemaError
from fsm.merge import Unsatisfiable, merge_all

DISJOINT_SEARCH = 40  # states explored to prove a oneOf option's term disjoint from another's U (else: exclude it)
MAX_NEGATION_DEPTH = 4  # `not`s inside `not`s written as cases (deeper: the complement of U)


def logic(c, schema: dict, pointer: str) -> rx.Rx:
    """`not S` -> rest ∧ not S; `if`: (rest ∧ if ∧ then) ∪ (rest ∧ else ∧ not if)."""
    if "not" in schema:
        rest = {k: v for k, v in schema.items() if k != "not"}
        outer = c.negations  # `not`s counted up to the depth where cases stop: past it every count compiles alike,
        c.negations = min(outer + 1, MAX_NEGATION_DEPTH)  # so a recursive schema's rules close there
        try:
            return without(c, rest, [(schema["not"], f"{pointer}/not")], pointer)
        finally:
            c.negations = outer
    rest = {k: v for k, v in schema.items() if k not in ("if", "then", "else")}
    condition, then, otherwise = schema["if"], schema.get("then", True), schema.get("else", True)
    if condition is True or (then is True and otherwise is True):
        return c.compile({"allOf": [rest, then]}, pointer)
    yes = c.compile({"allOf": [rest, condition, then]}, pointer)
    no = without(c, {"allOf": [rest, otherwise]}, [(condition, f"{pointer}/if")], pointer)
    return rx.alt(yes, no)


def union(c, schema: dict, pointer: str) -> rx.Rx:
    """anyOf: the union. oneOf: option i minus every option j != i it may overlap (exactly one holds)."""
    keyword = "anyOf" if "anyOf" in schema else "oneOf"
    options = schema[keyword]
    if not isinstance(options, list) or not options:
        raise SchemaError("must be a non-empty array of schemas", keyword=keyword, pointer=pointer)
    base = {k: v for k, v in schema.items() if k != keyword}
    cases = exclusive_required_cases(options) if keyword == "oneOf" else None
    if cases is not None:  # exact without complements (which make liveness and masks slow)
        return union(c, {**base, "anyOf": cases}, pointer)
    with_base = [{"allOf": [base, o]} if base else o for o in options]
    if keyword == "anyOf":
        return rx.alt(*(c.compile(o, f"{pointer}/anyOf/{i}") for i, o in enumerate(with_base)))
    terms = []
    for i, option in enumerate(with_base):
        others = [(o, f"{pointer}/oneOf/{j}") for j, o in enumerate(options)
                  if j != i and not _disjoint(c, option, with_base[j])]  # with the base: its required keys count
        terms.append(without(c, option, others, f"{pointer}/oneOf/{i}"))
    return rx.alt(*terms)


def without(c, schema, excluded: list[tuple[object, str]], pointer: str) -> rx.Rx:
    """L(schema) minus every value valid under an `excluded` schema ((schema, its pointer) pairs): object schemas as
    cases of `not` (at most MAX_CASES combined: past it an excluded schema keeps one case per kind; optional keys'
    cases where room is left), the others as complements of their U."""
    excluded = [(o, where) for o, where in excluded if not _disjoint(c, schema, o)]  # nothing to take away there
    cases = [negated_cases(o, c.facts, within=schema) if c.negations < MAX_NEGATION_DEPTH else None
             for o, _ in excluded]
    if any(found == [] for found in cases):  # `schema` and an excluded one agree on every key it negates
        return rx.NOTHING
    product = 1
    for i, found in enumerate(cases):
        if found is not None and product * len(found) > MAX_CASES:
            found = cases[i] = lean(found)  # fewer cases: narrower, and cheaper than a complement to search
        if found is not None and product * len(found) <= MAX_CASES:
            product *= len(found)
        else:
            cases[i] = None
    for i, found in enumerate(cases):  # room left: also a declared key present with a rejected value
        if found is not None and product * (len(found) + 1) // len(found) <= MAX_CASES:
            room = MAX_CASES * len(found) // product - len(found)
            more = negated_cases(excluded[i][0], c.facts, room, within=schema)
            product = product // len(found) * len(more)
            cases[i] = more
    cased = [{"anyOf": found} for found in cases if found is not None]
    uppers = [c.upper(o, where) for (o, where), found in zip(excluded, cases) if found is None]
    if cased and not _mergeable({"allOf": [schema, *cased]}, pointer, c.resolve):
        return exclude(c, c.compile(schema, pointer), [c.upper(o, where) for o, where in excluded])
    term = c.compile({"allOf": [schema, *cased]} if cased else schema, pointer)
    return exclude(c, term, uppers)


def _mergeable(schema: dict, pointer: str, resolve) -> bool:
    """Whether the allOf merges into one schema (else its parts' terms would be intersected: searches)."""
    try:
        merge_all(schema, pointer, resolve)
    except Unsatisfiable:
        return True
    except GuideBudgetError:
        raise
    except SchemaError:
        return False
    return True


def exclude(c, term: rx.Rx, uppers: list[rx.Rx]) -> rx.Rx:
    """`term` minus every upper bound it may overlap (skipping the ones quickly proved disjoint)."""
    for u in uppers:
        key = (term.id, u.id)
        if key not in c.disjoint:
            c.disjoint[key] = proved_empty(rx.inter(term, u), limit=DISJOINT_SEARCH)
        if not c.disjoint[key]:
            term = rx.inter(term, rx.complement(u))
    return term


def _disjoint(c, a, b) -> bool:
    key = (id(a), id(b))  # the entry keeps both alive: their ids are not reused while it holds them
    if key not in c.disjoint_options:
        c.disjoint_options[key] = (a, b, disjoint(a, b, c.facts, lambda s: c.upper(s, "#")))
    return c.disjoint_options[key][2]

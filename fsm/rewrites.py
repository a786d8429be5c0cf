"""Exact rewrites of schema shapes whose direct translation is correct but slow to walk."""

from __future__ import annotations

from itertools import product

from fsm.merge import VALIDATION

MAX_EXCLUSIVE_CASES = 32  # oneOf of required-only options: anyOf cases written out (else: complements)


def exclusive_required_cases(options: list) -> list | None:
    """`oneOf` options that only say `required`, as anyOf cases without negation (None if not that form).

    Exactly one option holds when the object has option i's names and, for every other option j, lacks
    one of j's names that i does not require; non-objects satisfy every option, so two or more exclude them.
    """
    names = [
        o.get("required") if isinstance(o, dict) and set(o) & VALIDATION == {"required"} else None for o in options
    ]
    if len(options) < 2 or any(not isinstance(n, list) or not all(isinstance(x, str) for x in n) for n in names):
        return None
    cases = []
    for i, own in enumerate(names):
        absent = [sorted(set(other) - set(own)) for j, other in enumerate(names) if j != i]
        choices = {frozenset(c) for c in product(*absent)}
        if len(cases) + len(choices) > MAX_EXCLUSIVE_CASES:
            return None
        cases += [{"type": "object", "required": own, "properties": {n: False for n in sorted(c)}} for c in choices]
    return cases or [False]

"""Case-insensitive character sets, exactly as Python's `re` matches them under IGNORECASE.

`re` lowers the subject character and looks it up among the lowered pattern characters plus a few
extra equivalences (`re._casefix`, e.g. `s` ~ `ſ`, `k` ~ Kelvin sign). So a set of code points C
matches exactly the characters y with lower(y) in S(C); `fold` returns that set of characters.
"""

from __future__ import annotations

import bisect
from functools import lru_cache

import _sre
from re._casefix import _EXTRA_CASES

from fsm import utf8

Ranges = tuple[tuple[int, int], ...]  # sorted, disjoint, inclusive code point ranges


@lru_cache(maxsize=2)
def _table(ascii_only: bool) -> tuple[list[int], dict[int, frozenset[int]]]:
    """Sorted cased code points and, for each, every code point it matches case-insensitively."""
    if ascii_only:
        pairs = {c: frozenset({c, c ^ 0x20}) for c in [*range(65, 91), *range(97, 123)]}
        return sorted(pairs), pairs
    members: dict[int, set[int]] = {}
    lower = _sre.unicode_tolower
    for c in range(0x110000):  # ~0.2 s, once
        low = lower(c)
        if low != c:
            members.setdefault(low, {low}).add(c)
    equivalent: dict[int, frozenset[int]] = {}
    for low in set(members) | set(_EXTRA_CASES):
        group = set(members.get(low, {low}))
        for extra in _EXTRA_CASES.get(low, ()):
            group |= members.get(extra, {extra})
        for c in group:
            equivalent[c] = equivalent.get(c, frozenset()) | frozenset(group)
    return sorted(equivalent), equivalent


@lru_cache(maxsize=4096)
def fold(ranges: Ranges, ascii_only: bool = False) -> Ranges:
    """`ranges` widened by every character that matches one of them case-insensitively."""
    keys, equivalent = _table(ascii_only)
    extra = set()
    for low, high in ranges:
        for c in keys[bisect.bisect_left(keys, low) : bisect.bisect_right(keys, high)]:
            extra |= equivalent[c]
    return merge(sorted([*ranges, *((c, c) for c in extra)]))


def merge(ranges: list[tuple[int, int]]) -> Ranges:
    """Sorted ranges -> sorted, disjoint, non-adjacent ranges."""
    return tuple(utf8.merge(ranges))

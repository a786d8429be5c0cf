"""Head walks shared by every token index over one vocabulary.

A head's walk (`fsm.index.HeadWalk`: every token through the DFA of the head alone) is a function of the head term
and the tokens, not of the schema around it: a JSON string, a number, a key's quote are the same terms in every
schema (terms are interned), so their walks, the walks of crossing groups kept on them (`fsm.crossing`) and the group
walks below a literal's end are kept once per (vocabulary, DFA state budget), in one DFA of heads. A new schema then
finds most of its heads walked. Bounded by count and bytes (the oldest go first); `fsm.caches.clear_caches` forgets
them. Grown under `fsm.budget.BUILD_LOCK`, as every first visit is.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

from fsm import rx
from fsm.lazy_dfa import LazyDFA

MAX_CACHED_HEADS = 1024  # per vocabulary: head walks kept
MAX_CACHED_HEAD_BYTES = 512 << 20  # per vocabulary: a head allowing all of a 151k vocabulary holds ~1.4 MiB
MAX_BELOW_WALKS = 4096  # per vocabulary: group walks below a literal's end kept (past it, or past MAX_BELOW_BYTES,
MAX_BELOW_BYTES = 64 << 20  # they start over)

_CACHES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # vocabulary -> {max_states: HeadCache}


def head_cache(vocabulary, max_states: int) -> "HeadCache":
    """The HeadCache of `vocabulary` for DFAs of at most `max_states` states."""
    per_budget = _CACHES.setdefault(vocabulary, {})
    found = per_budget.get(max_states)
    if found is None:
        found = per_budget[max_states] = HeadCache(max_states)
    return found


def clear() -> None:
    _CACHES.clear()


@dataclass(eq=False)
class HeadCache:
    """The DFA of heads, the head walks (head term -> HeadWalk) and the group walks below literals of one vocabulary."""

    max_states: int
    dfa: LazyDFA | None = None
    heads: dict = field(default_factory=dict)
    head_bytes: int = 0
    below: dict = field(default_factory=dict)  # (depth, node, head) -> GroupWalk
    below_bytes: int = 0

    @property
    def nbytes(self) -> int:
        return self.head_bytes + self.below_bytes + (self.dfa.nbytes if self.dfa is not None else 0)

    def knows(self, head: rx.Rx) -> bool:
        """Whether `head` was walked, or reached in the DFA of heads."""
        return head in self.heads or (self.dfa is not None and head.id in self.dfa.known)

    def dfa_for(self, head: rx.Rx) -> LazyDFA:
        """The DFA heads are walked in: shared, so that a head derived from an earlier one finds its rows filled;
        started over once it holds half of max_states (walks made in the old one keep it)."""
        if self.dfa is None or self.dfa.n_states > self.max_states // 2:
            self.dfa = LazyDFA(head, max_states=self.max_states)
        return self.dfa

    def walk(self, head: rx.Rx, build):
        """The walk of `head`, `build(dfa, head)` where there is none yet."""
        found = self.heads.get(head)
        if found is None:
            found = build(self.dfa_for(head), head)
            self._evict_heads(found.nbytes)
            self.heads[head] = found
            self.head_bytes += found.nbytes
        return found

    def grow(self, head: rx.Rx, more: int) -> None:
        """Count `more` bytes that the walk of `head` now keeps (a mask, group walks), the oldest other walks dropped
        past the bound."""
        if more and head in self.heads:
            walk = self.heads.pop(head)  # not evicted by its own growth
            self.head_bytes -= walk.nbytes - more
            self._evict_heads(walk.nbytes)
            self.heads[head] = walk
            self.head_bytes += walk.nbytes

    def _evict_heads(self, room: int) -> None:
        while self.heads and (len(self.heads) >= MAX_CACHED_HEADS or self.head_bytes + room > MAX_CACHED_HEAD_BYTES):
            self.head_bytes -= self.heads.pop(next(iter(self.heads))).nbytes

    def keep_below(self, key: tuple, group) -> None:
        """Keep a group walk below a literal's end, starting over past MAX_BELOW_WALKS or MAX_BELOW_BYTES."""
        if len(self.below) >= MAX_BELOW_WALKS or self.below_bytes > MAX_BELOW_BYTES:
            self.below.clear()
            self.below_bytes = 0
        self.below[key] = group
        self.count_below(group.nbytes)

    def count_below(self, nbytes: int) -> bool:
        """Count the bytes of a group walk kept below one of `below`'s (True: it may be kept)."""
        self.below_bytes += nbytes
        return True

"""Closing within a token budget: which tokens leave room for a valid completion in the tokens left.

With a budget (`Guide.within`), a token is allowed at a position only if, after it, some valid completion still
fits in the tokens left. Every byte that a token spells on its own (all of them in byte-level and byte-fallback
vocabularies) is one token, so `distance(state)`, the shortest completion in such bytes, is a number of tokens that
always suffices. The rule keeps itself true: a state reached with `distance <= left` has an allowed single-byte
token (the first byte of a shortest completion) whose next state is one byte closer, or it accepts and allows EOS.
EOS needs no room after it; a budget that runs out on a complete text leaves it complete.

Per state, `need[i]` is the distance after the i-th allowed token: the budget mask at (state, left) is
`need <= left - 1`, built only where the budget binds (left - 1 below the largest need), cached per (state, left);
elsewhere it is the state's own mask, the same tensor. Distances are exact: a plain term's witness (`rx.witness`,
the shortest string of terms without intersections and complements) where all its bytes are single tokens, else a
breadth-first search over derivatives that stops at such terms.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fsm import rx
from fsm.bounded_cache import BoundedCache
from fsm.budget import GuideBudgetError, metered

FINISHED = -2  # fsm.index.FINISHED: the state after EOS (not imported: fsm.index imports this module)
UNREACHABLE = np.iinfo(np.int32).max  # no completion in single-token bytes
SEARCH_LIMIT = 20_000  # terms one distance search may visit
MAX_KEPT = 200_000  # distances and bounds remembered per index before they start over


@dataclass(frozen=True, eq=False)
class Needs:
    """The allowed tokens of one state and the shortest completion after each."""

    ids: np.ndarray  # (n_allowed,) int32 sorted
    need: np.ndarray  # (n_allowed,) int32 bytes after the token (0 after EOS), UNREACHABLE where none

    @property
    def nbytes(self) -> int:
        return self.ids.nbytes + self.need.nbytes


class Closing:
    """Distances, per-state needs and budget masks of one `TokenIndex` (pure functions of it, memoized)."""

    def __init__(self, index):
        self.index = index
        self.singles = sum(1 << b for b in index.vocabulary.single_bytes)  # bytes one token spells alone
        self._distances: dict[int, int] = {FINISHED: 0}
        self._bounds: dict[int, tuple[int, int]] = {}  # state -> (smallest, largest) need
        self._needs = BoundedCache(64, 256 << 20, lambda needs: needs.nbytes)
        self._masks = BoundedCache(1024, 256 << 20, lambda mask: mask.numel())

    def distance(self, state: int) -> int:
        """Bytes of the shortest completion from `state` spelled in single-token bytes (UNREACHABLE if none)."""
        found = self._distances.get(state)
        if found is None:
            with metered(self.index.budget, f"the shortest completion of state {state} of {self.index.dfa.name()}"):
                found = shortest(self.index.dfa.term(state), self.singles)
            if len(self._distances) > MAX_KEPT:
                self._distances = {FINISHED: 0}
            self._distances[state] = found
        return found

    def bounds(self, state: int) -> tuple[int, int]:
        """(smallest, largest) need over the tokens `state` allows."""
        found = self._bounds.get(state)
        if found is None:
            need = self.needs(state).need
            found = (int(need.min(initial=UNREACHABLE)), int(need.max(initial=0)))
            if len(self._bounds) > MAX_KEPT:
                self._bounds = {}
            self._bounds[state] = found
        return found

    def needs(self, state: int) -> Needs:
        return self._needs.get_or_build(state, lambda: self._build_needs(state))

    def binds(self, state: int, left: int) -> bool:
        """Whether `left` tokens (this one included) remove a token `state` allows."""
        return left - 1 < self.bounds(state)[1]

    def mask(self, state: int, left: int) -> torch.Tensor:
        """(vocab_size,) bool: the tokens of `state` after which a completion fits in `left - 1` tokens; the
        state's own mask (the same tensor) where the budget does not bind. Shared: do not modify."""
        if not self.binds(state, left):
            return self.index.info(state).mask
        return self._masks.get_or_build((state, left), lambda: self._build_mask(state, left))

    def _build_needs(self, state: int) -> Needs:
        ids, nexts = self.index.info(state).successors()
        distinct, inverse = np.unique(nexts, return_inverse=True)
        lengths = np.asarray([self.distance(s) for s in distinct.tolist()], dtype=np.int64)
        return Needs(ids.astype(np.int32), lengths[inverse].astype(np.int32))

    def _build_mask(self, state: int, left: int) -> torch.Tensor:
        needs = self.needs(state)
        mask = np.zeros(self.index.vocab_size, dtype=bool)
        mask[needs.ids[needs.need <= left - 1]] = True
        return torch.from_numpy(mask)


def shortest(term: rx.Rx, singles: int, limit: int = SEARCH_LIMIT) -> int:
    """Bytes of the shortest string of `term` made of bytes in the mask `singles`; UNREACHABLE if none.

    Breadth first over derivatives on single bytes; a term whose witness is known to be shortest ends its branch
    with that length (`_known`), so only terms with intersections or complements are searched through.
    """
    best, depth, frontier, seen = UNREACHABLE, 0, [term], {term.id}
    while frontier and depth < best:
        later = []
        for t in frontier:
            if t.nullable:
                return depth
            known = _known(t, singles)
            if known is not None:
                best = min(best, depth + known)
                continue
            later.extend(_derivatives(t, singles, seen))
        if len(seen) > limit:
            raise GuideBudgetError(f"the shortest completion of {term!r} needs a search of more than {limit} terms")
        frontier, depth = later, depth + 1
    return best


def _known(term: rx.Rx, singles: int) -> int | None:
    """The length of `term`'s witness where it is a shortest string of single-token bytes: a plain term's witness
    is built from the shortest witnesses of its parts."""
    if not term.plain:
        return None
    found = rx.witness(term)
    if found is None or any(not (singles >> b) & 1 for b in found):
        return None
    return len(found)


def _derivatives(term: rx.Rx, singles: int, seen: set[int]) -> list[rx.Rx]:
    out = []
    for block, mask in enumerate(term.classes):
        if mask & singles:
            d = rx.derivative_of_block(term, block)
            if d is not rx.NOTHING and d.id not in seen:
                seen.add(d.id)
                out.append(d)
    return out

"""Closing within a token budget: which tokens leave room for a valid completion in the tokens left.

With a budget (`Guide.within`), a token is allowed at a position only if, after it, a valid completion still fits
in the tokens left. `distance(state)` is the number of tokens of one fixed way to complete from `state`, a strategy
that is a pure function of the state's term:

- an accepting state is complete (0 tokens: EOS needs no room, and a budget that runs out there leaves it complete);
- a state starting a forced chain F (bytes every continuation starts with, up to an accepting or branching state
  s') spells F in its fewest tokens: distance = tokens(F) + distance(s');
- any other state takes the longest token that spells a prefix of a shortest path to acceptance in bytes that tokens
  spell alone (all bytes are tokens in byte-level and byte-fallback vocabularies; ties go to the lowest byte):
  distance = 1 + distance(next).

Each move is an allowed token (a prefix of a path to acceptance, whose rest single-byte tokens spell), and each
brings the text strictly closer to acceptance in bytes, so the strategy ends. The rule keeps itself true: at a state
with `distance <= left` the strategy's own first token (the longest token above, or the first token of F's
fewest-token spelling, after which the rest of F needs one token fewer) leads to a state with `distance <= left - 1`,
so the mask is never empty and the output always ends complete.
A coalesced forced run spelled otherwise is cut where it would not fit (`Guide.forced`).

Per state, `need[i]` is the distance after the i-th allowed token: the budget mask at (state, left) is
`need <= left - 1`, built only where the budget binds (left - 1 below the largest need) and cached per (state,
left); elsewhere it is the state's own mask, the same tensor. Shortest byte paths come from terms: a plain term's
witness (`rx.witness`, a shortest string of terms without intersections and complements) where all its bytes are
single tokens, else a breadth-first search over derivatives that stops at such terms.
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
SEARCH_LIMIT = 20_000  # terms one byte-distance search may visit
MAX_KEPT = 200_000  # distances and bounds remembered per index before they start over
MAX_CHAIN = 4096  # a longer forced chain is completed byte by byte


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
        self.index, self.dfa = index, index.dfa
        self.singles = sum(1 << b for b in index.vocabulary.single_bytes)  # bytes one token spells alone
        self._single_bytes = np.asarray(sorted(index.vocabulary.single_bytes), dtype=np.int64)
        spelled = [b for b in index.vocabulary.token_bytes if b]
        self._spellings, self._longest = frozenset(spelled), max(map(len, spelled), default=1)
        self._distances: dict[int, int] = {FINISHED: 0}
        self._bytes: dict[int, int] = {}  # state -> shortest completion in single-token bytes
        self._steps: dict[int, tuple] = {}  # state -> (byte, next state) starting a shortest byte path, or ()
        self._bounds: dict[int, tuple[int, int]] = {}  # state -> (smallest, largest) need
        self._needs = BoundedCache(64, 256 << 20, lambda needs: needs.nbytes)
        self._masks = BoundedCache(1024, 256 << 20, lambda mask: mask.numel())

    def distance(self, state: int) -> int:
        """Tokens that complete the text from `state` (the strategy of the module docstring; UNREACHABLE if none)."""
        found = self._distances.get(state)
        if found is None:
            if len(self._distances) > MAX_KEPT:
                self._distances, self._bytes, self._steps = {FINISHED: 0}, {}, {}
            what = f"the shortest completion of state {state} of {self.dfa.name()}"
            with metered(self.index.budget, what, timed=False):  # during generation: work alone bounds it
                self._follow(state)
            found = self._distances[state]
        return found

    def _follow(self, state: int) -> None:
        """Walk the strategy from `state` to a state of known distance, then fill in the states passed."""
        segments = []  # [(state, tokens from it to the segment's end)], each segment ending where the next starts
        while state not in self._distances:
            if self.dfa.accepting[state]:
                self._distances[state] = 0
                break
            chain = self._chain(state)
            if chain is not None:
                states, data, state = chain
                segments.append(list(zip(states, _fewest_tokens(data, self._spellings, self._longest))))
                continue
            nxt = self._token_step(state)
            if nxt is None:
                self._distances[state] = UNREACHABLE
                break
            segments.append([(state, 1)])
            state = nxt
        after = self._distances[state]
        for segment in reversed(segments):
            for passed, tokens in segment:
                self._distances[passed] = min(UNREACHABLE, tokens + after)
            after = self._distances[segment[0][0]]

    def _chain(self, state: int) -> tuple[list[int], bytes, int] | None:
        """(states, bytes, end) of the forced chain from `state` (None when it is not one, or longer than MAX_CHAIN)."""
        states, data = [], bytearray()
        while not self.dfa.accepting[state] and len(data) <= MAX_CHAIN:
            row = self.dfa.row(state)
            live = np.flatnonzero(row != -1)  # DEAD
            if len(live) != 1:
                break
            states.append(state)
            data.append(int(live[0]))
            state = int(row[live[0]])
        return (states, bytes(data), state) if data and len(data) <= MAX_CHAIN else None

    def _token_step(self, state: int) -> int | None:
        """The state after the longest token that spells a prefix of the shortest byte path (`_step`) from `state`;
        None when no completion is spelled in single-token bytes."""
        data, states = bytearray(), [state]
        while len(data) < self._longest and not self.dfa.accepting[states[-1]]:
            step = self._step(states[-1])
            if step is None:
                break
            data.append(step[0])
            states.append(step[1])
        for n in range(len(data), 0, -1):
            if bytes(data[:n]) in self._spellings:
                return states[n]
        return None

    def _step(self, state: int) -> tuple[int, int] | None:
        """(byte, next state): the lowest single-token byte that starts a shortest byte path; None if none does."""
        found = self._steps.get(state)
        if found is None:
            targets = self.dfa.row(state).take(self._single_bytes)  # (n_singles,)
            best, found = UNREACHABLE, ()
            for byte, target in zip(self._single_bytes.tolist(), targets.tolist()):  # in byte order
                length = self.byte_distance(target) if target != -1 else UNREACHABLE  # DEAD
                if length < best:
                    best, found = length, (byte, target)
            self._steps[state] = found
        return found or None

    def byte_distance(self, state: int) -> int:
        """Bytes of the shortest completion from `state` made of bytes that tokens spell alone (UNREACHABLE if none)."""
        found = self._bytes.get(state)
        if found is None:
            found = self._bytes[state] = shortest(self.dfa.term(state), self.singles)
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


def _fewest_tokens(data: bytes, spellings: frozenset, longest: int) -> list[int]:
    """(len(data),) the fewest tokens that spell each suffix data[i:] exactly (UNREACHABLE where none do)."""
    fewest = [0] * (len(data) + 1)
    for i in range(len(data) - 1, -1, -1):
        options = (fewest[i + n] for n in range(1, min(longest, len(data) - i) + 1) if data[i:i + n] in spellings)
        fewest[i] = min(UNREACHABLE, 1 + min(options, default=UNREACHABLE))
    return fewest[:-1]


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

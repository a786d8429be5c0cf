"""Tokens that end without a walk through the DFA: free text and counted text.

A walk of the vocabulary from a state (`fsm.index`) first sets apart the tokens whose end it can tell
from a few cached facts about the states their first character leads to:

- looping (free text: a string, an undeclared key): that state returns to itself on each of the
  token's other characters, an ASCII byte that loops or a multi-byte character all of whose valid byte
  sequences lead back; the token, valid UTF-8, ends there;
- counting (a string with maxLength): at least MIN_LOOP_BYTES bytes lead on alike through a chain of
  states; a token whose other bytes are all among them ends at the chain's state for its length.

Everything else is walked byte by byte. Facts about characters are memoized per DFA state.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np

from fsm.lazy_dfa import DEAD, LazyDFA

MIN_LOOP_BYTES = 32  # a state looping on this many ASCII bytes ends the tokens made of them without a walk
MAX_LOOP_TARGETS = 8  # looping states tested per walk (each costs a pass over the vocabulary)
MIXED = -3  # a lead byte whose characters end in different states, or pass an accepting one inside
_SECOND = {0xE0: (0xA0, 0xC0), 0xED: (0x80, 0xA0), 0xF0: (0x90, 0xC0), 0xF4: (0x80, 0x90)}  # valid 2nd bytes
_LEAD_GROUPS = tuple(np.asarray(g) for g in ([*range(0xC2, 0xE0)], [0xE0], [*range(0xE1, 0xED), 0xEE, 0xEF], [0xED],
                                            [0xF0], [0xF1, 0xF2, 0xF3], [0xF4]))  # lead bytes with alike 2nd bytes
_CHAR_ENDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # dfa -> {state: (256,) ends, key: end}


@dataclass(frozen=True)
class Staying:
    """Tokens that end without a walk: rows of layout.order (ascending), their end states, and which of
    them pass an accepting state strictly inside their bytes."""

    rows: np.ndarray  # (n,) int64
    ends: np.ndarray  # (n,) int32
    crossing: np.ndarray  # (n,) bool


def staying(dfa: LazyDFA, layout, state: int, first: np.ndarray):
    """A Staying for each state the first character of a token leads to from `state` that loops on at least
    MIN_LOOP_BYTES ASCII bytes, else counts alike on as many (see the module docstring); at most
    MAX_LOOP_TARGETS of them, those most first bytes lead to first. `first` is (n_tokens,) the state after
    each token's first byte."""
    ends = char_ends(dfa, state)
    targets, counts = np.unique(ends[ends >= 0], return_counts=True)  # (<= 256,) the states a character leads to
    first_chars = None
    found = 0
    for target, count in zip(*(a.tolist() for a in _by_count(targets, counts))):
        stay = None
        mask = _loop_mask(dfa, target)
        if int(mask[:0x80].sum()) >= MIN_LOOP_BYTES:
            if first_chars is None:
                first_chars = ends[layout.columns[0]]  # (n_tokens,) the state after each token's first character
            stay = _looping(dfa, layout, target, mask, first_chars)
        elif count >= MIN_LOOP_BYTES:  # counted text: many first bytes count alike too
            stay = _counting(dfa, layout, target, first)
        if stay is None:
            continue
        yield stay
        found += 1
        if found == MAX_LOOP_TARGETS:
            return


def _by_count(targets: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(-counts, kind="stable")  # most first bytes first
    return targets[order], counts[order]


def char_ends(dfa: LazyDFA, state: int) -> np.ndarray:
    """(256,) int32: for an ASCII byte the state after it; for a UTF-8 lead byte the state after every valid
    character it starts (DEAD where they all die, MIXED where they differ or pass an accepting state inside);
    MIXED for the other bytes (memoized)."""
    memo = _CHAR_ENDS.setdefault(dfa, {})
    found = memo.get(state)
    if found is None:
        row = dfa.row(state)
        found = np.full(256, MIXED, dtype=np.int32)
        found[:0x80] = row[:0x80]
        for leads in _LEAD_GROUPS:  # leads alike: one computation per state they lead to
            after, where = np.unique(row[leads], return_inverse=True)
            ends = [_char_end(dfa, a, int(leads[0]), memo) for a in after.tolist()]
            found[leads] = np.asarray(ends, dtype=np.int32)[where]
        memo[state] = found
    return found


def _char_end(dfa: LazyDFA, after_lead: int, lead: int, memo: dict) -> int:
    """The one state every valid character that starts with `lead` ends in, from `after_lead` (the state after
    the lead byte); MIXED if none."""
    low, high = _SECOND.get(lead, (0x80, 0xC0))
    more = 1 if lead < 0xE0 else 2 if lead < 0xF0 else 3  # continuation bytes after the lead
    key = (after_lead, low, high, more)
    if key not in memo:
        frontier = {after_lead}
        for k in range(more):
            following = set()
            for s in frontier:
                if s != DEAD and dfa.accepting[s]:
                    memo[key] = MIXED
                    return MIXED
                following.update([DEAD] if s == DEAD else np.unique(dfa.row(s)[low:high] if k == 0 else dfa.row(s)[0x80:0xC0]).tolist())
            frontier = following
        memo[key] = frontier.pop() if len(frontier) == 1 else MIXED
    return memo[key]


def _loop_mask(dfa: LazyDFA, target: int) -> np.ndarray:
    """(256,) bool: the ASCII bytes that loop on `target`, the lead bytes whose characters all lead back to
    it, and the continuation bytes (inside those characters, in a valid UTF-8 token)."""
    mask = char_ends(dfa, target) == target
    mask[0x80:0xC0] = True
    return mask


def _looping(dfa: LazyDFA, layout, target: int, mask: np.ndarray, first_chars: np.ndarray) -> Staying:
    rows = np.flatnonzero((first_chars == target) & layout.chars_within(_mask_of(mask)))
    if dfa.accepting[target]:  # a token of more than one character passes it inside
        crossing = layout.lengths[layout.order[rows]] > layout.first_char_lengths[rows]
    else:
        crossing = np.zeros(len(rows), dtype=bool)
    return Staying(rows, np.full(len(rows), target, dtype=np.int32), crossing)


def _counting(dfa: LazyDFA, layout, target: int, first: np.ndarray) -> Staying | None:
    after = dfa.row(target)
    live = after[after != DEAD]
    if len(live) < MIN_LOOP_BYTES:
        return None
    values, counts = np.unique(live, return_counts=True)
    if counts.max() < MIN_LOOP_BYTES:
        return None
    group = after == values[counts.argmax()]
    rows = np.flatnonzero((first == target) & layout.tails_within(_mask_of(group)))
    lengths = layout.lengths[layout.order[rows]]
    chain = _counter_chain(dfa, target, np.flatnonzero(group), int(lengths.max(initial=0)))
    rows, lengths = rows[lengths <= len(chain)], lengths[lengths <= len(chain)]
    passed = np.cumsum(dfa.accepting[chain]) > 0  # passed[i]: an accepting state among chain[:i + 1]
    crossing = (lengths > 1) & passed[np.maximum(lengths - 2, 0)]
    return Staying(rows, chain[lengths - 1], crossing)


def _counter_chain(dfa: LazyDFA, target: int, group: np.ndarray, longest: int) -> np.ndarray:
    """(m,) int32 states [target, c1, c2, ...] (m <= longest) where every byte of `group` leads from each to
    the next: a token of length n whose bytes after the first are in `group` ends at chain[n - 1]."""
    chain = [target]
    while len(chain) < longest:
        after = dfa.row(chain[-1])[group]
        nxt = int(after[0])
        if nxt == DEAD or not (after == nxt).all():
            break
        chain.append(nxt)
    return np.asarray(chain, dtype=np.int32)


def _mask_of(bits: np.ndarray) -> int:
    """The 256-bit mask of a (256,) bool array."""
    return int.from_bytes(np.packbits(bits, bitorder="little").tobytes(), "little")

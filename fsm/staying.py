"""Tokens that end without a walk through the DFA: free text and counted text.

A walk of the vocabulary from a state (`fsm.index`) first sets apart the tokens whose end it can tell
from a few cached facts about the states their first character leads to:

- looping (free text: a string, an undeclared key): that state returns to itself on each of the
  token's other characters, an ASCII byte that loops or a multi-byte character all of whose valid byte
  sequences lead back; the token, valid UTF-8, ends there;
- counting (a string with maxLength): at least MIN_LOOP_BYTES characters (ASCII bytes, lead bytes) lead
  on alike through a chain of states; a token whose other characters are all among them ends at the
  chain's state for its number of characters.

Everything else is walked byte by byte. Facts about characters are memoized per DFA state.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np

from fsm.lazy_dfa import DEAD, LazyDFA

MIN_LOOP_BYTES = 32  # a state looping on this many ASCII bytes ends the tokens made of them without a walk
MAX_LOOP_TARGETS = 8  # looping states tested per walk (each costs a pass over the vocabulary)
MAX_CHAIN = 16  # counter states followed per walk: the few tokens of more characters are walked
MAX_CHAR_ENDS = 16_384  # states (and lead-byte facts) memoized per DFA
MIXED = -3  # a lead byte whose characters end in different states, or pass an accepting one inside
_SECOND = {0xE0: (0xA0, 0xC0), 0xED: (0x80, 0xA0), 0xF0: (0x90, 0xC0), 0xF4: (0x80, 0x90)}  # valid 2nd bytes
_LEAD_GROUPS = tuple(np.asarray(g) for g in ([*range(0xC2, 0xE0)], [0xE0], [*range(0xE1, 0xED), 0xEE, 0xEF], [0xED],
                                            [0xF0], [0xF1, 0xF2, 0xF3], [0xF4]))  # lead bytes with alike 2nd bytes
_CHAR_ENDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # dfa -> {state: (256,) ends, key: end}


@dataclass(frozen=True)
class Staying:
    """Tokens that end without a walk, over the rows of layout.order: which, their end states (DEAD for
    those that die), and which of them pass an accepting state strictly inside their bytes."""

    rows: np.ndarray  # (n_tokens,) bool
    ends: np.ndarray | int  # (n_tokens,) int32 read where `rows`, or one state for all of them
    crossing: np.ndarray | None  # (n_tokens,) bool within `rows`; None: none of them


def staying(dfa: LazyDFA, layout, state: int):
    """A Staying for each state the first character of a token leads to from `state` that loops on at least
    MIN_LOOP_BYTES ASCII bytes, else counts alike on as many characters (see the module docstring); at most
    MAX_LOOP_TARGETS of them, those most first bytes lead to first."""
    ends = char_ends(dfa, state)
    targets, counts = np.unique(ends[ends >= 0], return_counts=True)  # (<= 256,) the states a character leads to
    first_chars = None  # (n_tokens,) the state after each token's first character, taken when first needed
    found = 0
    for target, count in zip(*(a.tolist() for a in _by_count(targets, counts))):
        stay = None
        if count < MIN_LOOP_BYTES and not _loops_on_enough(dfa, target):
            continue  # neither loops nor counts: its facts (a row of derivatives) are not needed
        mask = _loop_mask(dfa, target)
        if first_chars is None and (int(mask[:0x80].sum()) >= MIN_LOOP_BYTES or count >= MIN_LOOP_BYTES):
            first_chars = ends.take(layout.columns[0])
        if int(mask[:0x80].sum()) >= MIN_LOOP_BYTES:
            stay = _looping(dfa, layout, target, mask, first_chars)
        elif count >= MIN_LOOP_BYTES:  # counted text: many first characters count alike too
            stay = _counting(dfa, layout, target, first_chars)
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
    if len(memo) > MAX_CHAR_ENDS:  # ~1 KiB a state: start over rather than grow with a long walk
        memo.clear()
    found = memo.get(state)
    if found is None:
        row = dfa.row(state)
        found = np.full(256, MIXED, dtype=np.int32)
        found[:0x80] = row[:0x80]
        for leads in _LEAD_GROUPS:  # leads alike: one computation per state they lead to, in state order
            after = row[leads].tolist()  # a list and a set: np.unique costs more on so few bytes
            ends = {a: _char_end(dfa, a, int(leads[0]), memo) for a in sorted(set(after))}
            found[leads] = [ends[a] for a in after]
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
                following.update(
                    [DEAD]
                    if s == DEAD
                    else np.unique(dfa.row(s)[low:high] if k == 0 else dfa.row(s)[0x80:0xC0]).tolist()
                )
            frontier = following
        memo[key] = frontier.pop() if len(frontier) == 1 else MIXED
    return memo[key]


def _loops_on_enough(dfa: LazyDFA, target: int) -> bool:
    """Whether at least MIN_LOOP_BYTES ASCII bytes lead from `target` back to it (`_loop_mask`'s count), deriving the
    blocks of its term's byte classes with the most ASCII bytes first and stopping once the rest cannot make it up:
    a state that loops on no block (a key, punctuation) costs a derivative or two, not a row of them."""
    blocks = sorted(((mask & _ASCII).bit_count(), mask) for mask in dfa.term(target).classes if mask & _ASCII)
    found, left = 0, sum(n for n, _ in blocks)
    while blocks and MIN_LOOP_BYTES - found <= left:
        n, mask = blocks.pop()
        left -= n
        if dfa.next(target, ((mask & _ASCII) & -(mask & _ASCII)).bit_length() - 1) == target:
            found += n
            if found >= MIN_LOOP_BYTES:
                return True
    return False


_ASCII = (1 << 0x80) - 1


def _loop_mask(dfa: LazyDFA, target: int) -> np.ndarray:
    """(256,) bool: the ASCII bytes that loop on `target`, the lead bytes whose characters all lead back to
    it, and the continuation bytes (inside those characters, in a valid UTF-8 token)."""
    mask = char_ends(dfa, target) == target
    mask[0x80:0xC0] = True
    return mask


def _looping(dfa: LazyDFA, layout, target: int, mask: np.ndarray, first_chars: np.ndarray) -> Staying:
    rows = (first_chars == target) & layout.chars_within(_mask_of(mask))
    crossing = None
    if dfa.accepting[target]:  # a token of more than one character passes it inside
        crossing = rows & (layout.char_counts > 1)
    return Staying(rows, target, crossing)


def _counting(dfa: LazyDFA, layout, target: int, first_chars: np.ndarray) -> Staying | None:
    after = char_ends(dfa, target)
    live = after[after >= 0]
    if len(live) < MIN_LOOP_BYTES:
        return None
    values, counts = np.unique(live, return_counts=True)
    if counts.max() < MIN_LOOP_BYTES:
        return None
    group = after == values[counts.argmax()]  # (256,) the ASCII and lead bytes of the characters that count alike
    mask = group.copy()
    mask[0x80:0xC0] = True
    rows = (first_chars == target) & layout.chars_within(_mask_of(mask))
    chars = layout.char_counts  # (n_tokens,)
    longest = min(int(chars[rows].max(initial=0)), MAX_CHAIN)
    chain, dies_after = _counter_chain(dfa, target, np.flatnonzero(group), longest)
    if not dies_after:  # a token of more characters than the chain is walked
        rows &= chars <= len(chain)
    steps = np.minimum(chars, len(chain) + 1) - 1  # (n_tokens,) the chain's index after each token, len: past its end
    ends = np.append(chain, DEAD).take(steps)
    passed = np.append(np.cumsum(dfa.accepting[chain]) > 0, True)  # an accepting state among chain[:i + 1]
    crossing = rows & (chars > 1) & passed.take(np.maximum(steps - 1, 0))
    return Staying(rows, ends, crossing if crossing.any() else None)


def _counter_chain(dfa: LazyDFA, target: int, group: np.ndarray, longest: int) -> np.ndarray:
    """((m,) int32 states [target, c1, c2, ...] (m <= longest) where every character that starts with a byte of
    `group` leads from each to the next, so a token of n <= m such characters ends at chain[n - 1]; and whether
    every such character dies after the chain's last state, so a token of more of them dies)."""
    chain = [target]
    while len(chain) < longest:
        after = char_ends(dfa, chain[-1])[group]
        nxt = int(after[0])
        if nxt < 0 or not (after == nxt).all():
            return np.asarray(chain, dtype=np.int32), bool((after == DEAD).all())
        chain.append(nxt)
    return np.asarray(chain, dtype=np.int32), False


def _mask_of(bits: np.ndarray) -> int:
    """The 256-bit mask of a (256,) bool array."""
    return int.from_bytes(np.packbits(bits, bitorder="little").tobytes(), "little")

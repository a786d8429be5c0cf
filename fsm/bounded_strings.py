"""Bounded JSON strings (`minLength`, `maxLength`) without a walk per count of characters.

Inside a string with at least `low` and at most `high` characters left, every count is another DFA state, so a
walk of the vocabulary per count made every position of such a string a first visit. The counts change only which
tokens fit: a token is allowed there exactly when it is allowed in the same state with the bounds lifted (the twin:
`star(STRING_CHAR)` for `repeat(STRING_CHAR, low, high)`, the same tail), starts at most `high` characters of the
string, and, where it closes the string (`closing_quotes`), starts at least `low` before it. So the twin's mask is
walked once per tail, each count's mask is it with the tokens of too many or too few characters taken out
(`string_chars`, counted once per vocabulary), and a token's next state is read from the DFA when it is taken. Exact
where every allowed token is also token-live (the index checks): a string's characters parse one way (no lone
surrogates), so the count of a token is the count.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from functools import cached_property
from typing import Callable

import numpy as np
import torch

from fsm import rx
from fsm.json_terms import QUOTE, STRING_CHAR
from fsm.lazy_dfa import DEAD, LazyDFA

_COUNTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # vocabulary -> (string_chars, closing_quotes)


def unbounded_twin(term: rx.Rx) -> tuple[rx.Rx, int, int | None] | None:
    """(the twin's term, `low`, `high`) when `term` is a JSON string at a character boundary with at least `low`
    and at most `high` (None: no bound) characters left before its closing quote, one of them a bound (innermost
    items of any-order lists too); else None."""
    items, frames = rx.split_pick(term) or (term, ())
    if items.kind != "seq":
        return None
    first, rest = items.args
    if first.kind != "repeat" or first.args[0] is not STRING_CHAR or first.args[1:] == (0, None):
        return None
    if rest is not QUOTE and not (rest.kind == "seq" and rest.args[0] is QUOTE):
        return None
    lifted = rx.seq(rx.star(STRING_CHAR), rest)
    return rx.unsplit(lifted, frames), first.args[1], first.args[2]


def string_chars(vocabulary) -> np.ndarray:
    """(vocab_size,) int32 by token id: the string characters (code points: an escape is one, a surrogate pair
    one) a token starts from a character boundary inside a JSON string before an unescaped quote would close
    it, a character cut at the token's end included (memoized per vocabulary)."""
    return _counted(vocabulary)[0]


def closing_quotes(vocabulary) -> np.ndarray:
    """(vocab_size,) bool by token id: the token holds an unescaped quote, read from a character boundary inside a
    JSON string (it closes the string; memoized per vocabulary)."""
    return _counted(vocabulary)[1]


def _counted(vocabulary) -> tuple[np.ndarray, np.ndarray]:
    found = _COUNTS.get(vocabulary)
    if found is None:
        found = _COUNTS[vocabulary] = _count_string_chars(vocabulary)
    return found


def _count_string_chars(vocabulary) -> tuple[np.ndarray, np.ndarray]:
    """(`string_chars`, `closing_quotes`), column by column of the walk layout: bytes that start a character until
    the first quote; the few tokens with a backslash before it are read one by one."""
    layout = vocabulary.walk_layout
    n = len(layout.order)
    chars, open_, escaped = np.zeros(n, np.int32), np.ones(n, bool), np.zeros(n, bool)  # (n_tokens,) over order
    for column in layout.columns:  # (counts[j],) byte j of the tokens longer than j bytes
        m = len(column)
        still = open_[:m] & (column != 0x22)
        open_[:m] = still
        escaped[:m] |= still & (column == 0x5C)
        chars[:m] += still & ((column & 0xC0) != 0x80)
    out, closes = np.zeros(vocabulary.vocab_size, dtype=np.int32), np.zeros(vocabulary.vocab_size, dtype=bool)
    out[layout.order], closes[layout.order] = chars, ~open_
    for token in layout.order[escaped].tolist():
        out[token], closes[token] = _escaped_chars(vocabulary.token_bytes[token])
    return out, closes


def _escaped_chars(token: bytes) -> tuple[int, bool]:
    """(`string_chars`, whether it closes the string) of a token with a backslash: escapes read whole (a quote
    inside one closes nothing, the low half of a surrogate pair starts no character)."""
    count, i, after_high = 0, 0, False
    while i < len(token) and token[i] != 0x22:
        if token[i] == 0x5C:
            count += not after_high
            unicode = token[i + 1: i + 2] == b"u"
            digits = token[i + 2: i + 4]
            after_high = unicode and not after_high and len(digits) == 2 and digits[:1] in b"dD" \
                and digits[1:] in b"89abAB"
            i += 6 if unicode else 2
            continue
        after_high = False
        count += token[i] & 0xC0 != 0x80
        i += 1
    return count, i < len(token)


@dataclass(frozen=True, eq=False)
class BoundedStringInfo:
    """What a state inside a bounded string allows: its twin's tokens that start as many characters of the string
    as its bounds let them; a token's next state is read from the DFA when asked. Same interface as
    index.StateInfo."""

    dfa: LazyDFA
    state: int
    token_bytes: tuple  # (vocab_size,) bytes of every id
    mask: torch.Tensor  # (vocab_size,) bool, the twin's own where no allowed token is cut out
    max_token_length: int  # longest allowed token in bytes
    walk: Callable[[], tuple[np.ndarray, np.ndarray]]  # (ids, end states) of every surviving token, walked

    @cached_property
    def token_ids(self) -> np.ndarray:
        return np.flatnonzero(self.mask.numpy()).astype(np.int32)

    def next_of(self, token_id: int) -> int:
        """The state after `token_id`, or DEAD when the token is not allowed."""
        if not self.mask.numpy()[token_id]:
            return DEAD
        return self.dfa.walk(self.token_bytes[token_id], self.state)

    @cached_property
    def _successors(self) -> tuple[np.ndarray, np.ndarray]:
        ids, nexts = self.walk()
        by_id = np.full(len(self.token_bytes), DEAD, dtype=np.int32)
        by_id[ids] = nexts
        return self.token_ids, by_id[self.token_ids]

    def successors(self) -> tuple[np.ndarray, np.ndarray]:
        """(token_ids, next_states) of the allowed tokens (one walk of the vocabulary, on first use)."""
        return self._successors

    @property
    def next_states(self) -> np.ndarray:
        return self._successors[1]

    @property
    def nbytes(self) -> int:
        return self.mask.numel()


def bounded_info(twin, low: int, high: int | None, dfa: LazyDFA, state: int, vocabulary, walk) -> BoundedStringInfo:
    """The BoundedStringInfo of `state`, whose twin's info is `twin` and which has at least `low` and at most `high`
    (None: no bound) characters left."""
    twin_mask = twin.mask.numpy()  # (vocab_size,) bool
    cut = _cut_out(vocabulary, low, high)
    dropped = twin_mask & cut
    mask = twin.mask if not dropped.any() else torch.from_numpy(twin_mask & ~cut)
    lengths = vocabulary.walk_layout.lengths
    longest = int(lengths[mask.numpy()].max(initial=0))
    return BoundedStringInfo(dfa, state, vocabulary.token_bytes, mask, longest, walk)


def _cut_out(vocabulary, low: int, high: int | None) -> np.ndarray:
    """(vocab_size,) bool: the tokens that start more than `high` characters of the string, or close it after fewer
    than `low`."""
    chars = string_chars(vocabulary)
    cut = np.zeros(len(chars), dtype=bool) if high is None else chars > high
    if low:
        cut |= closing_quotes(vocabulary) & (chars < low)
    return cut

"""States that start with a literal (a key, punctuation): the literal read off the term, next states numbered late.

The derivative of seq(byte, rest) by its byte is `rest`, so the literal a state starts with is read off its term
without a DFA cell per byte (`literal_places`). Each allowed token of such a state goes to a place: a term after
some of the literal's bytes (a token that spells a prefix of it), a crossing token's (split, end) past its end, or a
state numbered already. A place gets its DFA state when a token first goes there (`LiteralStateInfo.next_of`), as the
ends of a head do (`fsm.index.HeadStateInfo`): a first walk takes one token per position, not every place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np
import torch

from fsm import rx
from fsm.lazy_dfa import DEAD, LazyDFA
from fsm.masks import MaskSlabs

UNNUMBERED = -3  # a place whose state is numbered when a token first goes there
FEW_TOKENS = 32  # a literal state allowing at most this many tokens sorts them in Python
MAX_SHARED = 4096  # token sets remembered per index by `LiteralInfos` (started over past this)


def leading_byte(term: rx.Rx) -> int | None:
    """The byte `term` starts with where its first part is exactly one byte (a literal goes on), else None."""
    first = term.args[0] if term.kind == "seq" else term
    if first.kind != "bytes" or first.args[0] & (first.args[0] - 1):
        return None
    return rx.lowest_byte(first.args[0])


def literal_places(dfa: LazyDFA, term: rx.Rx, places: list) -> Iterator[tuple[int, int]]:
    """(byte, place) along the literal `term` starts with (a chain of one-byte parts), read as far as the caller
    reads: each term after a byte is appended to `places` and its index yielded. Stops before a byte after which the
    term is DEAD in `dfa` (as a DFA walk stops)."""
    while (byte := leading_byte(term)) is not None:
        term = rx.derivative(term, byte)
        if dfa.is_dead(term):
            return
        places.append(term)
        yield byte, len(places) - 1


@dataclass(frozen=True, eq=False)
class LiteralStateInfo:
    """What a state that starts with a literal allows: sorted token ids and the place each goes to, numbered on first
    use by `number(place)`. Same interface as `fsm.index.StateInfo`."""

    token_ids: np.ndarray  # (n,) int32 sorted
    slots: np.ndarray  # (n,) int32 the place of each token: an index into `states`
    states: np.ndarray  # (n_places,) int32 the state of each place, UNNUMBERED until a token goes there
    number: Callable[[int], int]  # place -> its state of the whole DFA
    mask: torch.Tensor  # (vocab_size,) bool
    max_token_length: int  # longest allowed token in bytes

    def next_of(self, token_id: int) -> int:
        """The state after `token_id`, or DEAD when the token is not allowed."""
        ids = self.token_ids
        i = int(ids.searchsorted(token_id))
        if i < len(ids) and ids[i] == token_id:
            return self._state(int(self.slots[i]))
        return DEAD

    def _state(self, place: int) -> int:
        if self.states[place] == UNNUMBERED:
            self.states[place] = self.number(place)
        return int(self.states[place])

    def successors(self) -> tuple[np.ndarray, np.ndarray]:
        """(token_ids, next_states) of the allowed tokens, each place numbered once."""
        for place in np.unique(self.slots).tolist():
            self._state(place)
        return self.token_ids, self.states.take(self.slots)

    @property
    def next_states(self) -> np.ndarray:
        return self.successors()[1]

    @property
    def nbytes(self) -> int:
        return self.token_ids.nbytes + self.slots.nbytes + self.states.nbytes + self.mask.numel()


def literal_info(ids: np.ndarray, slots: np.ndarray, n_places: int, number: Callable[[int], int], mask: np.ndarray,
                 lengths: np.ndarray) -> LiteralStateInfo:
    """The LiteralStateInfo of the tokens `ids` (n,) going to places `slots` (n,) of `n_places`; a token listed twice
    goes where its last entry says. `mask`: a fresh all-False (vocab_size,) bool array, set here and kept as the
    state's mask; `lengths`: (vocab_size,) bytes of each token."""
    if len(ids) <= FEW_TOKENS:  # most literal states: a dict and a sort beat a dozen numpy calls (~10 us)
        by_id = dict(zip(ids.tolist(), slots.tolist()))  # a token listed twice: its last entry
        ids = np.asarray(sorted(by_id), dtype=np.int32)
        slots = np.asarray([by_id[i] for i in ids.tolist()], dtype=np.int32)
    else:
        order = np.argsort(ids, kind="stable")
        ids, slots = ids[order], slots[order]
        last = np.append(ids[1:] != ids[:-1], True)[: len(ids)]
        ids, slots = ids[last].astype(np.int32), slots[last].astype(np.int32)
    mask[ids] = True
    longest = int(lengths[ids].max(initial=0)) if len(ids) else 0
    states = np.full(n_places, UNNUMBERED, dtype=np.int32)
    return LiteralStateInfo(ids, slots, states, number, torch.from_numpy(mask), longest)


@dataclass(eq=False)
class LiteralInfos:
    """`literal_info` for the literal states of one token index, sharing the sorted tokens and the mask of the states
    whose walks found the same tokens going to the same places (a key and the punctuation around it recur: ~60% of
    a first walk's literal states repeat one, and their masks then cost no sort and no page faults). Each state
    gets its own places (`number`, `states`)."""

    slabs: MaskSlabs  # the index's masks (`fsm.masks`)
    _found: dict = field(default_factory=dict, repr=False)  # (ids, slots) bytes -> a LiteralStateInfo of them

    def info(self, ids: np.ndarray, slots: np.ndarray, n_places: int, number: Callable[[int], int],
             lengths: np.ndarray) -> LiteralStateInfo:
        """`literal_info(ids, slots, n_places, number, mask, lengths)` with a fresh mask, or the mask of the same
        walk."""
        key = (ids.tobytes(), slots.tobytes())
        found = self._found.get(key)
        if found is None:
            if len(self._found) >= MAX_SHARED:
                self._found.clear()
            found = literal_info(ids, slots, n_places, None, self.slabs.take(), lengths)
            self._found[key] = found  # `number` left out: it holds the state's places
        states = np.full(n_places, UNNUMBERED, dtype=np.int32)
        return LiteralStateInfo(found.token_ids, found.slots, states, number, found.mask, found.max_token_length)

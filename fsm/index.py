"""TokenIndex: which token ids a DFA state allows, where each leads, and which tokens are forced.

States are indexed lazily, on their first visit, by walking every token's bytes through the DFA at
once (numpy over all tokens, one column of bytes per step, dropping tokens as they die); the DFA
itself grows lazily under that walk. Results are cached, so a revisit costs a dictionary lookup.
The index is logically immutable: the caches only memoize pure functions of (DFA, vocabulary).
First visits run under the index's `Budget` and `BUILD_LOCK`; a revisit takes no lock. At most
MAX_CACHED_STATES states and about MAX_CACHED_BYTES of them are kept (the oldest go first and are
rebuilt if visited again).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial

import numpy as np
import torch

from fsm.budget import DEFAULT_BUDGET, Budget, metered
from fsm.lazy_dfa import DEAD, LazyDFA
from fsm.liveness import TokenLiveness
from fsm.vocabulary import Vocabulary

FINISHED = -2  # the state after EOS
MAX_CACHED_STATES = 4096  # per index
MAX_CACHED_BYTES = 256 << 20  # per index: a state allowing all of a 49k vocabulary holds ~0.8 MiB
MIN_LOOP_BYTES = 32  # a state looping on this many bytes ends the tokens made of them without a walk
MAX_LOOP_TARGETS = 8  # looping states tested per first visit (each costs a pass over the vocabulary)
MAX_FORCED_BYTES = 256  # a forced string is cut here (a{1000000} would otherwise walk a million states)


@dataclass(frozen=True, eq=False)
class StateInfo:
    """What one DFA state allows. token_ids is sorted; next_states[i] follows token_ids[i]."""

    token_ids: np.ndarray  # (n_allowed,) int32, EOS included where the state accepts
    next_states: np.ndarray  # (n_allowed,) int32, FINISHED after EOS
    mask: torch.Tensor  # (vocab_size,) bool
    max_token_length: int  # longest allowed token in bytes (EOS counts 0)


@dataclass(frozen=True, eq=False)
class TokenIndex:
    """Token-level view of a byte DFA for one vocabulary (see the module docstring)."""

    dfa: LazyDFA
    vocabulary: Vocabulary
    budget: Budget = DEFAULT_BUDGET
    _states: dict = field(default_factory=dict, repr=False)
    _forced: dict = field(default_factory=dict, repr=False)
    _info_bytes: list = field(default_factory=lambda: [0], repr=False)  # bytes of the infos in _states

    def __post_init__(self):
        crawl = partial(_walk_all_tokens, self.dfa, self.vocabulary)  # not a closure over self: no cycle
        object.__setattr__(self, "_live", TokenLiveness(self.dfa, self.vocabulary.single_bytes, crawl))

    @property
    def vocab_size(self) -> int:
        return self.vocabulary.vocab_size

    def info(self, state: int) -> StateInfo:
        """Allowed tokens of `state`, computed on the first visit and cached."""
        found = self._states.get(state)  # lock-free: dict reads are atomic, entries never change
        if found is None:
            found = self._first_visit(state, self._states, self._build_info)
        return found

    def next_state(self, state: int, token_id: int) -> int:
        """The state after `token_id`, or DEAD when the token is not allowed."""
        info = self.info(state)
        i = int(np.searchsorted(info.token_ids, token_id))
        if i < len(info.token_ids) and info.token_ids[i] == token_id:
            return int(info.next_states[i])
        return DEAD

    def is_accepting(self, state: int) -> bool:
        return state == FINISHED or bool(self.dfa.accepting[state])

    def forced_tokens(self, state: int) -> tuple[int, ...]:
        """Canonical tokens of the forced string from `state`, minus a tail a longer token could span."""
        found = self._forced.get(state)
        if found is None:
            found = self._first_visit(state, self._forced, self._build_forced)
        return found

    @property
    def nbytes(self) -> int:
        """Bytes held by the DFA's arrays and the cached states (masks and token arrays)."""
        return self.dfa.nbytes + self._info_bytes[0]

    def _first_visit(self, state: int, cache: dict, build):
        with metered(self.budget, f"the first visit of state {state} of {self.dfa.name()}"):
            found = cache.get(state)  # another thread may have built it while this one waited
            if found is None:
                found = build(state)
                size = _size(found)  # 0 for forced tokens: only infos count towards the bytes
                while cache and (len(cache) >= MAX_CACHED_STATES or (size and self._info_bytes[0] + size > MAX_CACHED_BYTES)):
                    self._info_bytes[0] -= _size(cache.pop(next(iter(cache))))
                cache[state] = found
                self._info_bytes[0] += size
        return found

    # -- building ---------------------------------------------------------------------------

    def _build_info(self, state: int) -> StateInfo:
        if state == FINISHED:  # after EOS only EOS (padding) is allowed
            ids = np.asarray(self.vocabulary.eos_token_ids[:1], dtype=np.int64)
            nexts = np.full(len(ids), FINISHED, dtype=np.int64)
        else:
            ids, nexts = _walk_all_tokens(self.dfa, self.vocabulary, state)
            keep = self._live.keep(nexts)
            if keep is not None:
                ids, nexts = ids[keep], nexts[keep]
            if self.dfa.accepting[state]:
                eos = np.asarray(self.vocabulary.eos_token_ids, dtype=np.int64)
                ids = np.concatenate([ids, eos])
                nexts = np.concatenate([nexts, np.full(len(eos), FINISHED, dtype=np.int64)])
        mask = np.zeros(self.vocab_size, dtype=bool)  # numpy: torch's threaded fill costs ms on a busy CPU
        mask[ids] = True
        by_id = np.empty(self.vocab_size, dtype=np.int32)  # (vocab_size,) scratch: sorts without argsort
        by_id[ids] = nexts
        ids = np.flatnonzero(mask).astype(np.int32)  # int32: half the memory of a cached state
        nexts = by_id[ids]
        lengths = self.vocabulary.walk_layout.lengths
        return StateInfo(ids, nexts, torch.from_numpy(mask), int(lengths[ids].max(initial=0)) if len(ids) else 0)

    def _build_forced(self, state: int) -> tuple[int, ...]:
        forced = _forced_text(self.dfa, state)
        if not forced:
            return ()
        tokens, starts = self._spell(state, self.vocabulary.encode(forced))
        end = len(forced.encode())
        # Hold back from the first token after which a longer allowed token could cross the end.
        for i, (token_start, token_state) in enumerate(starts):
            if self.info(token_state).max_token_length > end - token_start:
                return tuple(tokens[:i])
        return tuple(tokens)

    def _spell(self, state: int, ids: list[int]) -> tuple[list[int], list[tuple[int, int]]]:
        """The prefix of `ids` the index allows from `state`, with each token's (byte offset, state)."""
        tokens, starts, offset = [], [], 0
        for token in ids:
            nxt = self.next_state(state, token)
            if nxt in (DEAD, FINISHED):
                break
            tokens.append(token)
            starts.append((offset, state))
            offset += len(self.vocabulary.token_bytes[token])
            state = nxt
        return tokens, starts


def _size(entry) -> int:
    """Bytes of a cached StateInfo (0 for forced-token tuples, which are small)."""
    if not isinstance(entry, StateInfo):
        return 0
    return entry.token_ids.nbytes + entry.next_states.nbytes + entry.mask.numel()


def _walk_all_tokens(dfa: LazyDFA, vocabulary: Vocabulary, state: int):
    """Walk every token from `state`; return the (ids, end states) of those that survive.

    A token whose first byte leads to a state that loops on each of its other bytes (the characters
    of a free string or undeclared key) survives and ends there without a walk: a cached set test.
    """
    layout = vocabulary.walk_layout
    row = dfa.row(state)
    first = row[layout.columns[0]] if layout.max_length else np.zeros(0, np.int32)
    alive = first != DEAD
    done_pos, done_states = [], []
    for target, stay in _staying(dfa, layout, row, first):
        alive &= ~stay
        done_pos.append(np.flatnonzero(stay))
        done_states.append(np.full(len(done_pos[-1]), target, dtype=np.int32))
    positions = np.flatnonzero(alive)  # rows of layout.order still alive, ascending
    states = first[positions]  # (n_alive,) int32 state after each live token's bytes so far
    for j, column in enumerate(layout.columns[1:], start=1):
        ended = int(positions.searchsorted(layout.counts[j]))  # shorter tokens have ended
        done_pos.append(positions[ended:])
        done_states.append(states[ended:])
        positions, states = positions[:ended], states[:ended]
        if not len(positions):
            break
        states = dfa.step(states, column[positions])
        alive = states != DEAD
        positions, states = positions[alive], states[alive]
    done_pos.append(positions)
    done_states.append(states)
    ids = layout.order[np.concatenate(done_pos)].astype(np.int64)
    return ids, np.concatenate(done_states).astype(np.int64)


def _staying(dfa: LazyDFA, layout, row: np.ndarray, first: np.ndarray):
    """(target, (n_tokens,) bool over layout.order) for each state the first byte leads to that loops on
    at least MIN_LOOP_BYTES bytes (free text: a string, an undeclared key): the tokens whose first
    byte leads there and whose other bytes all loop on it, which end there."""
    targets = np.unique(row[row != DEAD]).tolist()  # (<= 256,) the states one byte leads to
    looping = 0
    for target in targets:
        loops = dfa.row(target) == target
        if int(loops.sum()) < MIN_LOOP_BYTES:
            continue
        mask = int.from_bytes(np.packbits(loops, bitorder="little").tobytes(), "little")
        yield target, (first == target) & layout.tails_within(mask)
        looping += 1
        if looping == MAX_LOOP_TARGETS:
            return


def _forced_text(dfa: LazyDFA, state: int) -> str:
    """The longest byte string every continuation starts with (at most MAX_FORCED_BYTES), cut to whole UTF-8 characters."""
    out = bytearray()
    while not dfa.accepting[state] and len(out) < MAX_FORCED_BYTES:
        row = dfa.row(state)
        targets = np.flatnonzero(row != DEAD)
        if len(targets) != 1:
            break
        out.append(int(targets[0]))
        state = int(row[targets[0]])
    return _utf8_prefix(bytes(out))


def _utf8_prefix(data: bytes) -> str:
    for end in range(len(data), max(len(data) - 4, -1), -1):
        try:
            return bytes(data[:end]).decode("utf-8")
        except UnicodeDecodeError:
            continue
    return ""

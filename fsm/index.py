"""TokenIndex: which token ids a DFA state allows, where each leads, and which tokens are forced.

States are indexed lazily, on their first visit, by walking every token's bytes through the DFA at
once (numpy over all tokens, one column of bytes per step, dropping tokens as they die); the DFA
itself grows lazily under that walk. Results are cached, so a revisit costs a dictionary lookup.
The index is logically immutable: the caches only memoize pure functions of (DFA, vocabulary).
First visits run under the index's `Budget` (work only, never the clock) and `BUILD_LOCK`; a revisit
takes no lock. At most MAX_CACHED_STATES states and about MAX_CACHED_BYTES of them are kept (the oldest go first and are
rebuilt if visited again).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property, partial
from typing import Callable

import numpy as np
import torch

from fsm import rx
from fsm.bounded_strings import BoundedStringInfo, bounded_info, unbounded_twin
from fsm.budget import DEFAULT_BUDGET, Budget, metered
from fsm.closing import Closing
from fsm.head_cache import HeadCache, head_cache
from fsm.crossing import Crossed, add_walked, cross_on, groups_of, walk_group, walk_on
from fsm.lazy_dfa import DEAD, LazyDFA
from fsm.literals import UNNUMBERED, LiteralInfos, LiteralStateInfo, leading_byte, literal_places
from fsm.masks import MaskSlabs, fresh_mask
from fsm.liveness import TokenLiveness
from fsm.staying import staying
from fsm.vocabulary import Vocabulary

FINISHED = -2  # the state after EOS
MAX_CACHED_STATES = 4096  # per index
MAX_CACHED_BYTES = 256 << 20  # per index: a state allowing all of a 49k vocabulary holds ~0.8 MiB
EAGER_AFTER_HEADS = 16  # heads walked before any head is walked on its own at its first state
MAX_HEADS_SEEN = 100_000  # per index: heads remembered as met once, before the memory starts over
SPARSE_SORT = 64  # a state allowing under vocab_size / SPARSE_SORT tokens sorts them rather than scans the mask
TRIE_WALK = True  # first visits walk the token trie where they can (off: the column walk everywhere, for tests)
BOUNDED_STRINGS = True  # a bounded string's counts share its unbounded twin's walk (off: a walk per count, for tests)
MAX_FORCED_BYTES = 256  # a forced string is cut here (a{1000000} would otherwise walk a million states)


@dataclass(frozen=True, eq=False)
class StateInfo:
    """What one DFA state allows. token_ids is sorted; next_states[i] follows token_ids[i]."""

    token_ids: np.ndarray  # (n_allowed,) int32, EOS included where the state accepts
    next_states: np.ndarray  # (n_allowed,) int32, FINISHED after EOS
    mask: torch.Tensor  # (vocab_size,) bool
    max_token_length: int  # longest allowed token in bytes (EOS counts 0)

    def next_of(self, token_id: int) -> int:
        """The state after `token_id`, or DEAD when the token is not allowed."""
        i = int(np.searchsorted(self.token_ids, token_id))
        if i < len(self.token_ids) and self.token_ids[i] == token_id:
            return int(self.next_states[i])
        return DEAD

    def successors(self) -> tuple[np.ndarray, np.ndarray]:
        """(token_ids, next_states) of the allowed tokens."""
        return self.token_ids, self.next_states

    @property
    def nbytes(self) -> int:
        return self.token_ids.nbytes + self.next_states.nbytes + self.mask.numel()


@dataclass(frozen=True, eq=False)
class HeadWalk:
    """Every token walked through the DFA of a head term alone (see `Split`), shared by every state that
    starts with the head: a token that stays inside the head ends in the state `Split.whole` makes of its
    end; only the tokens that pass an end of the head inside their bytes (`crossing`) need the state's own
    walk. Arrays over tokens are indexed by their row in the vocabulary's walk_layout.order."""

    dfa: LazyDFA  # the index's DFA of heads (one for all heads: rows filled for one serve the next)
    ends: np.ndarray  # (n_ends,) int64 distinct states of `dfa` the tokens that stay inside end in
    inside: np.ndarray  # (k,) int32 rows (ascending) of the tokens that stay inside
    end_of: np.ndarray  # (k,) int32 index into `ends` of each
    crossing: np.ndarray  # (m,) int64 rows of walk_layout.order (ascending) of the crossing tokens
    cross_at: np.ndarray  # (m,) int32 bytes before each one first passes an end of the head (0: not known)
    cross_state: np.ndarray  # (m,) int32 the state of `dfa` there (-1: not known; walked from the start)
    allowed: np.ndarray  # (vocab_size,) bool by id: the tokens that stay inside
    max_token_length: int  # of those tokens
    _masks: dict = field(default_factory=dict, repr=False)  # (dead ends, extra ids) as bytes -> mask
    _mask_bytes: list = field(default_factory=lambda: [0], repr=False)  # bytes of the masks and group walks kept
    next: dict = field(default_factory=dict, repr=False)  # (state, next head) -> GroupWalk (`fsm.crossing`)

    @cached_property
    def groups(self) -> list:
        """((at, state), rows) of the crossing tokens whose pass is known, by where they pass (`fsm.crossing`)."""
        known = self.cross_state >= 0
        return groups_of(self.crossing[known], self.cross_at[known], self.cross_state[known])

    def mask_with(self, dead: np.ndarray, extra_ids: np.ndarray, order: np.ndarray) -> torch.Tensor:
        """(vocab_size,) bool of the tokens that stay inside but those ending in a `dead` end ((n_ends,)
        bool), and the sorted `extra_ids` (shared by the states with the same dead ends and extras)."""
        plain = not len(extra_ids) and not np.count_nonzero(dead)  # most states: the head's own mask
        key = None if plain else (np.packbits(dead).tobytes(), extra_ids.tobytes())
        found = self._masks.get(key)
        if found is None:
            allowed = self.allowed.copy() if len(extra_ids) or dead.any() else self.allowed
            if dead.any():
                allowed[order[self.inside[dead.take(self.end_of)]]] = False
            allowed[extra_ids] = True
            found = self._masks[key] = torch.from_numpy(allowed)
            self._mask_bytes[0] += found.numel()
        return found

    @cached_property
    def end_terms(self) -> list[rx.Rx]:
        """The terms of `ends`."""
        return [self.dfa.term(end) for end in self.ends.tolist()]

    @cached_property
    def crossing_from_start(self) -> np.ndarray:
        """(k,) int64 rows of the crossing tokens whose pass is not known (set apart without a walk, `fsm.staying`):
        a state walks them from its start."""
        return self.crossing[self.cross_state < 0]

    @property
    def nbytes(self) -> int:
        """Bytes of its arrays and of the masks it keeps for its states."""
        return self._array_bytes + self._mask_bytes[0]

    @cached_property
    def _array_bytes(self) -> int:
        arrays = (self.ends, self.inside, self.end_of, self.crossing, self.cross_at, self.cross_state, self.allowed)
        return sum(a.nbytes for a in arrays)

    def end_index(self, rows: np.ndarray) -> np.ndarray:
        """(n,) int32: the index into `ends` of the tokens at `rows`, -1 for those that do not stay inside."""
        at = np.searchsorted(self.inside, rows).clip(max=max(len(self.inside) - 1, 0))
        if not len(self.inside):
            return np.full(len(rows), -1, dtype=np.int32)
        return np.where(self.inside[at] == rows, self.end_of[at], -1).astype(np.int32)



@dataclass(frozen=True, eq=False)
class HeadStateInfo:
    """What a state allows, held as the HeadWalk of its head, which of the head's ends lead on (`mains`)
    and the crossing tokens that survive (`extra_ids`, sorted): a few bytes per state where a StateInfo
    would copy the head's tokens. An end's state of the whole DFA is numbered only when a token goes
    there (`next_of`; numbering is a pure function of the end, so a race numbers it twice, alike).
    Same interface as StateInfo."""

    walk: HeadWalk
    mains: np.ndarray  # (n_ends,) int32 state after walk.ends[i]: DEAD, or UNNUMBERED until asked
    number: Callable[[int], int]  # end index -> its state of the whole DFA
    row_of: np.ndarray  # (vocab_size,) int32 walk_layout.row_of
    extra_ids: np.ndarray  # (k,) int32 sorted: the crossing tokens that survive
    extra_slots: np.ndarray  # (k,) int32 where each goes: an index into `targets`
    targets: np.ndarray  # (n_slots,) int32 the state of each slot, UNNUMBERED until a token goes there
    number_target: Callable[[int], int]  # slot -> its state of the whole DFA
    mask: torch.Tensor  # (vocab_size,) bool, shared with the head's other states alike
    max_token_length: int  # at least the longest allowed token

    @cached_property
    def token_ids(self) -> np.ndarray:
        return np.flatnonzero(self.mask.numpy()).astype(np.int32)

    @cached_property
    def next_states(self) -> np.ndarray:
        return np.asarray([self.next_of(token) for token in self.token_ids.tolist()], dtype=np.int32)

    def next_of(self, token_id: int) -> int:
        """The state after `token_id`, or DEAD when the token is not allowed (scalar lookups: no arrays built)."""
        extra = self.extra_ids
        if len(extra):
            i = int(extra.searchsorted(token_id))
            if i < len(extra) and extra[i] == token_id:
                return self._target(int(self.extra_slots[i]))
        walk = self.walk
        if not walk.allowed[token_id]:
            return DEAD
        end = int(walk.end_of[walk.inside.searchsorted(self.row_of[token_id])])  # allowed: its row is inside
        if self.mains[end] == UNNUMBERED:
            self.mains[end] = self.number(end)
        return int(self.mains[end])

    def _target(self, slot: int) -> int:
        if self.targets[slot] == UNNUMBERED:
            self.targets[slot] = self.number_target(slot)
        return int(self.targets[slot])

    def successors(self) -> tuple[np.ndarray, np.ndarray]:
        """(token_ids, next_states) of the allowed tokens, without a call per token: the ends of the head that
        tokens reach, and the places crossing tokens go, are numbered once each."""
        ids = self.token_ids
        at = np.searchsorted(self.extra_ids, ids).clip(max=max(len(self.extra_ids) - 1, 0))  # (n,)
        extra = self.extra_ids[at] == ids if len(self.extra_ids) else np.zeros(len(ids), dtype=bool)
        ends = self.walk.end_index(self.row_of[ids])  # (n,) -1 for the crossing (extra) ids
        for end in np.unique(ends[~extra]).tolist():
            if self.mains[end] == UNNUMBERED:
                self.mains[end] = self.number(end)
        for slot in np.unique(self.extra_slots).tolist():
            self._target(slot)
        crossing = self.targets.take(self.extra_slots)[at] if len(self.extra_ids) else 0
        nexts = np.where(extra, crossing, self.mains[ends.clip(min=0)])
        return ids, nexts.astype(np.int32)

    @property
    def nbytes(self) -> int:
        own = self.mask.numel() if DEAD in self.mains else 0  # a mask of its own (mostly); `in`: no Python call
        return self.mains.nbytes + self.extra_ids.nbytes + self.extra_slots.nbytes + self.targets.nbytes + own


@dataclass(frozen=True, eq=False)
class TokenIndex:
    """Token-level view of a byte DFA for one vocabulary (see the module docstring)."""

    dfa: LazyDFA
    vocabulary: Vocabulary
    budget: Budget = DEFAULT_BUDGET
    _states: dict = field(default_factory=dict, repr=False)
    _forced: dict = field(default_factory=dict, repr=False)
    _info_bytes: list = field(default_factory=lambda: [0], repr=False)  # bytes of the infos in _states
    _heads_seen: set = field(default_factory=set, repr=False)  # ids of the heads met once (walked plainly)

    def __post_init__(self):
        crawl = partial(_walk_all_tokens, self.dfa, self.vocabulary)  # not a closure over self: no cycle
        object.__setattr__(self, "_live", TokenLiveness(self.dfa, self.vocabulary.single_bytes, crawl))
        object.__setattr__(self, "_mask_slabs", MaskSlabs(self.vocab_size))  # the states' masks (`fsm.masks`)
        object.__setattr__(self, "_literal_infos", LiteralInfos(self._mask_slabs))  # masks shared (`fsm.literals`)

    @cached_property
    def closing(self) -> Closing:
        """Shortest completions and budget masks of this index (`fsm.closing`), built on first use."""
        return Closing(self)

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
        return self.info(state).next_of(token_id)

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
        return self.dfa.nbytes + self._info_bytes[0]  # head walks are the vocabulary's (`fsm.head_cache`)

    @property
    def heads(self) -> HeadCache:
        """The head walks shared by the indexes over this vocabulary (`fsm.head_cache`)."""
        return head_cache(self.vocabulary, self.budget.max_states)

    def _first_visit(self, state: int, cache: dict, build):
        with metered(self.budget, f"the first visit of state {state} of {self.dfa.name()}", timed=False):
            found = cache.get(state)  # another thread may have built it while this one waited
            if found is None:
                found = build(state)
                size = _size(found)  # 0 for forced tokens: only infos count towards the bytes
                while cache and (
                    len(cache) >= MAX_CACHED_STATES or (size and self._info_bytes[0] + size > MAX_CACHED_BYTES)
                ):
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
            bounded = self._bounded_string(state)
            if bounded is not None:
                return bounded
            walked = self._walk_from(state)
            if isinstance(walked, (HeadStateInfo, LiteralStateInfo)):
                return walked
            ids, nexts = walked
            keep = None if self._live.all_live_from(state) else self._live.keep(nexts)
            if keep is not None:
                ids, nexts = ids[keep], nexts[keep]
            if self.dfa.accepting[state]:
                eos = np.asarray(self.vocabulary.eos_token_ids, dtype=np.int64)
                ids = np.concatenate([ids, eos])
                nexts = np.concatenate([nexts, np.full(len(eos), FINISHED, dtype=np.int64)])
        mask = self._mask_slabs.take()  # numpy: torch's threaded fill costs ms on a busy CPU
        mask[ids] = True
        if len(ids) * SPARSE_SORT < self.vocab_size:  # few tokens: a sort of them beats two passes over the vocabulary
            order = np.argsort(ids, kind="stable")
            ids, nexts = ids[order], nexts[order]
            last = np.append(ids[1:] != ids[:-1], True)[: len(ids)]  # an id twice (an EOS listed twice): its last
            ids, nexts = ids[last].astype(np.int32), nexts[last].astype(np.int32)
        else:
            by_id = np.empty(self.vocab_size, dtype=np.int32)  # (vocab_size,) scratch: sorts without argsort
            by_id[ids] = nexts
            ids = np.flatnonzero(mask).astype(np.int32)  # int32: half the memory of a cached state
            nexts = by_id[ids]
        lengths = self.vocabulary.walk_layout.lengths
        return StateInfo(ids, nexts, torch.from_numpy(mask), int(lengths[ids].max(initial=0)) if len(ids) else 0)

    def _bounded_string(self, state: int) -> BoundedStringInfo | None:
        """Inside a string with `minLength` or `maxLength`: its unbounded twin's mask less the tokens of too many
        characters, or that close it after too few (`fsm.bounded_strings`), where every token is token-live; else
        None."""
        term = self.dfa.term(state)
        twin = unbounded_twin(term) if BOUNDED_STRINGS and self._live.all_live_from(state) else None
        twin_state = DEAD if twin is None else self.dfa.state_of(twin[0])
        if twin_state == DEAD:
            return None
        walk = partial(_walk_all_tokens, self.dfa, self.vocabulary, state)
        return bounded_info(self.info(twin_state), *twin[1:], self.dfa, state, self.vocabulary, walk)

    def _walk_from(self, state: int) -> tuple[np.ndarray, np.ndarray] | HeadStateInfo:
        """(ids, end states) of the tokens that survive from `state`: from the walk of its head when it
        has one (see HeadWalk), else from a walk of the whole vocabulary. A HeadStateInfo where every
        token is token-live (`TokenLiveness.all_live_from`), so that no token needs dropping."""
        term = self.dfa.term(state)
        if TRIE_WALK and self.vocabulary.walk_layout.max_length and _starts_literal(term):
            return self._walk_literal(state)
        split = Split.of(term)
        heads = self.heads
        if split is None or not self._met_before(split.head, heads):
            return _walk_all_tokens(self.dfa, self.vocabulary, state)
        walk = heads.walk(split.head, lambda dfa, head: _walk_head(dfa, head, self.vocabulary))
        before = walk.nbytes
        ends = walk.end_terms
        live = split.leads_on(ends)
        layout = self.vocabulary.walk_layout
        crossed = Crossed()
        if len(walk.crossing_from_start):
            add_walked(crossed, self.dfa, layout, walk.crossing_from_start, 0, state)
        cross_on(walk, split, walk.groups, self.dfa, layout, crossed, Split.of, partial(_keep, walk), heads.dfa_for)
        more_ids, slots, targets = _crossed_arrays(crossed)
        number = partial(_number_end, self.dfa, split, ends)
        number_target = partial(_number_target, self.dfa, crossed.targets)
        if self._live.all_live_from(state):  # the head is never nullable: the state does not accept
            mains = np.where(live, UNNUMBERED, DEAD).astype(np.int32)
            info = _head_state_info(walk, mains, number, more_ids, slots, targets, number_target, layout)
            heads.grow(split.head, walk.nbytes - before)  # a new mask or group walk kept by the walk counts
            return info
        # Not every token is token-live (`fsm.liveness`): the places tokens go are numbered now, and those from which
        # no tokens finish are DEAD, a few distinct states rather than a state per token.
        mains = np.asarray([number(i) if alive else DEAD for i, alive in enumerate(live.tolist())], dtype=np.int32)
        targets = np.asarray([number_target(slot) for slot in range(len(targets))], dtype=np.int32)
        for places in (mains, targets):
            numbered = places != DEAD
            keep = self._live.keep(places[numbered])
            places[np.flatnonzero(numbered)[~keep]] = DEAD
        kept = targets.take(slots) != DEAD if len(slots) else np.zeros(0, dtype=bool)
        info = _head_state_info(walk, mains, number, more_ids[kept], slots[kept], targets, number_target, layout,
                                exact=True)
        heads.grow(split.head, walk.nbytes - before)
        return info

    def _walk_literal(self, state: int) -> LiteralStateInfo | tuple[np.ndarray, np.ndarray]:
        """What a state that starts with a literal allows: the tokens spelling a prefix of it (found in the trie,
        `TokenTrie.descend`, the literal read off the terms: `fsm.literals`), then those that spell it whole and go on,
        walked below its last byte through what follows it as crossing tokens are (`_below_literal`). A
        LiteralStateInfo where every token is token-live, else (ids, end states), every place numbered."""
        layout, places = self.vocabulary.walk_layout, []
        parts, end = layout.trie.descend(literal_places(self.dfa, self.dfa.term(state), places))
        ids = [layout.order[rows] for rows, _ in parts]
        slots = [at for _, at in parts]
        if end is not None:
            depth, node, there = end
            found = self._below_literal(depth, node, there, places)
            ids.append(found[0])
            slots.append(found[1])
        ids = np.concatenate(ids).astype(np.int64) if ids else np.zeros(0, np.int64)
        slots = np.concatenate(slots).astype(np.int32) if slots else np.zeros(0, np.int32)
        number = partial(_number_target, self.dfa, places)
        if self._live.all_live_from(state):
            return self._literal_infos.info(ids, slots, len(places), number, layout.lengths)
        states = np.asarray([number(place) for place in range(len(places))], dtype=np.int64)
        return ids, states.take(slots) if len(slots) else np.zeros(0, np.int64)

    def _below_literal(self, depth: int, node: int, there: int, places: list) -> tuple[np.ndarray, np.ndarray]:
        """(ids, places) of the tokens at and below `node` of the trie (they spell a literal whole) from places[there],
        the term after the literal: the longer ones walked through its head as a group of crossing tokens
        (`fsm.crossing.walk_on`, kept per (node, head): what follows a key is shared by every state that writes it),
        their places appended to `places`; where it has no head, walked in the whole DFA from its state."""
        layout = self.vocabulary.walk_layout
        split = Split.of(places[there])
        if split is None:
            start = self.dfa.state_of(places[there])
            rows, ends = _joined_rows(layout.trie._walk_below(self.dfa, depth, np.asarray([node]),
                                                              np.asarray([start], dtype=np.int32)))
            distinct, slots = np.unique(ends, return_inverse=True)
            places.extend(distinct.tolist())
            return layout.order[rows], slots.astype(np.int32) + len(places) - len(distinct)
        own, longer = layout.trie.below(depth, node)
        ids, slots = [layout.order[own]], [np.full(len(own), there, dtype=np.int32)]
        if len(longer):
            key = (depth, node, split.head)
            heads = self.heads
            group = heads.below.get(key)
            if group is None:
                head_dfa = heads.dfa_for(split.head)
                group = walk_group(head_dfa, layout, longer, depth + 1, head_dfa.state_of(split.head))
                heads.keep_below(key, group)
            crossed = Crossed()
            walk_on(group, split, self.dfa, layout, crossed, Split.of, heads.count_below, heads.dfa_for)
            more, more_slots, _ = _crossed_arrays(crossed)
            ids.append(more)
            slots.append(more_slots + len(places))
            places.extend(crossed.targets)
        return np.concatenate(ids).astype(np.int64), np.concatenate(slots)

    def _met_before(self, head: rx.Rx, heads: HeadCache) -> bool:
        """Whether `head` started a state visited before, or was walked or reached for this vocabulary already, or
        heads are shared often (EAGER_AFTER_HEADS walked): only then is it walked on its own (a head walk costs more
        than a plain walk where the DFA of heads lacks its rows, and pays off only when states share the head). Term
        ids are never reused."""
        if len(heads.heads) >= EAGER_AFTER_HEADS or head.id in self._heads_seen or heads.knows(head):
            return True
        if len(self._heads_seen) >= MAX_HEADS_SEEN:
            self._heads_seen.clear()
        self._heads_seen.add(head.id)
        return False

    def _dfa_for(self, head: rx.Rx) -> LazyDFA:
        return self.heads.dfa_for(head)

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


@dataclass(frozen=True)
class Split:
    """A state's term as its head, what follows the head inside the innermost items of any-order lists
    (`tail`), and those lists (`frames`, see `rx.split_pick`). The head is the innermost items (shared by
    every list of one object, whatever members are left) or the term, cut after its first part that does
    not match the empty string (`rx.split_head`: shared by every tail)."""

    head: rx.Rx
    tail: rx.Rx
    frames: tuple

    @classmethod
    def of(cls, term: rx.Rx) -> "Split | None":
        items, frames = rx.split_pick(term) or (term, ())
        split = rx.split_head(items)
        if split is not None:
            return cls(*_closed(*split), frames)
        return cls(items, rx.EPSILON, frames) if frames else None

    def whole(self, end: rx.Rx) -> rx.Rx:
        """The state's term after a token that leaves the head at its derivative `end` without passing its end."""
        return rx.unsplit(rx.seq(end, self.tail), self.frames)

    def leads_on(self, ends: list[rx.Rx]) -> np.ndarray:
        """(n_ends,) bool: whether `whole(end)` matches something. The lists around the innermost one are
        unchanged (and non-empty, as the state is), so it does when the innermost one's `pick` does. Plain
        terms match something unless they are NOTHING: without a list the answer is yes (a live end and a
        live tail), and behind a tail it is one for every end (the tail's hole decides)."""
        plain = self.head.plain and self.tail.plain and all(owner.plain for owner, _ in self.frames)
        if plain and (not self.frames or self.tail is not rx.EPSILON):  # the tail's holes are seq(end, tail)'s
            live = self.tail is not rx.NOTHING and not (self.frames and rx.pick_is_empty(self.tail, self.frames[-1][0]))
            found = np.full(len(ends), live, dtype=bool)
            if live and rx.NOTHING in ends:  # a scan in C (terms compare by identity), not a Python loop
                found[[i for i, end in enumerate(ends) if end is rx.NOTHING]] = False
            return found
        if not self.frames:  # seq(end, tail) is empty where a part of either is: the tail is asked once
            if _forbidden(self.tail):
                return np.zeros(len(ends), dtype=bool)
            return np.fromiter((not _forbidden(end) for end in ends), dtype=bool, count=len(ends))
        return np.fromiter((self._leads_on(end) for end in ends), dtype=bool, count=len(ends))

    def _leads_on(self, end: rx.Rx) -> bool:
        items = rx.seq(end, self.tail)
        if self.frames:  # undecided: forbidden, as the DFA forbids it (fsm.lazy_dfa)
            return not rx.pick_is_empty(items, self.frames[-1][0], rx.WALK_LIMIT, undecided=True)
        return not rx.is_empty(items, rx.WALK_LIMIT, undecided=True)


def _forbidden(term: rx.Rx) -> bool:
    """Whether a walk treats `term` as DEAD (empty, or undecided within rx.WALK_LIMIT: `fsm.lazy_dfa`). A sequence's
    answer is its parts' (empty where one is, else undecided where one is): seq(end, tail) asks end's and tail's."""
    return rx.is_empty(term, rx.WALK_LIMIT, undecided=True)


def _closed(head: rx.Rx, tail: rx.Rx) -> tuple[rx.Rx, rx.Rx]:
    """(head, tail), the head taken on through the tail's first part where it may go on after it could end (a
    repeat without a fixed count, an intersection: a string with `minLength`, a `pattern`) and that part is one byte
    set (the string's closing quote). Any head that does not match the empty string splits a state exactly; this one
    ends where its walk's crossing tokens are those that pass that byte, not every token longer than the minimum."""
    last = head.args[1] if head.kind == "seq" else head
    while last.kind == "seq":
        last = last.args[1]
    opens = (last.kind == "repeat" and last.args[1] != last.args[2]) or last.kind == "and"
    if opens and tail.kind == "seq" and tail.args[0].kind == "bytes":
        return rx.seq(head, tail.args[0]), tail.args[1]
    return head, tail


def _number_end(dfa: LazyDFA, split: Split, ends: list, i: int) -> int:
    return dfa.state_of(split.whole(ends[i]))


def _number_target(dfa: LazyDFA, targets: list, slot: int) -> int:
    """The state of a token's place: numbered already, a next head's (split, end), or a term."""
    target = targets[slot]
    if isinstance(target, int):
        return target
    return dfa.state_of(target[0].whole(target[1]) if isinstance(target, tuple) else target)


def _keep(walk: HeadWalk, nbytes: int) -> bool:
    """Count a group walk kept below `walk` in its bytes (the head's cache bound sees it)."""
    walk._mask_bytes[0] += nbytes
    return True


def _crossed_arrays(crossed: Crossed) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids, slots, targets): the surviving crossing tokens of a state sorted, where each goes, the slots' states
    (numbered ones known, the others UNNUMBERED)."""
    if not crossed.ids:
        return np.zeros(0, np.int64), np.zeros(0, np.int32), np.zeros(0, np.int32)
    ids, slots = np.concatenate(crossed.ids).astype(np.int64), np.concatenate(crossed.slots).astype(np.int32)
    targets = np.asarray([t if isinstance(t, int) else UNNUMBERED for t in crossed.targets], dtype=np.int32)
    return ids, slots, targets


def _size(entry) -> int:
    """Bytes of a cached StateInfo (0 for forced-token tuples, which are small)."""
    return entry.nbytes if isinstance(entry, (StateInfo, HeadStateInfo, BoundedStringInfo, LiteralStateInfo)) else 0


def _walk_all_tokens(dfa: LazyDFA, vocabulary: Vocabulary, state: int):
    """Walk every token from `state`; return the (ids, end states) of those that survive (in no particular order).
    Where no token ends without a walk (`fsm.staying`), by one walk of the token trie (`fsm.token_trie`), else
    (or with TRIE_WALK off: the reference of the tests) by the column walk."""
    layout = vocabulary.walk_layout
    if TRIE_WALK and layout.max_length and _starts_literal(dfa.term(state)):
        rows, end_states = layout.trie.walk_along(dfa, _literal_steps(dfa, state))
        return layout.order[rows].astype(np.int64), end_states.astype(np.int64)
    stays = list(staying(dfa, layout, state)) if layout.max_length else []
    if TRIE_WALK and not stays:
        rows, end_states = layout.trie.walk(dfa, state)
        return layout.order[rows].astype(np.int64), end_states.astype(np.int64)
    end_states = _walk_rows(dfa, layout, state, stays=stays)[0]
    rows = np.flatnonzero(end_states != DEAD)
    return layout.order[rows].astype(np.int64), end_states[rows].astype(np.int64)


def _joined_rows(parts: list) -> tuple[np.ndarray, np.ndarray]:
    """(rows, end states) of [(rows, ends)]."""
    if not parts:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate([rows for rows, _ in parts]), np.concatenate([ends for _, ends in parts]).astype(np.int64)


def _literal_steps(dfa: LazyDFA, state: int):
    """(byte, state after it) along the literal `state`'s term starts with (a chain of one-byte parts: a key,
    punctuation), read off the terms as far as the caller reads, with one DFA cell per byte."""
    while (byte := leading_byte(dfa.term(state))) is not None:
        state = dfa.next(state, byte)
        if state == DEAD:
            return
        yield byte, state


def _starts_literal(term: rx.Rx) -> bool:
    """Whether `term` starts with one possible byte (`_literal_path` walks it)."""
    first = term.args[0] if term.kind == "seq" else term
    return first.kind == "bytes" and not first.args[0] & (first.args[0] - 1)


def _walk_rows(dfa: LazyDFA, layout, state: int, track_crossing: bool = False, stays: list | None = None):
    """(ends, crossing, cross_at, cross_state): ends (n_tokens,) int32 over the rows of layout.order, the state
    after each token's bytes from `state`, DEAD where it dies. A token whose first byte leads to a state that
    loops on its other bytes (free text) ends there without a walk (`fsm.staying`). With `track_crossing`,
    crossing holds the rows (ascending) of the tokens that pass an accepting state strictly inside their bytes,
    whose ends read DEAD, and for each the bytes before the first such state and the state (0 and -1 where not
    known: tokens set apart without a walk); else all three are empty. `stays`: what `staying` yields from
    `state`, when already known."""
    ends = np.full(len(layout.order), DEAD, dtype=np.int32)
    first_at = []  # (rows, j, states): where column-walked tokens first pass an accepting state
    if not layout.max_length:
        return ends, *_crossings(None, first_at)
    row = dfa.row(state)
    first = row.take(layout.columns[0])  # take: 3x faster than indexing with uint8
    walking = first != DEAD
    crossed = np.zeros(len(layout.order), dtype=bool) if track_crossing else None  # (n_tokens,)
    for stay in staying(dfa, layout, state) if stays is None else stays:
        walking &= ~stay.rows
        np.copyto(ends, stay.ends, where=stay.rows)
        if track_crossing and stay.crossing is not None:
            crossed |= stay.crossing
    positions = np.flatnonzero(walking)  # rows still walking, ascending (longest tokens first)
    states = first[positions]
    for j, column in enumerate(layout.columns[1:], start=1):
        ended = int(positions.searchsorted(layout.counts[j]))  # shorter tokens have ended
        if ended < len(positions):  # the loop skips what does nothing (count_nonzero: a C call, `any` is not)
            ends[positions[ended:]] = states[ended:]
            positions, states = positions[:ended], states[:ended]
        if not ended:
            break
        if track_crossing:  # a token passing an accepting state is set apart there: it walks no further
            accepting = dfa.accepting.take(states)
            if np.count_nonzero(accepting):
                first_at.append((positions[accepting], j, states[accepting]))
                crossed[positions[accepting]] = True
                positions, states = positions[~accepting], states[~accepting]
        states = dfa.step(states, column[positions])
        alive = states != DEAD
        if np.count_nonzero(alive) < len(alive):
            positions, states = positions[alive], states[alive]
    ends[positions] = states
    crossing = _crossings(crossed, first_at)
    ends[crossing[0]] = DEAD
    return ends, *crossing


def _crossings(crossed: np.ndarray | None, first_at: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows, cross_at, cross_state) of the crossing tokens (see `_walk_rows`)."""
    if crossed is None:
        return np.zeros(0, np.int64), np.zeros(0, np.int32), np.zeros(0, np.int32)
    at, where = np.zeros(len(crossed), dtype=np.int32), np.full(len(crossed), -1, dtype=np.int32)
    for rows, j, states in first_at:
        at[rows], where[rows] = j, states
    rows = np.flatnonzero(crossed)
    return rows, at[rows], where[rows]


def _head_state_info(walk: HeadWalk, mains: np.ndarray, number, extra_ids: np.ndarray, extra_slots: np.ndarray,
                     targets: np.ndarray, number_target, layout, exact: bool = False) -> HeadStateInfo:
    """The HeadStateInfo of a state; its max_token_length at least the longest allowed token, or, `exact`, that."""
    if len(extra_ids) > 1:  # most states keep no crossing token: nothing to sort
        order = np.argsort(extra_ids)
        extra_ids, extra_slots = extra_ids[order], extra_slots[order]
    extra_ids = extra_ids.astype(np.int32)
    inside = walk.max_token_length
    if exact:  # the longest token inside that ends where it leads on (rows run longest first)
        alive = mains.take(walk.end_of) != DEAD if len(walk.end_of) else np.zeros(0, dtype=bool)
        inside = int(layout.lengths[layout.order[walk.inside[alive.argmax()]]]) if alive.any() else 0
    longest = max(inside, int(layout.lengths[extra_ids].max(initial=0)) if len(extra_ids) else 0)
    mask = walk.mask_with(mains == DEAD, extra_ids, layout.order)
    return HeadStateInfo(walk, mains, number, layout.row_of, extra_ids, extra_slots, targets, number_target, mask,
                         longest)


def _walk_head(dfa: LazyDFA, head: rx.Rx, vocabulary: Vocabulary) -> HeadWalk:
    """The HeadWalk of `head`: every token through the states of `head` in `dfa`, the crossing ones set apart. Where no
    token ends without a walk (`fsm.staying`), by a walk of the token trie that stops at the head's ends (with
    TRIE_WALK off, or with tokens that stay: the column walk)."""
    layout = vocabulary.walk_layout
    start = dfa.state_of(head)
    stays = list(staying(dfa, layout, start)) if layout.max_length else []
    if TRIE_WALK and not stays:
        rows, ends, crossing, cross_at, cross_state = layout.trie.walk_head(dfa, start)
        order = np.argsort(rows, kind="stable")
        rows, ends = rows[order], ends[order]
    else:
        end_states, crossing, cross_at, cross_state = _walk_rows(dfa, layout, start, track_crossing=True, stays=stays)
        rows = np.flatnonzero(end_states != DEAD)  # ascending already
        ends = end_states[rows]
    rows = rows.astype(np.int32)
    distinct, end_of = _numbered(ends)
    ids = layout.order[rows]
    allowed = fresh_mask(vocabulary.vocab_size)  # most heads allow few tokens: pages touched only where they are
    allowed[ids] = True
    longest = int(layout.lengths[ids[0]]) if len(ids) else 0  # rows ascending: the longest token first
    return HeadWalk(dfa, distinct.astype(np.int64), rows, end_of, crossing, cross_at, cross_state, allowed, longest)


def _numbered(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct, index): the distinct `values` (n,) ascending and each value's index among them; a sort of few
    values, a count of many (linear in n and the largest value)."""
    if len(values) < 4096:
        distinct, index = np.unique(values, return_inverse=True)
        return distinct, index.astype(np.int32)
    counts = np.bincount(values)
    distinct = np.flatnonzero(counts)
    number = np.zeros(len(counts), dtype=np.int32)
    number[distinct] = np.arange(len(distinct), dtype=np.int32)
    return distinct, number.take(values)


def _forced_text(dfa: LazyDFA, state: int) -> str:
    """The longest byte string every continuation starts with (at most MAX_FORCED_BYTES), cut to whole UTF-8
    characters."""
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

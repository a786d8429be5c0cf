"""Crossing tokens: the tokens that pass an end of a state's head, walked on through the heads that follow it.

A state seq(head, tail) shares the walk of its head with every state of that head (`fsm.index.HeadWalk`). A token
that passes an end of the head strictly inside its bytes goes on in what follows there, whole(end) = seq(end, tail),
which is itself a head and a tail (`Split.of`). Such tokens are grouped by where they pass (the bytes read, the
head's state there), and the groups that pass at one state (a string's closing quote, however many bytes before it)
are walked on together through the next head alone, each token from its own byte, in the DFA of heads, once per
(state, next head), and kept on the walk they came from (`GroupWalk.next`): what the top of the stack allows next,
shared by every state whose tail starts with that head, whatever lies below it. A state then only asks which ends of
each next head lead on (`Split.leads_on`), level by level, until no token passes; the DFA of the whole term grows
only where a token is taken. A continuation that has no head (a union) is walked in the whole term's DFA, as all
crossing tokens were before.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from fsm import rx
from fsm.lazy_dfa import DEAD, LazyDFA
from fsm.staying import staying

MAX_NEXT = 256  # group walks kept on one walk (past it, they are walked for each state that needs them)
SMALL_UNIQUE = 64  # ends of a group walk numbered in Python up to this many tokens
SETTLE_ROWS = 2048  # tokens walked from their first byte past which free text is set apart first (`fsm.staying`)


@dataclass(frozen=True, eq=False)
class GroupWalk:
    """One group of tokens (rows of walk_layout.order, each read from its byte `at` on) walked through the DFA of
    heads from a head's state: those that stay inside the head with their ends, those that pass an end of it again."""

    dfa: LazyDFA  # the DFA of heads
    inside: np.ndarray  # (k,) int64 rows of the tokens that end inside the head, alive
    ends: np.ndarray  # (n_ends,) int64 the distinct states of `dfa` they end in
    end_of: np.ndarray  # (k,) int32 index into `ends` of each
    crossing: np.ndarray  # (m,) int64 rows (ascending) of the tokens that pass an end of the head inside their bytes
    cross_at: np.ndarray  # (m,) int32 the bytes of each read there
    cross_state: np.ndarray  # (m,) int32 the state of `dfa` there
    next: dict = field(default_factory=dict, repr=False)  # (state, head) -> GroupWalk of its crossing groups there
    kept: list = field(default_factory=lambda: [0], repr=False)  # bytes of the group walks kept below it

    @cached_property
    def groups(self) -> list[tuple[tuple[int, int], np.ndarray]]:
        """((at, state), rows ascending) of the crossing tokens, by where they pass."""
        return groups_of(self.crossing, self.cross_at, self.cross_state)

    @property
    def nbytes(self) -> int:
        arrays = (self.inside, self.ends, self.end_of, self.crossing, self.cross_at, self.cross_state)
        return sum(a.nbytes for a in arrays)


def groups_of(rows: np.ndarray, at: np.ndarray, where: np.ndarray) -> list[tuple[tuple[int, int], np.ndarray]]:
    """((at, where), rows) for each distinct pair, rows ascending where `rows` is."""
    if not len(rows):
        return []
    keys = (at.astype(np.int64) << 32) | where.astype(np.int64)
    values, inverse = np.unique(keys, return_inverse=True)
    if len(values) == 1:
        return [((int(values[0]) >> 32, int(values[0]) & 0xFFFFFFFF), rows)]
    order = np.argsort(inverse, kind="stable")
    bounds = np.searchsorted(inverse[order], np.arange(len(values) + 1))
    return [((key >> 32, key & 0xFFFFFFFF), rows[order[bounds[i]: bounds[i + 1]]])
            for i, key in enumerate(values.tolist())]


def walk_group(dfa: LazyDFA, layout, rows: np.ndarray, at: int, start: int) -> GroupWalk:
    """The tokens at `rows` (ascending, each longer than `at` bytes) read from byte `at` on through `dfa` from
    `start` (a head's state, not accepting): `walk_groups` of one group."""
    return walk_groups(dfa, layout, [(at, rows)], start)


def walk_groups(dfa: LazyDFA, layout, parts: list[tuple[int, np.ndarray]], start: int) -> GroupWalk:
    """The tokens of `parts` ((at, rows) by ascending `at`, rows ascending, each token longer than its `at` bytes),
    each read from its byte `at` on through `dfa` from `start` (a head's state, not accepting), in one walk: a token
    that reaches an accepting state with bytes left passes an end of the head there (it is not walked further); the
    others end inside or die. A token's walk is its own, so one walk of several groups gives each token what a walk
    of its group alone gives it. Most groups hold a few tokens: the loop skips what does nothing (count_nonzero is a
    C call where `any` goes through Python)."""
    (first, positions), joining = parts[0], parts[1:]
    states = np.full(len(positions), start, dtype=np.int32)
    done_rows, done_states, crossed = [], [], []
    for j in range(first, len(layout.columns)):
        if joining and joining[0][0] == j:  # a group that starts at byte j joins the walk
            positions, states = _joined(positions, states, joining[0][1], start)
            joining = joining[1:]
        ended = int(positions.searchsorted(layout.counts[j]))  # tokens of j bytes have ended
        if ended < len(positions):
            done_rows.append(positions[ended:])
            done_states.append(states[ended:])
            positions, states = positions[:ended], states[:ended]
        if not ended:
            if joining:
                continue
            break
        passing = dfa.accepting.take(states)
        if np.count_nonzero(passing):
            crossed.append((positions[passing], np.full(int(passing.sum()), j, np.int32), states[passing]))
            positions, states = positions[~passing], states[~passing]
        states = dfa.step(states, layout.columns[j][positions])
        alive = states != DEAD
        if np.count_nonzero(alive) < len(alive):
            positions, states = positions[alive], states[alive]
    done_rows.append(positions)
    done_states.append(states)
    inside, ends = np.concatenate(done_rows), np.concatenate(done_states)
    distinct, end_of = _distinct(ends)
    if len(crossed) > 1:
        crossing, cross_at, cross_state = (np.concatenate(parts) for parts in zip(*crossed))
        order = np.argsort(crossing)
        crossing, cross_at, cross_state = crossing[order], cross_at[order], cross_state[order]
    elif crossed:  # one part: ascending already
        crossing, cross_at, cross_state = crossed[0]
    else:
        crossing, cross_at, cross_state = np.zeros(0, np.int64), np.zeros(0, np.int32), np.zeros(0, np.int32)
    return GroupWalk(dfa, inside.astype(np.int64, copy=False), distinct, end_of, crossing.astype(np.int64, copy=False),
                     cross_at, cross_state)


def _joined(positions: np.ndarray, states: np.ndarray, rows: np.ndarray, start: int) -> tuple[np.ndarray, np.ndarray]:
    """(positions, states) with `rows` at `start` merged in, positions ascending."""
    merged = np.concatenate([positions, rows])
    order = merged.argsort(kind="stable")
    return merged[order], np.concatenate([states, np.full(len(rows), start, dtype=np.int32)])[order]


def _distinct(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct, index): the distinct `values` ascending (int64) and each value's index among them (int32), as
    np.unique(return_inverse=True) gives them; a set for a few values (np.unique costs ~10 us on any)."""
    if len(values) > SMALL_UNIQUE:
        distinct, index = np.unique(values, return_inverse=True)
        return distinct.astype(np.int64), index.astype(np.int32)
    listed = values.tolist()
    distinct = sorted(set(listed))
    number = {value: i for i, value in enumerate(distinct)}
    return np.asarray(distinct, dtype=np.int64), np.fromiter(map(number.__getitem__, listed), np.int32, len(listed))


@dataclass
class Crossed:
    """The crossing tokens of one state that survive: ids with where each goes, `slot` into `targets`, one
    (split, end) per distinct place (its state numbered when a token goes there) or a state already numbered."""

    ids: list = field(default_factory=list)  # arrays of token ids
    slots: list = field(default_factory=list)  # arrays of slot indices, one per id
    targets: list = field(default_factory=list)  # slot -> (split, end term) or a numbered state (int)


def cross_on(walk, split, groups, dfa: LazyDFA, layout, out: Crossed, split_of, keep, dfa_for) -> None:
    """Add to `out` the tokens of `groups` (((at, state of walk.dfa), rows) of tokens that pass an end of the head
    `split` walked in `walk`) that survive in what follows, walking the groups that pass at one state (what follows
    is the same for them, whatever bytes they read before) through the next head at once (a GroupWalk kept on
    `walk`, walked in `dfa_for(head)`: the DFA of heads) or, where what follows has no head, through `dfa` itself.
    `split_of` is Split.of; `keep(bytes)` counts the bytes of a new group walk kept (it returns False where none may
    be kept)."""
    for where, parts in _by_state(groups):
        follow = split.whole(walk.dfa.term(where))
        if follow is rx.NOTHING or (not follow.plain and rx.is_empty(follow, rx.WALK_LIMIT, undecided=True)):
            continue  # DEAD: what the whole term's DFA makes of it
        nxt = split_of(follow)
        if nxt is None:
            there = dfa.state_of(follow)
            for at, rows in parts:
                add_walked(out, dfa, layout, rows, at, there)
            continue
        key = (where, nxt.head)
        group = walk.next.get(key)
        if group is None:
            head_dfa = dfa_for(nxt.head)
            group = walk_groups(head_dfa, layout, parts, head_dfa.state_of(nxt.head))
            if len(walk.next) < MAX_NEXT and keep(group.nbytes):
                walk.next[key] = group
        walk_on(group, nxt, dfa, layout, out, split_of, keep, dfa_for)


def _by_state(groups: list) -> list[tuple[int, list[tuple[int, np.ndarray]]]]:
    """(state, [(at, rows)]) of `groups` (((at, state), rows) by ascending (at, state)), each state once, in the order
    it first appears, its groups by ascending `at`."""
    found: dict[int, list] = {}
    for (at, where), rows in groups:
        found.setdefault(where, []).append((at, rows))
    return list(found.items())


def walk_on(group: GroupWalk, split, dfa: LazyDFA, layout, out: Crossed, split_of, keep, dfa_for) -> None:
    """Add to `out` the tokens of `group` (walked through the head of `split`) that survive in `split`'s state: those
    ending inside the head at an end that leads on (`Split.leads_on`), then those passing it (`cross_on`)."""
    ends = [group.dfa.term(end) for end in group.ends.tolist()]
    if ends:
        kept = split.leads_on(ends).take(group.end_of)
        if kept.any():
            first = len(out.targets)
            out.targets.extend((split, end) for end in ends)
            out.ids.append(layout.order[group.inside[kept]])
            out.slots.append(group.end_of[kept] + first)
    if group.groups:
        cross_on(group, split, group.groups, dfa, layout, out, split_of, keep, dfa_for)


def add_walked(out: Crossed, dfa: LazyDFA, layout, rows: np.ndarray, at: int, there: int) -> None:
    """The tokens at `rows` walked on from byte `at` in the whole term's DFA from `there` (a numbered state)."""
    if there == DEAD:
        return
    positions, states = rows, np.full(len(rows), there, dtype=np.int32)
    done_rows, done_states = [], []
    if at == 0 and len(rows) > SETTLE_ROWS:  # free text ends without a walk, as in a walk of the vocabulary
        positions, states = _settled(dfa, layout, there, positions, states, done_rows, done_states)
    for j, column in enumerate(layout.columns[at:], start=at):
        ended = int(positions.searchsorted(layout.counts[j]))
        done_rows.append(positions[ended:])
        done_states.append(states[ended:])
        positions, states = positions[:ended], states[:ended]
        if not len(positions):
            break
        states = dfa.step(states, column[positions])
        alive = states != DEAD
        positions, states = positions[alive], states[alive]
    done_rows.append(positions)
    done_states.append(states)
    ends = np.concatenate(done_states)
    if len(ends):
        distinct, slot = np.unique(ends, return_inverse=True)
        first = len(out.targets)
        out.targets.extend(distinct.tolist())
        out.ids.append(layout.order[np.concatenate(done_rows)])
        out.slots.append(slot.astype(np.int32) + first)


def _settled(dfa: LazyDFA, layout, there: int, positions: np.ndarray, states: np.ndarray, done_rows: list,
             done_states: list) -> tuple[np.ndarray, np.ndarray]:
    """(positions, states) left to walk from `there` after the tokens `staying` ends without a walk are appended,
    with their end states (the live ones), to `done_rows` and `done_states`."""
    for stay in staying(dfa, layout, there):
        settled = stay.rows.take(positions)  # (n,) bool
        if not np.count_nonzero(settled):
            continue
        rows = positions[settled]
        ends = np.full(len(rows), stay.ends, np.int32) if np.ndim(stay.ends) == 0 else stay.ends.take(rows)
        alive = ends != DEAD
        done_rows.append(rows[alive])
        done_states.append(ends[alive])
        positions, states = positions[~settled], states[~settled]
    return positions, states

"""The tokens of a vocabulary as a trie, walked through a DFA level by level (numpy over the live nodes of a level).

A node is a distinct byte prefix of some token; the nodes of depth j (prefixes of j + 1 bytes) are numbered in
byte order, so the children of a node, and the tokens that end at it, are contiguous ranges. A walk from a state
steps each live node's children once, however many tokens share its prefix, and drops a whole subtree as soon as
its prefix dies: a state most first bytes leave costs in proportion to what stays alive, not to the vocabulary.

It steps the same (state, byte) cells as a column walk of the same tokens (`fsm.index._walk_rows`), level for
level, so the lazy DFA grows alike.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from fsm.lazy_dfa import DEAD, LazyDFA


@dataclass(frozen=True, eq=False)
class TokenTrie:
    """Per depth j (a tuple entry each): the nodes' bytes, the ranges of their children at depth j + 1
    (child_start, (n_j + 1,)), and the rows of walk_layout.order of the tokens ending at them (end_start,
    (n_j + 1,), into end_rows)."""

    node_bytes: tuple[np.ndarray, ...]  # (n_j,) uint8
    child_start: tuple[np.ndarray, ...]  # (n_j + 1,) int64 into the nodes of depth j + 1
    end_start: tuple[np.ndarray, ...]  # (n_j + 1,) int64 into end_rows[j]
    end_rows: tuple[np.ndarray, ...]  # (tokens of j + 1 bytes,) int64 rows of walk_layout.order

    @classmethod
    def build(cls, layout) -> "TokenTrie":
        """The trie of the tokens of `layout` (a `fsm.vocabulary.WalkLayout`)."""
        n, width = len(layout.order), layout.max_length
        if not width:
            return cls((), (), (), ())
        padded = np.zeros((n, width), dtype=np.uint8)  # (n_tokens, width) bytes by row, zero past the end
        for j, column in enumerate(layout.columns):
            padded[: len(column), j] = column
        lengths = layout.lengths[layout.order]  # (n_tokens,) by row
        by_bytes = np.argsort(padded.view(np.dtype((np.void, width))).ravel(), kind="stable")  # void: memcmp order
        node_bytes, child_start, end_start, end_rows = [], [], [], []
        previous, alive_rows = None, None  # (tokens alive at depth j - 1,) node index of each and row, byte order
        for j in range(width):
            if j:  # tokens longer than j bytes, in byte order, and their nodes at depth j - 1
                longer = lengths[alive_rows] > j
                rows, parents = alive_rows[longer], previous[longer]
            else:
                rows, parents = by_bytes, np.zeros(n, dtype=np.int64)
            column = padded[rows, j]
            new = np.ones(len(rows), dtype=bool)
            new[1:] = (parents[1:] != parents[:-1]) | (column[1:] != column[:-1])
            node = np.cumsum(new) - 1  # (tokens,) node at depth j
            starts = np.flatnonzero(new)
            node_bytes.append(column[starts])
            if j:  # children of depth j - 1's nodes: contiguous, since nodes are numbered in byte order
                child_start.append(np.searchsorted(parents[starts], np.arange(len(node_bytes[j - 1]) + 1)))
            ending = lengths[rows] == j + 1
            end_rows.append(rows[ending].astype(np.int64))
            end_start.append(np.searchsorted(node[ending], np.arange(len(starts) + 1)))
            previous, alive_rows = node, rows
        if width:
            child_start.append(np.zeros(len(node_bytes[-1]) + 1, dtype=np.int64))
        return cls(tuple(node_bytes), tuple(child_start), tuple(end_start), tuple(end_rows))

    @property
    def depth(self) -> int:
        return len(self.node_bytes)

    def walk(self, dfa: LazyDFA, state: int) -> tuple[np.ndarray, np.ndarray]:
        """(rows, ends): the rows of walk_layout.order of the tokens that survive their bytes from `state`, and the
        state each ends in (int32), in no particular order."""
        if not self.depth:
            return np.zeros(0, np.int64), np.zeros(0, np.int32)
        states = dfa.row(state).take(self.node_bytes[0])  # (n_0,) the state after each first byte
        nodes = np.flatnonzero(states != DEAD)
        return _joined(self._walk_below(dfa, 0, nodes, states[nodes]))

    def walk_along(self, dfa: LazyDFA, steps) -> tuple[np.ndarray, np.ndarray]:
        """`walk` from a state whose only live continuations start with a literal (a key, punctuation), given as
        `steps`, an iterable of (byte, the state after it) read as far as tokens spell it: the tokens that spell a
        prefix of it (`descend`), then, where the literal ends inside some token, a walk below its last byte from the
        state there."""
        parts, end = self.descend(steps)
        if end is not None:
            depth, node, state = end
            parts.extend(self._walk_below(dfa, depth, np.asarray([node]), np.asarray([state], dtype=np.int32)))
        return _joined(parts)

    def descend(self, steps) -> tuple[list, tuple[int, int, int] | None]:
        """([(rows, ends)] of the tokens that end inside a literal, found by bisection, one node per byte, whatever the
        tokens sharing those bytes; and (depth, node, state) where the literal ends at a node of the trie: the tokens
        ending there or below go on from `state`, None where no token spells it whole). `steps` as in `walk_along`."""
        out, lo, hi, node, j, before = [], 0, len(self.node_bytes[0]), -1, -1, DEAD
        for byte, state in steps:
            if node >= 0:  # the node of the byte before: its tokens end inside the literal
                rows = self.end_rows[j][self.end_start[j][node]: self.end_start[j][node + 1]]
                if len(rows):
                    out.append((rows, np.full(len(rows), before, dtype=np.int32)))
                lo, hi = int(self.child_start[j][node]), int(self.child_start[j][node + 1])
            j += 1
            if j == self.depth or lo == hi:  # no token spells more of it
                return out, None
            spelled = self.node_text[j]
            node = bisect.bisect_left(spelled, byte, lo, hi)
            if node == hi or spelled[node] != byte:
                return out, None
            before = state
        return out, ((j, node, before) if node >= 0 else None)

    def below(self, depth: int, node: int) -> tuple[np.ndarray, np.ndarray]:
        """(own, longer): the rows of the tokens ending at `node` of `depth`, and of those below it (ascending)."""
        start, size, rows = self.subtrees
        first, own = start[depth][node], self.end_start[depth][node + 1] - self.end_start[depth][node]
        return rows[first: first + own], np.sort(rows[first + own: first + size[depth][node]])

    def _walk_below(self, dfa: LazyDFA, depth: int, nodes: np.ndarray, states: np.ndarray) -> list:
        """[(rows, ends)] of the tokens ending at or below `nodes` of `depth`, from `states` (the state after each
        node's bytes)."""
        out = []
        for j in range(depth, self.depth):
            rows, owner = _ranges(self.end_start[j], nodes, self.end_rows[j])
            if len(rows):
                out.append((rows, states[owner]))
            below = self._descend(dfa, j, nodes, states)
            if below is None:
                break
            nodes, states = below
        return out

    def _descend(self, dfa: LazyDFA, j: int, nodes: np.ndarray, states: np.ndarray):
        """(children, their states): the children (depth j + 1) of `nodes` (depth j, after whose bytes the DFA is in
        `states`) that the DFA does not kill; None where `nodes` have no children."""
        children, owner = _ranges(self.child_start[j], nodes)
        if not len(children):
            return None
        states = dfa.step(states[owner], self.node_bytes[j + 1][children])
        alive = states != DEAD
        if np.count_nonzero(alive) == len(alive):  # a C call: the filter costs two more
            return children, states
        return children[alive], states[alive]

    @cached_property
    def node_text(self) -> tuple[bytes, ...]:
        """node_bytes per depth as bytes, for bisection."""
        return tuple(b.tobytes() for b in self.node_bytes)

    def walk_head(self, dfa: LazyDFA, state: int):
        """A head's walk (`fsm.index.HeadWalk`) from `state`: (rows, ends) of the tokens that survive without passing
        an accepting state strictly inside their bytes, in no particular order, and (crossing, cross_at,
        cross_state) of those that do, crossing ascending: the bytes before their first such state and that state.
        A node at an accepting state hands its whole subtree to the crossing tokens at once (`subtrees`), so the
        walk steps no byte past a head's end."""
        if not self.depth:
            return np.zeros(0, np.int64), np.zeros(0, np.int32), *_no_crossing()
        states = dfa.row(state).take(self.node_bytes[0])  # (n_0,) the state after each first byte
        nodes = np.flatnonzero(states != DEAD)
        states = states[nodes]
        out_rows, out_states, cross = [], [], []
        for j in range(self.depth):
            rows, owner = _ranges(self.end_start[j], nodes, self.end_rows[j])
            if len(rows):
                out_rows.append(rows)
                out_states.append(states[owner])
            passing = dfa.accepting.take(states)  # their longer tokens pass the head's end here
            if np.count_nonzero(passing):
                cross.append(self._below(j, nodes[passing], states[passing]))
                nodes, states = nodes[~passing], states[~passing]
            below = self._descend(dfa, j, nodes, states)
            if below is None:
                break
            nodes, states = below
        rows = np.concatenate(out_rows) if out_rows else np.zeros(0, np.int64)
        ends = np.concatenate(out_states) if out_states else np.zeros(0, np.int32)
        if not cross:
            return rows, ends, *_no_crossing()
        crossing, at, where = (np.concatenate(parts) for parts in zip(*cross))
        order = np.argsort(crossing)
        return rows, ends, crossing[order], at[order].astype(np.int32), where[order].astype(np.int32)

    def _below(self, j: int, nodes: np.ndarray, states: np.ndarray):
        """(rows, at, states): the tokens below `nodes` of depth j, not those ending at them, each with j + 1 bytes
        read and its node's state."""
        start, size, ending = self.subtrees
        begin = start[j][nodes] + (self.end_start[j][nodes + 1] - self.end_start[j][nodes])
        items, owner = _spans(begin, start[j][nodes] + size[j][nodes] - begin)
        return ending[items], np.full(len(items), j + 1, dtype=np.int32), states[owner]

    @cached_property
    def subtrees(self) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...], np.ndarray]:
        """(start, size, rows): the tokens in pre-order (a node's own tokens, then each child's subtree in byte order),
        `rows` (n_tokens,) int64; node i of depth j holds rows[start[j][i] : start[j][i] + size[j][i]], its own
        tokens first. Built once per trie from its arrays."""
        own = [np.diff(e) for e in self.end_start]  # (n_j,) tokens ending at each node
        size = [None] * self.depth
        for j in reversed(range(self.depth)):  # a node's tokens and its children's
            below = np.zeros(len(own[j]), np.int64)
            if j + 1 < self.depth and len(size[j + 1]):
                sums = np.concatenate([[0], np.cumsum(size[j + 1])])
                below = sums[self.child_start[j][1:]] - sums[self.child_start[j][:-1]]
            size[j] = own[j] + below
        start = [np.concatenate([[0], np.cumsum(size[0])[:-1]]).astype(np.int64)]
        for j in range(self.depth - 1):  # a child starts after its parent's own tokens and its elder siblings
            parent = np.repeat(np.arange(len(own[j])), np.diff(self.child_start[j]))
            before = np.concatenate([[0], np.cumsum(size[j + 1])])[:-1]
            start.append(start[j][parent] + own[j][parent] + before - before[self.child_start[j][parent]])
        rows = np.zeros(int(size[0].sum()), np.int64)
        for j in range(self.depth):
            first = np.repeat(start[j] - self.end_start[j][:-1], own[j])  # (tokens of j + 1 bytes,)
            rows[first + np.arange(len(self.end_rows[j]))] = self.end_rows[j]
        return tuple(start), tuple(size), rows


def _joined(parts: list) -> tuple[np.ndarray, np.ndarray]:
    if not parts:
        return np.zeros(0, np.int64), np.zeros(0, np.int32)
    return np.concatenate([rows for rows, _ in parts]), np.concatenate([ends for _, ends in parts])


def _no_crossing() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return np.zeros(0, np.int64), np.zeros(0, np.int32), np.zeros(0, np.int32)


def _ranges(starts: np.ndarray, nodes: np.ndarray, values: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(items, owner): the concatenated ranges starts[i]:starts[i + 1] of `nodes` (values of them when given), and
    for each item the index into `nodes` of its range."""
    begin = starts[nodes]
    items, owner = _spans(begin, starts[nodes + 1] - begin)
    return (items if values is None or not len(items) else values[items]), owner


def _spans(begin: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(items, owner): the concatenated ranges begin[i] : begin[i] + counts[i] (int64), and for each item the index of
    its range (array methods, not numpy's functions: each of those is one more Python call)."""
    before = counts.cumsum()
    total = int(before[-1]) if len(before) else 0
    if not total:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    before -= counts  # the items of the ranges before each
    owner = np.arange(len(counts)).repeat(counts)
    return np.arange(total) + (begin - before).take(owner), owner

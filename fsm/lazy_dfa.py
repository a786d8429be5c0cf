"""A byte DFA over an `rx` term, expanded lazily: a state's transitions are computed on their first use.

States are terms (the derivatives of the root), numbered in discovery order with 0 = the root.
A row of the transition table is filled from one derivative per block of the state's byte classes:
all of it by `row`, only the blocks its bytes fall in by `step` and `next` (a walk of the tokens
through a state with many blocks, a key's first letters, derives the blocks they reach, however many
tokens reach them). A derivative whose language is empty is DEAD, so every live transition can
still reach acceptance: the token index relies on that to drop tokens early. A derivative whose
emptiness the search cannot decide within its limit is DEAD too
(`rx.is_empty(..., rx.WALK_LIMIT, undecided=True)`): the guide forbids it, so its language only
narrows (never an invalid text) and a first visit during generation never raises for it.

Growing happens under `fsm.budget.BUILD_LOCK`; a cell, once filled, never changes, and arrays are
replaced (never resized in place), so readers of filled cells need no lock.
"""

from __future__ import annotations

from collections import deque
from functools import lru_cache

import numpy as np

from fsm import rx
from fsm.budget import BUILD_LOCK, DEFAULT_BUDGET, GuideBudgetError

DEAD = -1
UNFILLED = -2  # a cell of the table not derived yet


class LazyDFA:
    """The DFA of `root`, grown on demand (see the module docstring).

    Attributes
    ----------
    root : rx.Rx
        The term of state 0.
    pattern : str or None
        What the DFA was compiled from (a regex), if known; only used in messages.
    """

    def __init__(self, root: rx.Rx, pattern: str | None = None, max_states: int = DEFAULT_BUDGET.max_states):
        self.root, self.pattern, self.max_states = root, pattern, max_states
        self._terms: list[rx.Rx] = []  # state -> term
        self._ids: dict[int, int] = {}  # term id -> state
        self._table = np.full((16, 256), UNFILLED, dtype=np.int32)  # (capacity, 256), rows < n_states used
        self._filled = np.zeros(16, dtype=bool)  # (capacity,) whole row computed
        self._accepting = np.zeros(16, dtype=bool)  # (capacity,)
        self._add(root, check=False)  # state 0 even when the language is empty (its row is all DEAD)
        if rx.is_empty(root):
            self._ids[root.id] = DEAD

    @property
    def n_states(self) -> int:
        """States discovered so far."""
        return len(self._terms)

    @property
    def accepting(self) -> np.ndarray:
        """(n_states,) bool: the state's term matches the empty string."""
        return self._accepting[: self.n_states]

    @property
    def transitions(self) -> np.ndarray:
        """(n_states, 256) int32 table; cells not yet filled read DEAD (call `explore_all` first)."""
        table = self._table[: self.n_states]
        return np.where(table == UNFILLED, DEAD, table)

    def name(self) -> str:
        """The pattern, shortened, or the root term."""
        if self.pattern is None:
            return repr(self.root)
        return f"regex {self.pattern[:60]!r}{'...' if len(self.pattern) > 60 else ''}"

    def term(self, state: int) -> rx.Rx:
        return self._terms[state]

    def row(self, state: int) -> np.ndarray:
        """(256,) int32 next states of `state` (filled on first use; do not modify)."""
        if not self._filled[state]:
            self._fill(state)
        return self._table[state]

    @property
    def known(self):
        """Ids of the terms numbered so far (live states and DEAD ones), a read-only view."""
        return self._ids.keys()

    def state_of(self, term: rx.Rx) -> int:
        """The state of `term` (numbered if new; DEAD for an empty language); its row is filled on first use."""
        with BUILD_LOCK:
            return self._add(term)

    def is_dead(self, term: rx.Rx) -> bool:
        """Whether `term` is DEAD here, as `state_of` would number it, without numbering a live one (a DEAD one is
        remembered, as `state_of` remembers it)."""
        if term.plain:  # never forbidden: DEAD only as NOTHING
            return term is rx.NOTHING
        with BUILD_LOCK:
            found = self._ids.get(term.id)
            if found is None and _dead(term):
                found = self._ids[term.id] = DEAD
            return found == DEAD

    def step(self, states: np.ndarray, data: np.ndarray) -> np.ndarray:
        """Next states of live `states` (n,) on bytes `data` (n,): (n,) int32, DEAD where it dies."""
        cells = (states.astype(np.int32, copy=False) << 8) | data  # (n,) flat index into the table
        # flat take, as a method (np.take's dispatch costs as much on short arrays): 3x faster than [s, d]
        out = self._table.reshape(-1).take(cells)
        missing = out == UNFILLED
        if np.count_nonzero(missing):  # a C call: `any` goes through Python
            self._fill_cells(set(cells[missing].tolist()))
            out = self._table.reshape(-1).take(cells)
        return out

    def next(self, state: int, byte: int) -> int:
        """The state after `byte` from live `state` (DEAD where it dies): `step` for one cell, without arrays."""
        found = int(self._table[state, byte])
        if found == UNFILLED:
            with BUILD_LOCK:
                if self._table[state, byte] == UNFILLED:
                    self._fill_block(state, rx.block_index(self._terms[state], byte))
            found = int(self._table[state, byte])
        return found

    def walk(self, data: bytes, state: int = 0) -> int:
        """State after reading `data` from `state` (DEAD if it leaves the language): a block of cells per byte
        (`next`), not a row of them (a token's 10 bytes through a bounded string's rows derived 120 cells, 35 ms)."""
        for byte in data:
            if state == DEAD:
                break
            state = self.next(state, byte)
        return state

    def fullmatch(self, data: bytes) -> bool:
        state = self.walk(data)
        return state != DEAD and bool(self._accepting[state])

    def explore_all(self, limit: int = 100_000) -> "LazyDFA":
        """Fill every row reachable from the root; raises ValueError beyond `limit` states."""
        queue, seen = deque([0]), {0}
        while queue:
            row = self.row(queue.popleft())
            for state in np.unique(row[row != DEAD]).tolist():
                if state not in seen:
                    seen.add(state)
                    queue.append(state)
            if self.n_states > limit:
                raise ValueError(f"the DFA of {self.name()} has more than {limit} states")
        return self

    # -- growing -----------------------------------------------------------------------------------

    def _fill_cells(self, cells: set[int]) -> None:
        """Fill the blocks that hold the flat `cells`, each once, and no other block of their rows (filling a whole row
        once a step asked for more than 8 of its cells made 6-12% more derivatives over mask_speed's walks)."""
        needed: dict[int, int] = {}  # state -> 256-bit mask of its bytes asked for
        for cell in cells:
            needed[cell >> 8] = needed.get(cell >> 8, 0) | 1 << (cell & 255)
        with BUILD_LOCK:
            for state, wanted in needed.items():
                self._fill_blocks(state, wanted)

    def _fill_blocks(self, state: int, wanted: int) -> None:
        """Fill the blocks of `state` that hold a byte of the 256-bit mask `wanted` and are not filled yet."""
        for block, mask in enumerate(self._terms[state].classes):
            if mask & wanted and self._table[state, rx.lowest_byte(mask)] == UNFILLED:
                self._fill_block(state, block)

    def _fill_block(self, state: int, block: int) -> None:
        term = self._terms[state]
        target = self._add(rx.derivative_of_block(term, block))
        self._table[state, _bytes_of(term.classes[block])] = target  # after _add: the table may be new

    def _fill(self, state: int) -> None:
        with BUILD_LOCK:
            if not self._filled[state]:  # another thread may have filled it while this one waited
                self._fill_locked(state)

    def _fill_locked(self, state: int) -> None:
        term = self._terms[state]
        targets = [(mask, self._add(rx.derivative_of_block(term, i))) for i, mask in enumerate(term.classes)]
        row = self._table[state]  # after _add: the table may have been reallocated
        for mask, target in targets:
            row[_bytes_of(mask)] = target
        self._filled[state] = True

    def _add(self, term: rx.Rx, check: bool = True) -> int:
        """The state of `term`, numbering it if new; DEAD for an empty language."""
        found = self._ids.get(term.id)
        if found is not None:
            return found
        if check and _dead(term):
            self._ids[term.id] = DEAD
            return DEAD
        if len(self._terms) >= self.max_states:
            raise GuideBudgetError(
                f"the DFA of {self.name()} needs more than {self.max_states} states (Budget.max_states)"
            )
        state = self._ids[term.id] = len(self._terms)
        self._terms.append(term)
        if state == len(self._filled):
            self._grow()
        self._accepting[state] = term.nullable
        return state

    def _grow(self) -> None:
        extra = len(self._filled)  # table before flags: a reader that sees a row filled finds it in the table
        self._table = _doubled(self._table, UNFILLED)
        self._accepting = np.concatenate([self._accepting, np.zeros(extra, dtype=bool)])
        self._filled = np.concatenate([self._filled, np.zeros(extra, dtype=bool)])

    @property
    def nbytes(self) -> int:
        """Bytes held by the transition arrays (terms not counted)."""
        return self._table.nbytes + self._filled.nbytes + self._accepting.nbytes


def _doubled(table: np.ndarray, fill: int) -> np.ndarray:
    """A new array of twice `table`'s rows: a copy of it, then `fill` (one pass over each half; concatenating a
    filled half wrote the new rows twice, 116 ms at 32k states of 256 cells)."""
    out = np.empty((2 * len(table), *table.shape[1:]), dtype=table.dtype)
    out[: len(table)] = table
    out[len(table):] = fill
    return out


def _dead(term: rx.Rx) -> bool:
    """Whether a walk treats `term` as DEAD: NOTHING, or a term that is not plain and `_forbidden`."""
    return term is rx.NOTHING or (not term.plain and _forbidden(term))


def _forbidden(term: rx.Rx) -> bool:
    """Whether a walk treats `term` as DEAD: empty, or undecided within `rx.WALK_LIMIT` (forbidden: narrower)."""
    return rx.is_empty(term, rx.WALK_LIMIT, undecided=True)


@lru_cache(maxsize=4096)
def _bytes_of(mask: int) -> np.ndarray:
    """The bytes of a 256-bit mask as an index array."""
    bits = np.unpackbits(np.frombuffer(mask.to_bytes(32, "little"), dtype=np.uint8), bitorder="little")
    return np.flatnonzero(bits)

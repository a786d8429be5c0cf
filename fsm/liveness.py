"""Token liveness: can some sequence of *tokens* still reach acceptance from a DFA state?

Every live DFA state can reach acceptance by some bytes. With a vocabulary that spells every byte of
UTF-8 text as a token of its own (byte-level BPE, SentencePiece with byte fallback) that settles it.
Vocabularies that lack a few single bytes (SmolLM2 lacks 0xF1, 0xF2 and some control bytes) need a
check: a state is token-live when some string of single-byte tokens reaches acceptance from it,
which an emptiness test on `term ∩ singles*` proves (depth first, memoized on the terms). Only
when that fails does a full crawl over tokens decide, once per index.
"""

from __future__ import annotations

import numpy as np

from fsm import rx
from fsm.lazy_dfa import LazyDFA

# Bytes that occur in UTF-8 text (not C0, C1, F5-FF): the terms denote UTF-8 text, so only these
# bytes can lie on a live transition.
UTF8_BYTES = frozenset(range(256)) - {0xC0, 0xC1} - frozenset(range(0xF5, 0x100))
UNKNOWN, LIVE, DEAD_END = 0, 1, -1


class TokenLiveness:
    """Memoized token liveness of the states of `dfa`; `crawl(state)` -> (ids, end states) of every
    token that survives from a state."""

    def __init__(self, dfa: LazyDFA, single_bytes: frozenset[int], crawl):
        self.dfa, self.crawl = dfa, crawl
        self.trivial = UTF8_BYTES <= single_bytes
        self.singles = rx.star(rx.byte_set(sum(1 << b for b in single_bytes)))
        self.status = np.zeros(0, dtype=np.int8)  # (n_states,) UNKNOWN / LIVE / DEAD_END
        self.exact = None  # (n_states,) bool from a full crawl, computed only when needed
        self.proofs: list[rx.Rx] = []  # keeps the searched terms alive: their emptiness is memoized on them

    def keep(self, states: np.ndarray) -> np.ndarray | None:
        """(n,) bool: which of `states` (n,) are token-live; None when all are."""
        if self.trivial:
            return None
        if len(self.status) < self.dfa.n_states:
            self.status = np.concatenate([self.status, np.zeros(self.dfa.n_states - len(self.status), np.int8)])
        for state in np.unique(states[self.status[states] == UNKNOWN]).tolist():
            self.status[state] = LIVE if self._is_live(state) else DEAD_END
        return self.status[states] == LIVE

    def _is_live(self, state: int) -> bool:
        if self.dfa.accepting[state]:
            return True
        spelled = rx.inter(self.dfa.term(state), self.singles)
        self.proofs.append(spelled)
        try:
            if not rx.is_empty(spelled, limit=10_000):
                return True
        except ValueError:
            pass
        if self.exact is None:
            self.exact = self._crawl_all()
        return state < len(self.exact) and bool(self.exact[state])

    def _crawl_all(self) -> np.ndarray:
        """States from which some token sequence reaches acceptance (every token-reachable state)."""
        edges, seen, frontier = {}, {0}, [0]
        while frontier:
            state = frontier.pop()
            edges[state] = set(self.crawl(state)[1].tolist())
            new = edges[state] - seen
            seen |= new
            frontier.extend(new)
        live = {s for s in seen if self.dfa.accepting[s]}
        changed = True
        while changed:
            grown = {s for s, targets in edges.items() if targets & live} | live
            changed, live = grown != live, grown
        out = np.zeros(self.dfa.n_states, dtype=bool)
        out[list(live)] = True
        return out

"""Token liveness: can some sequence of *tokens* still reach acceptance from a DFA state?

Every live DFA state can reach acceptance by some bytes. With a vocabulary that spells every byte of
UTF-8 text as a token of its own (byte-level BPE, SentencePiece with byte fallback) that settles it.
Vocabularies that lack a few single bytes (SmolLM2 lacks 0xF1, 0xF2 and some control bytes) need a
check: a state is token-live when some string of single-byte tokens reaches acceptance from it,
which an emptiness test on `term ∩ singles*` proves. The intersection is pushed through the term's
structure (`restrict`: keep only single-token bytes in every byte set), so for terms without `and`
and `not` the test is structural and exact, whatever the lengths of counted repeats. Only when that
fails does a full crawl over tokens decide, once per index.
"""

from __future__ import annotations

import numpy as np

from fsm import rx
from fsm.budget import GuideBudgetError, current_meter
from fsm.lazy_dfa import LazyDFA

# Bytes that occur in UTF-8 text (not C0, C1, F5-FF): the terms denote UTF-8 text, so only these
# bytes can lie on a live transition.
UTF8_BYTES = frozenset(range(256)) - {0xC0, 0xC1} - frozenset(range(0xF5, 0x100))
UNKNOWN, LIVE, DEAD_END = 0, 1, -1
MAX_RESTRICTED = 200_000  # memoized restrictions kept per index before the memo starts over


class TokenLiveness:
    """Memoized token liveness of the states of `dfa`; `crawl(state)` -> (ids, end states) of every
    token that survives from a state."""

    def __init__(self, dfa: LazyDFA, single_bytes: frozenset[int], crawl):
        self.dfa, self.crawl = dfa, crawl
        self.trivial = UTF8_BYTES <= single_bytes
        self.single_mask = sum(1 << b for b in single_bytes)
        self.singles = rx.star(rx.byte_set(self.single_mask))
        self.restricted: dict[int, rx.Rx] = {}  # term id -> term ∩ singles*, shared by every state
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
        if len(self.restricted) > MAX_RESTRICTED:
            self.restricted.clear()
        spelled = restrict(self.dfa.term(state), self.single_mask, self.singles, self.restricted)
        self.proofs.append(spelled)
        try:
            if not rx.is_empty(spelled, limit=10_000):
                return True
        except GuideBudgetError:
            raise
        except ValueError:
            pass
        if self.exact is None:
            self.exact = self._crawl_all()
        return state < len(self.exact) and bool(self.exact[state])

    def _crawl_all(self) -> np.ndarray:
        """States from which some token sequence reaches acceptance (every token-reachable state)."""
        meter = current_meter()
        sources: dict[int, set[int]] = {0: set()}  # state -> states with a token into it
        frontier = [0]
        while frontier:
            state = frontier.pop()
            if meter is not None:
                meter.check_clock()
            for target in set(self.crawl(state)[1].tolist()):
                if target not in sources:
                    sources[target] = set()
                    frontier.append(target)
                sources[target].add(state)
        live = [s for s in sources if s >= 0 and self.dfa.accepting[s]]
        out = np.zeros(self.dfa.n_states, dtype=bool)
        out[live] = True
        while live:  # backwards from acceptance: linear in the edges
            for source in sources[live.pop()]:
                if not out[source]:
                    out[source] = True
                    live.append(source)
        return out


def restrict(term: rx.Rx, mask: int, star_of_mask: rx.Rx, memo: dict[int, rx.Rx]) -> rx.Rx:
    """`term ∩ star_of_mask` (star_of_mask = (bytes in mask)*), pushed into byte sets where exact.

    Iterative post-order over the term DAG (sequence chains can be millions of bytes long);
    `memo` maps term ids to results and is shared between calls, so the derivatives of one term
    (which share their tails) are restricted in time proportional to what is new in them.
    """
    stack = [term]
    while stack:
        t = stack[-1]
        if t.id in memo:
            stack.pop()
            continue
        children = t.children if t.kind != "not" else ()
        todo = [c for c in children if c.id not in memo]
        if todo:
            stack.extend(todo)
            continue
        stack.pop()
        memo[t.id] = _rebuild(t, [memo[c.id] for c in children], mask, star_of_mask)
    return memo[term.id]


def _rebuild(term: rx.Rx, parts: list[rx.Rx], mask: int, star_of_mask: rx.Rx) -> rx.Rx:
    kind = term.kind
    if kind == "bytes":
        return rx.byte_set(term.args[0] & mask)
    if kind == "seq":
        return rx.seq(*parts)
    if kind == "alt":
        return rx.alt(*parts)
    if kind == "and":
        return rx.inter(*parts)
    if kind == "repeat":
        return rx.repeat(parts[0], term.args[1], term.args[2])
    if kind == "anyorder":  # a grammar of seq and alt over its items: restricting them is exact
        n_required = term.args[-1]
        sep, extra, universe, items = parts[0], parts[1], parts[2], parts[3:]
        return rx.any_order_list(items[:n_required], items[n_required:], extra, sep, universe)
    if kind == "pick":  # its holes are filled by the owner's restricted items
        return rx.pick(*parts)
    if kind == "hole":
        return rx.hole(parts[0])
    if kind in ("not", "call"):  # (¬c) ∩ S* does not distribute further; a call is restricted as a whole
        return rx.inter(term, star_of_mask)
    return term  # nothing, epsilon

"""Token liveness: can some sequence of *tokens* still reach acceptance from a DFA state?

Every live DFA state can reach acceptance by some bytes. With a vocabulary that spells every byte of
UTF-8 text as a token of its own (byte-level BPE, SentencePiece with byte fallback) that settles it.
Vocabularies that lack a few single bytes (SmolLM2 lacks 0xF1, 0xF2 and some control bytes) need a
check: a state is token-live when some string of single-byte tokens reaches acceptance from it,
which the string `rx.witness` finds by structure proves where it is of single-token bytes (printable
ASCII first: most states with a complement or an intersection of free text, which the next test
would search), else an emptiness test on `term ∩ singles*`. The intersection is pushed through the
term's structure (`restrict`: keep only single-token bytes in every byte set), so for terms without
`and` and `not` the test is structural and exact, whatever the lengths of counted repeats. Only when
that fails does a full crawl over tokens decide, once per index.

Most states need neither (`Spelling`): where each byte set of a term holds a single-token byte, and
each intersection has a part of single-token bytes alone, every non-empty derivative of the term
matches a string of single-token bytes. From such a state every token that does not die (a live
DFA state is non-empty) leads somewhere token-live: its first visit takes the trivial paths.
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
MAX_SPELLED = 500_000  # memoized `Spelling` answers kept per set of single bytes before the memo starts over


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
        self.spelling = spelling_of(self.single_mask)

    def all_live_from(self, state: int) -> bool:
        """Whether every state a token reaches from `state` without dying is token-live (nothing to check): the
        vocabulary spells every byte alone, or the term's non-empty derivatives all have single-byte strings."""
        return self.trivial or self.spelling.spelled(self.dfa.term(state))

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
        term = self.dfa.term(state)
        if self.dfa.accepting[state] or self.spelling.spelled(term) or self._spells_witness(term):
            return True  # live states are non-empty
        if len(self.restricted) > MAX_RESTRICTED:
            self.restricted.clear()
        spelled = restrict(term, self.single_mask, self.singles, self.restricted)
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

    def _spells_witness(self, term: rx.Rx) -> bool:
        """Whether the string `rx.witness` finds for `term` by structure (printable ASCII first) is of single-token
        bytes: those tokens, one a byte, spell a way to acceptance."""
        found = rx.witness(term)
        return found is not None and all(self.single_mask >> byte & 1 for byte in found)

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


_SPELLINGS: dict[int, "Spelling"] = {}  # single-byte mask -> its Spelling, shared by every index and schema


def forget_spellings() -> None:
    _SPELLINGS.clear()


def spelling_of(mask: int) -> "Spelling":
    found = _SPELLINGS.get(mask)
    if found is None:
        found = _SPELLINGS[mask] = Spelling(mask)
    return found


class Spelling:
    """Which terms single-byte tokens (bytes of `mask`) spell, proved by structure and memoized by term id (ids are
    never reused), so a new state costs what is new in its term. Two sufficient conditions:

    - `only_spelled(t)`: every string of t is of `mask` bytes. Its byte sets lie within `mask`, and an intersection
      needs one such part;
    - `spelled(t)`: every non-empty derivative of t matches a string of `mask` bytes. Each byte set holds a byte of
      `mask`, and each intersection has an `only_spelled` part. In a string of a derivative, put a byte of `mask`
      from the same set at each place outside an intersection: a sequence, union, repeat, list or rule still
      matches it, and inside an intersection the bytes are `mask` bytes already. Derivatives are built of t's
      parts, so they are `spelled` too.

    No complement is either. Under a call (rules recurse) an intersection is not looked into (not proved).
    """

    def __init__(self, mask: int):
        self.mask = mask
        self.some: dict[int, bool] = {}  # term id -> spelled
        self.only: dict[int, bool] = {}  # term id -> only_spelled

    def spelled(self, term: rx.Rx) -> bool:
        found = self.some.get(term.id)
        if found is not None:
            return found
        if len(self.some) + len(self.only) > MAX_SPELLED:
            self.some.clear()
            self.only.clear()
        return self._holds(term, self.some, self._holds_some_byte)

    def only_spelled(self, term: rx.Rx) -> bool:
        return self._holds(term, self.only, self._within)

    def _holds_some_byte(self, byte_set: int) -> bool:
        return bool(byte_set & self.mask)

    def _within(self, byte_set: int) -> bool:
        return not byte_set & ~self.mask

    def _holds(self, term: rx.Rx, memo: dict[int, bool], byte_set_ok) -> bool:
        """Iterative post-order over the term DAG (sequence chains are long), parts before the whole."""
        stack = [term]
        while stack:
            t = stack[-1]
            if t.id in memo:
                stack.pop()
                continue
            if t.kind in ("bytes", "and", "not", "call"):
                stack.pop()
                memo[t.id] = self._on_its_own(t, memo, byte_set_ok)
                continue
            todo = [c for c in t.children if c.id not in memo]
            if todo:
                stack.extend(todo)
                continue
            stack.pop()
            memo[t.id] = all(memo[c.id] for c in t.children)
        return memo[term.id]

    def _on_its_own(self, term: rx.Rx, memo: dict[int, bool], byte_set_ok) -> bool:
        """The answer for a term whose parts' answers do not make it: a byte set, an intersection, a complement, a
        call."""
        kind = term.kind
        if kind == "bytes":
            return byte_set_ok(term.args[0])
        if kind == "and":
            return any(self.only_spelled(part) for part in term.args)
        if kind == "call":
            return self._rule_holds(term, memo, byte_set_ok)
        return False  # a complement

    def _rule_holds(self, call: rx.Rx, memo: dict[int, bool], byte_set_ok) -> bool:
        """Whether everything `call` reaches, through the bodies of the rules it calls, passes: byte sets by
        `byte_set_ok`, no complement nor intersection (unless known to pass). Then each term reached is memoized
        True; else none is (around a cycle no part is known alone)."""
        seen, stack, reached = {call.id}, [call], []
        while stack:
            t = stack.pop()
            known = memo.get(t.id)
            if known is not None:
                if not known:
                    return False
                continue
            if t.kind in ("not", "and") or (t.kind == "bytes" and not byte_set_ok(t.args[0])):
                return False
            reached.append(t)
            below = t.children
            if t.kind == "call":
                if t.args[0].body is None:
                    return False
                below = (t.args[0].body,)
            for part in below:
                if part.id not in seen:
                    seen.add(part.id)
                    stack.append(part)
        for t in reached:  # each reaches only terms reached here or known to pass
            memo[t.id] = True
        return True


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

"""Regex -> interegular character FSM -> byte-level DFA as numpy tables.

The token index walks token *bytes*, so the character automaton that interegular builds is expanded
into UTF-8: every character transition becomes a chain of byte-range transitions through intermediate
states. A token that ends inside a multi-byte character simply ends in one of those intermediate
states. States from which no accepting state can be reached are removed, so every transition in the
table leads somewhere useful.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

import interegular
import numpy as np
from interegular.fsm import anything_else

from fsm.errors import RegexError

DEAD = -1
MAX_CODE_POINT = 0x10FFFF
SURROGATES = (0xD800, 0xDFFF)
_UTF8_LENGTH_LIMITS = (0x7F, 0x7FF, 0xFFFF)

ByteRanges = tuple[tuple[int, int], ...]  # one (low, high) range per byte of a UTF-8 sequence


@dataclass(frozen=True, eq=False)
class ByteDFA:
    """A trimmed deterministic automaton over bytes.

    transitions: (n_states, 256) int32, next state or DEAD; every target can still reach acceptance.
    accepting:   (n_states,) bool.
    The initial state is 0.
    """

    pattern: str
    transitions: np.ndarray
    accepting: np.ndarray

    @property
    def n_states(self) -> int:
        return len(self.accepting)

    def walk(self, data: bytes, state: int = 0) -> int:
        """State after reading `data` from `state` (DEAD if it leaves the language)."""
        for byte in data:
            if state == DEAD:
                break
            state = int(self.transitions[state, byte])
        return state

    def fullmatch(self, data: bytes) -> bool:
        state = self.walk(data)
        return state != DEAD and bool(self.accepting[state])


@lru_cache(maxsize=64)
def compile_regex(pattern: str) -> ByteDFA:
    """Compile a regex (full-match semantics) into a trimmed byte-level DFA.

    The syntax is Python's `re`; `\\d`, `\\w` and `\\s` are ASCII classes (as in ECMA-262, the regex
    dialect of JSON Schema). Positive lookaheads are supported as exact intersections.

    Raises
    ------
    RegexError
        For invalid syntax and for constructs a finite automaton cannot express (lookbehinds,
        negative lookaheads, backreferences, word boundaries, anchors inside the pattern), or a
        pattern whose language is empty.
    """
    char_fsm = _char_fsm(pattern)
    transitions, accepting = _expand_to_bytes(char_fsm)
    transitions, accepting = _trim(transitions, accepting)
    if len(accepting) == 0:
        raise RegexError(f"regex {pattern!r} matches no string at all")
    return ByteDFA(pattern, transitions, accepting)


def _char_fsm(pattern: str) -> interegular.FSM:
    body = _strip_outer_anchors(pattern)
    try:
        re.compile(body)
    except re.error as error:
        raise RegexError(f"invalid regex {pattern!r}: {error} (at position {error.pos})") from None
    try:
        parsed = interegular.parse_pattern(_expand_unicode_escapes(body))
        _reject_unsound_lookarounds(parsed, pattern)
        return parsed.to_fsm()
    except RegexError:
        raise
    except Exception as error:  # interegular raises Unsupported, InvalidSyntax and bare Exceptions
        raise RegexError(f"regex {pattern!r} is not supported: {_reason(error)}") from None


def _strip_outer_anchors(pattern: str) -> str:
    """`^...$` around the whole pattern is redundant under full-match semantics."""
    if pattern.startswith("^"):
        pattern = pattern[1:]
    if pattern.endswith("$") and not pattern.endswith("\\$"):
        pattern = pattern[:-1]
    return pattern


_UNICODE_ESCAPE = re.compile(r"(\\\\)|\\u([0-9a-fA-F]{4})|\\U([0-9a-fA-F]{8})")


def _expand_unicode_escapes(pattern: str) -> str:
    """interegular does not read \\uXXXX: write the character itself (escaped where special)."""

    def replace(match: re.Match) -> str:
        if match.group(1):
            return match.group(1)
        char = chr(int(match.group(2) or match.group(3), 16))
        return "\\" + char if char in "\\]^-[.*+?(){}|$" else char

    return _UNICODE_ESCAPE.sub(replace, pattern)


def _reason(error: Exception) -> str:
    message = str(error)
    if message in ("'^'", "'$'"):
        return f"anchor {message} inside the pattern (only a leading ^ and a trailing $ are allowed)"
    if "references" in message:
        return "backreferences cannot be expressed by a finite automaton"
    if "lookback" in message:
        return "lookbehind assertions are not supported"
    return message or type(error).__name__


def _reject_unsound_lookarounds(node, pattern: str) -> None:
    """interegular's negative lookahead is not exact; positive lookahead is an exact intersection."""
    from interegular.patterns import _NonCapturing

    if isinstance(node, _NonCapturing):
        if node.backwards:
            raise RegexError(f"regex {pattern!r} is not supported: lookbehind assertions")
        if node.negate:
            raise RegexError(f"regex {pattern!r} is not supported: negative lookahead (?!...)")
        node = node.inner
    for child in _children(node):
        _reject_unsound_lookarounds(child, pattern)


def _children(node) -> tuple:
    for attribute in ("options", "parts"):
        value = getattr(node, attribute, None)
        if value is not None:
            return tuple(value)
    base = getattr(node, "base", None)
    return (base,) if base is not None else ()


# ---------------------------------------------------------------------------------------------
# characters -> UTF-8 byte ranges


def _expand_to_bytes(char_fsm: interegular.FSM) -> tuple[np.ndarray, np.ndarray]:
    """Rows of a byte table: the interegular states first (initial = 0), then intermediate states."""
    order = [char_fsm.initial] + sorted(s for s in char_fsm.states if s != char_fsm.initial)
    state_id = {s: i for i, s in enumerate(order)}
    rows = [np.full(256, DEAD, dtype=np.int32) for _ in order]
    intermediate: dict[frozenset, int] = {}
    ranges_of_key = _code_point_ranges_by_key(char_fsm.alphabet)
    for state in order:
        pairs = [
            (sequence, state_id[target])
            for key, target in char_fsm.map.get(state, {}).items()
            for low, high in ranges_of_key[key]
            for sequence in utf8_sequences(low, high)
        ]
        _fill_row(rows, state_id[state], pairs, intermediate)
    accepting = np.zeros(len(rows), dtype=bool)
    accepting[[state_id[s] for s in char_fsm.finals]] = True
    return np.stack(rows), accepting


def _fill_row(rows: list, row: int, pairs: list, intermediate: dict) -> None:
    """Write the byte transitions of `pairs` ((byte ranges, target) with disjoint sequences)."""
    bounds = sorted({lo for seq, _ in pairs for lo in (seq[0][0], seq[0][1] + 1)})
    for low, end in zip(bounds, bounds[1:]):
        covering = [(seq[1:], target) for seq, target in pairs if seq[0][0] <= low <= seq[0][1]]
        if not covering:
            continue
        if not covering[0][0]:  # a complete character: go straight to the target state
            rows[row][low:end] = covering[0][1]
        else:
            rows[row][low:end] = _intermediate_state(rows, frozenset(covering), intermediate)


def _intermediate_state(rows: list, continuations: frozenset, intermediate: dict) -> int:
    if continuations not in intermediate:
        rows.append(np.full(256, DEAD, dtype=np.int32))
        intermediate[continuations] = len(rows) - 1
        _fill_row(rows, len(rows) - 1, list(continuations), intermediate)
    return intermediate[continuations]


def _code_point_ranges_by_key(alphabet) -> dict:
    """Transition key -> sorted disjoint code point ranges; `anything_else` is the complement."""
    explicit = sorted(ord(c) for c in alphabet if c is not anything_else)
    ranges = {}
    for key, symbols in alphabet.by_transition.items():
        points = sorted(ord(c) for c in symbols if c is not anything_else)
        found = _merge(points)
        if anything_else in symbols:
            found = sorted(found + _complement(explicit))
        ranges[key] = _without_surrogates(found)
    return ranges


def _merge(points: list[int]) -> list[tuple[int, int]]:
    ranges: list[list[int]] = []
    for p in points:
        if ranges and ranges[-1][1] + 1 == p:
            ranges[-1][1] = p
        else:
            ranges.append([p, p])
    return [(lo, hi) for lo, hi in ranges]


def _complement(sorted_points: list[int]) -> list[tuple[int, int]]:
    gaps, start = [], 0
    for p in sorted_points:
        if p > start:
            gaps.append((start, p - 1))
        start = max(start, p + 1)
    if start <= MAX_CODE_POINT:
        gaps.append((start, MAX_CODE_POINT))
    return gaps


def _without_surrogates(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out = []
    for lo, hi in ranges:
        if hi < SURROGATES[0] or lo > SURROGATES[1]:
            out.append((lo, hi))
            continue
        if lo < SURROGATES[0]:
            out.append((lo, SURROGATES[0] - 1))
        if hi > SURROGATES[1]:
            out.append((SURROGATES[1] + 1, hi))
    return out


def utf8_sequences(low: int, high: int) -> list[ByteRanges]:
    """Split code points [low, high] into UTF-8 byte-range products (disjoint, exact)."""
    out, stack = [], [(low, high)]
    while stack:
        lo, hi = stack.pop()
        split = _split_point(lo, hi)
        if split is None:
            out.append(tuple(zip(chr(lo).encode(), chr(hi).encode())))
        else:
            stack += [(split + 1, hi), (lo, split)]
    return out


def _split_point(lo: int, hi: int) -> int | None:
    """Where [lo, hi] must be cut so that each part is a product of byte ranges (None: no cut)."""
    for limit in _UTF8_LENGTH_LIMITS:
        if lo <= limit < hi:
            return limit
    for shift in (6, 12, 18):
        mask = (1 << shift) - 1
        if lo >> shift != hi >> shift:
            if lo & mask:
                return lo | mask
            if hi & mask != mask:
                return (hi & ~mask) - 1
    return None


# ---------------------------------------------------------------------------------------------
# trimming


def _trim(transitions: np.ndarray, accepting: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Keep states reachable from 0 that can reach acceptance; renumber them with 0 first."""
    keep = _reachable(transitions, 0) & _coreachable(transitions, accepting)
    if not keep[0]:
        return np.zeros((0, 256), dtype=np.int32), np.zeros(0, dtype=bool)
    new_id = np.full(len(keep) + 1, DEAD, dtype=np.int32)  # index -1 (DEAD) maps to DEAD
    new_id[np.flatnonzero(keep)] = np.arange(int(keep.sum()), dtype=np.int32)
    return new_id[transitions[keep]], accepting[keep]


def _reachable(transitions: np.ndarray, start: int) -> np.ndarray:
    return _search(_edges(transitions), [start], len(transitions))


def _coreachable(transitions: np.ndarray, accepting: np.ndarray) -> np.ndarray:
    sources, targets = _edges(transitions)
    return _search((targets, sources), np.flatnonzero(accepting).tolist(), len(transitions))


def _edges(transitions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct (source, target) state pairs of the table."""
    sources = np.repeat(np.arange(len(transitions)), 256)
    targets = transitions.reshape(-1)
    pairs = np.unique(np.stack([sources, targets])[:, targets != DEAD], axis=1)
    return pairs[0], pairs[1]


def _search(edges: tuple[np.ndarray, np.ndarray], starts: list[int], n: int) -> np.ndarray:
    """Breadth-first search along (from, to) edges; returns the visited mask."""
    origins, ends = edges
    order = np.argsort(origins, kind="stable")
    offsets = np.searchsorted(origins[order], np.arange(n + 1))
    ends = ends[order].tolist()
    seen = np.zeros(n, dtype=bool)
    seen[starts] = True
    frontier = list(starts)
    while frontier:
        state = frontier.pop()
        for nxt in ends[offsets[state]:offsets[state + 1]]:
            if not seen[nxt]:
                seen[nxt] = True
                frontier.append(nxt)
    return seen

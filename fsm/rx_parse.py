"""Regex text -> `rx` term (Python `re` syntax, full-match semantics, UTF-8 bytes).

The syntax tree comes from `re._parser`. Each node is converted together with its continuation K
(the term for everything after it up to the end of the pattern), so lookaheads are exact:

    A (?=X) B   ->  A · inter(B·K, X·ANYTHING)        A (?!X) B  ->  A · inter(B·K, ¬(X·ANYTHING))

Most nodes do not need K and are simply concatenated with it. `\\d` and `\\w` are ASCII and `\\s` is
ECMA-262 whitespace (the regex dialect of JSON Schema); `.` is any character but `\\n` (DOTALL: any).
Greedy, lazy and possessive-free repeats denote the same language.
"""

from __future__ import annotations

import re
import re._constants as C
import re._parser as sre
from functools import lru_cache

from fsm import rx, utf8
from fsm.casefold import fold, merge
from fsm.errors import RegexError

_SPACE = ((9, 13), (32, 32), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A), (0x2028, 0x2029),
          (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000), (0xFEFF, 0xFEFF))
_CATEGORIES = {
    C.CATEGORY_DIGIT: ((48, 57),),
    C.CATEGORY_WORD: ((48, 57), (65, 90), (95, 95), (97, 122)),
    C.CATEGORY_SPACE: _SPACE,
    C.CATEGORY_LINEBREAK: ((10, 10),),
}
_NEGATED = {C.CATEGORY_NOT_DIGIT: C.CATEGORY_DIGIT, C.CATEGORY_NOT_WORD: C.CATEGORY_WORD,
            C.CATEGORY_NOT_SPACE: C.CATEGORY_SPACE, C.CATEGORY_NOT_LINEBREAK: C.CATEGORY_LINEBREAK}
_STARTS = (C.AT_BEGINNING, C.AT_BEGINNING_STRING)
_ENDS = (C.AT_END, C.AT_END_STRING)
_MAX_UNROLL = 64
_UNSUPPORTED = {
    C.GROUPREF: "backreferences cannot be expressed by a finite automaton",
    C.GROUPREF_EXISTS: "conditional groups (?(id)...) cannot be expressed by a finite automaton",
    C.ATOMIC_GROUP: "atomic groups (?>...) are not supported",
    C.POSSESSIVE_REPEAT: "possessive repeats (*+, ++, ?+) are not supported",
}


def parse(pattern: str) -> rx.Rx:
    """The term for the strings that `pattern` fully matches (as UTF-8 bytes).

    Parameters
    ----------
    pattern : str
        Python `re` syntax. A leading ``^`` and a trailing ``$`` are redundant and ignored.

    Raises
    ------
    RegexError
        For invalid syntax and for what a finite automaton cannot express exactly (lookbehinds,
        backreferences, word boundaries, anchors inside the pattern, lookaheads inside repeats).
    """
    body = strip_outer_anchors(pattern)
    try:
        tree = sre.parse(body)
    except re.error as error:
        raise RegexError(f"invalid regex {pattern!r}: {error.msg} (at position {error.pos})") from None
    return _Converter(pattern).sequence(list(tree), rx.EPSILON, tree.state.flags, True)


def strip_outer_anchors(pattern: str) -> str:
    """`^...$` around the whole pattern is redundant under full-match semantics."""
    if pattern.startswith("^"):
        pattern = pattern[1:]
    if pattern.endswith("$") and not _escaped(pattern, len(pattern) - 1):
        pattern = pattern[:-1]
    return pattern


def _escaped(text: str, index: int) -> bool:
    backslashes = len(text[:index]) - len(text[:index].rstrip("\\"))
    return backslashes % 2 == 1


class _Converter:
    """Syntax tree nodes -> terms; `pattern` only names the regex in errors."""

    def __init__(self, pattern: str):
        self.pattern = pattern
        self.lookaheads = 0  # depth: inside a lookahead the continuation is the rest of the input

    def fail(self, reason: str):
        raise RegexError(f"regex {self.pattern!r} is not supported: {reason}")

    def sequence(self, items: list, k: rx.Rx, flags: int, at_start: bool) -> rx.Rx:
        """items · k; `at_start`: nothing but the empty string can precede the first item."""
        starts = []
        for op, _ in items:
            starts.append(at_start)
            at_start = at_start and op in (C.AT, C.ASSERT, C.ASSERT_NOT)
        for (op, av), start in zip(reversed(items), reversed(starts)):
            k = self.node(op, av, k, flags, start)
        return k

    def node(self, op, av, k: rx.Rx, flags: int, at_start: bool) -> rx.Rx:
        if op in _UNSUPPORTED:
            self.fail(_UNSUPPORTED[op])
        if op in (C.LITERAL, C.NOT_LITERAL, C.ANY, C.IN):
            return rx.seq(self.char_set(op, av, flags), k)
        if op is C.BRANCH:
            if any(_needs_k(branch) for branch in av[1]):
                return rx.alt(*(self.sequence(list(b), k, flags, at_start) for b in av[1]))
            return rx.seq(rx.alt(*(self.sequence(list(b), rx.EPSILON, flags, at_start) for b in av[1])), k)
        if op is C.SUBPATTERN:
            _, add, remove, items = av
            return self.sequence(list(items), k, (flags | add) & ~remove, at_start)
        if op in (C.MAX_REPEAT, C.MIN_REPEAT):
            return self.repeat(av, k, flags)
        if op in (C.ASSERT, C.ASSERT_NOT):
            return self.lookahead(op, av, k, flags)
        if op is C.AT:
            return self.anchor(av, k, flags, at_start)
        self.fail(f"{op} is not supported")

    def repeat(self, av, k: rx.Rx, flags: int) -> rx.Rx:
        low, high, items = av
        if _needs_k(items):
            return self.unrolled(list(items), low, high, k, flags)
        body = self.sequence(list(items), rx.EPSILON, flags, False)
        return rx.seq(rx.repeat(body, low, None if high == C.MAXREPEAT else high), k)

    def unrolled(self, items: list, low: int, high: int, k: rx.Rx, flags: int) -> rx.Rx:
        """X{low,high}·k as copies of X, each with its own continuation (a lookahead sees past X)."""
        if high == C.MAXREPEAT or high > _MAX_UNROLL:
            self.fail(
                "a lookahead or anchor inside an unbounded (or over 64 times) repetition cannot be expressed exactly"
            )
        for _ in range(high - low):  # optional copies, innermost first: k | X·k | X·X·k ...
            k = rx.alt(k, self.sequence(items, k, flags, False))
        for _ in range(low):
            k = self.sequence(items, k, flags, False)
        return k

    def lookahead(self, op, av, k: rx.Rx, flags: int) -> rx.Rx:
        direction, items = av
        if direction < 0:
            self.fail("lookbehind assertions (?<=...) (?<!...) are not supported")
        self.lookaheads += 1
        ahead = self.sequence(list(items), rx.ANYTHING, flags, False)
        self.lookaheads -= 1
        return rx.inter(k, ahead if op is C.ASSERT else rx.complement(ahead))

    def anchor(self, where, k: rx.Rx, flags: int, at_start: bool) -> rx.Rx:
        if where in _STARTS and at_start:
            return k
        if where in _ENDS and k is rx.EPSILON:
            return k
        if where in _ENDS and self.lookaheads:  # what may follow: nothing, or a final / any newline
            newline = rx.literal("\n") if not flags & C.SRE_FLAG_MULTILINE else rx.seq(rx.literal("\n"), rx.ANYTHING)
            return rx.inter(k, rx.EPSILON if where is C.AT_END_STRING else rx.optional(newline))
        if where in (C.AT_BOUNDARY, C.AT_NON_BOUNDARY):
            self.fail(r"word boundaries \b and \B are not supported")
        symbol = "^" if where in _STARTS else "$"
        self.fail(f"anchor {symbol!r} inside the pattern (only a leading ^ and a trailing $ are allowed)")

    def char_set(self, op, av, flags: int) -> rx.Rx:
        """One character out of a literal, `.`, or a bracketed class."""
        if op is C.ANY:
            return utf8.ANY_CHAR if flags & C.SRE_FLAG_DOTALL else _chars(((10, 10),), True)
        if op in (C.LITERAL, C.NOT_LITERAL):
            items = [(C.NEGATE, None)] * (op is C.NOT_LITERAL) + [(C.LITERAL, av)]
        else:
            items = av
        fold_case = (flags & C.SRE_FLAG_IGNORECASE) and (1 + bool(flags & C.SRE_FLAG_ASCII))
        ranges, negate = self.class_ranges(items, fold_case)
        return _chars(ranges, negate)

    def class_ranges(self, items, fold_case: int) -> tuple[tuple, bool]:
        """Sorted disjoint ranges of a class and whether it is negated; under IGNORECASE (fold_case
        1: Unicode, 2: ASCII) every item is widened by its case variants (a negated category \\W by
        complementing the widened \\w)."""
        ranges, negated, negate = [], [], False
        for op, av in items:
            if op is C.NEGATE:
                negate = True
            elif op is C.LITERAL:
                ranges.append((av, av))
            elif op is C.RANGE:
                ranges.append(av)
            elif op is C.CATEGORY and av in _NEGATED:
                negated.append(_NEGATED[av])
            elif op is C.CATEGORY:
                ranges.extend(_CATEGORIES[av])
            else:
                self.fail(f"{op} inside a character class is not supported")
        ranges = _fold(merge(sorted(ranges)), fold_case)
        for code in negated:
            ranges += tuple(utf8.complement(list(_fold(_CATEGORIES[code], fold_case))))
        return merge(sorted(ranges)), negate


def _fold(ranges: tuple, fold_case: int) -> tuple:
    return fold(ranges, fold_case == 2) if fold_case else ranges


@lru_cache(maxsize=4096)
def _chars(ranges: tuple, negate: bool) -> rx.Rx:
    return utf8.chars_except(ranges) if negate else utf8.chars(ranges)


def _needs_k(items) -> bool:
    """Whether a subtree contains a lookahead or an end anchor (which must see the continuation)."""
    for op, av in items:
        if (op in (C.ASSERT, C.ASSERT_NOT) and av[0] > 0) or (op is C.AT and av in _ENDS):
            return True
        if op is C.BRANCH and any(_needs_k(b) for b in av[1]):
            return True
        if op is C.SUBPATTERN and _needs_k(av[3]):
            return True
        if op in (C.MAX_REPEAT, C.MIN_REPEAT) and _needs_k(av[2]):
            return True
    return False

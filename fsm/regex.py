"""Regex -> lazily expanded byte DFA (fsm/rx_parse.py builds the term, fsm/lazy_dfa.py the DFA).

The token index walks token *bytes*, so the automaton is over UTF-8 bytes: a token that ends inside
a multi-byte character ends in an intermediate state. Only the states that walks visit are built.
"""

from __future__ import annotations

import weakref
from functools import lru_cache

from fsm import rx
from fsm.budget import metered
from fsm.errors import RegexError
from fsm.lazy_dfa import DEAD, LazyDFA
from fsm.rx_parse import parse

__all__ = ["DEAD", "LazyDFA", "compile_regex", "dfa_of", "parse"]


def compile_regex(pattern: str) -> LazyDFA:
    """Compile a regex (full-match semantics) into a lazily expanded byte-level DFA.

    The syntax is Python's `re`; `\\d` and `\\w` are ASCII and `\\s` is ECMA-262 whitespace (the
    regex dialect of JSON Schema). Lookaheads, positive and negative, are exact intersections.

    Raises
    ------
    RegexError
        For invalid syntax, for constructs a finite automaton cannot express (lookbehinds,
        backreferences, word boundaries, anchors inside the pattern), or a pattern whose language
        is empty.
    """
    with metered(None, f"compiling regex {pattern[:60]!r}"):
        return dfa_of(_parsed(pattern), pattern)


@lru_cache(maxsize=64)
def _parsed(pattern: str) -> rx.Rx:
    return parse(pattern)


def dfa_of(term: rx.Rx, name: str | None = None) -> LazyDFA:
    """The shared lazy DFA of `term` (one per term; the first name sticks); RegexError when empty."""
    if rx.is_empty(term):  # raises ValueError past its search limit
        raise RegexError(f"regex {name or term!r} matches no string at all")
    with metered(None, f"building the DFA of {name or term!r}"):
        dfa = _DFAS.get(term.id)
        if dfa is None:
            dfa = _DFAS[term.id] = LazyDFA(term)
        if dfa.pattern is None:
            dfa.pattern = name
        return dfa


_DFAS: "weakref.WeakValueDictionary[int, LazyDFA]" = weakref.WeakValueDictionary()  # term id -> DFA, while in use

"""JSON Schema `pattern` (search semantics) -> an `rx` term over the string's characters."""

from __future__ import annotations

import re
from functools import lru_cache

from fsm import rx
from fsm.errors import RegexError, SchemaError
from fsm.utf8 import ANY_CHAR

ANY_TEXT = rx.star(ANY_CHAR)
ASCII_TEXT = rx.star(rx.byte_range(0, 0x7F))
_UNICODE_CLASSES = re.compile(r"\\[dDwWsSbB]|\(\?[a-zA-Z]*i")  # where Python's re and the term may differ


def pattern_term(pattern, pointer: str, keyword: str = "pattern") -> rx.Rx:
    """The string contents (characters, no quotes) in which `pattern` finds a match.

    Raises
    ------
    SchemaError
        When the pattern is not a string, is invalid, or uses what a finite automaton cannot do.
    """
    if not isinstance(pattern, str):
        raise SchemaError(f"must be a string, not {pattern!r}", keyword=keyword, pointer=pointer)
    try:
        term = _search_term(pattern)
    except RegexError as error:
        raise SchemaError(f"pattern {pattern!r}: {error}", keyword=keyword, pointer=pointer) from None
    return rx.inter(term, ASCII_TEXT) if _UNICODE_CLASSES.search(pattern) else term  # agree with Python's re


def pattern_upper(pattern) -> rx.Rx:
    """A superset of the contents Python's `re.search(pattern, ...)` accepts (ANYTHING if unsure).

    The term spells `\\d`, `\\w`, `\\s` in ASCII/ECMA terms while Python's re is Unicode-aware, so a
    pattern using them (or case folding) is not trusted as an upper bound.
    """
    if not isinstance(pattern, str) or _UNICODE_CLASSES.search(pattern):
        return rx.ANYTHING
    try:
        return _search_term(pattern)
    except RegexError:
        return rx.ANYTHING


def search(pattern: str, text: str, pointer: str) -> bool:
    """Whether Python's `re.search` (what validators run) finds `pattern` in `text`."""
    try:
        return re.search(pattern, text) is not None
    except re.error as error:
        raise SchemaError(f"pattern {pattern!r}: {error}", keyword="patternProperties", pointer=pointer) from None


@lru_cache(maxsize=4096)
def _search_term(pattern: str) -> rx.Rx:
    from fsm.rx_parse import parse

    branches = [_anchored(b) for b in _top_level_branches(pattern.replace("\\/", "/"))]
    return rx.alt(*(rx.seq(ANY_TEXT if not start else rx.EPSILON, parse(body), ANY_TEXT if not end else rx.EPSILON)
                    for body, start, end in branches))


def _anchored(branch: str) -> tuple[str, bool, bool]:
    """(body, anchored at the start, anchored at the end)."""
    start = branch.startswith("^")
    body = branch[1:] if start else branch
    end = body.endswith("$") and not _escaped(body, len(body) - 1)
    return (body[:-1] if end else body), start, end


def _top_level_branches(pattern: str) -> list[str]:
    branches, depth, in_class, start, i = [], 0, False, 0, 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "|" and depth == 0:
            branches.append(pattern[start:i])
            start = i + 1
        i += 1
    return branches + [pattern[start:]]


def _escaped(text: str, index: int) -> bool:
    backslashes = len(text[:index]) - len(text[:index].rstrip("\\"))
    return backslashes % 2 == 1

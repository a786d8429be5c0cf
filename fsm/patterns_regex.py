"""JSON Schema `pattern` (ECMA-262, search semantics) -> a full-match regex over the string content."""

from __future__ import annotations

import re

import interegular

from fsm.errors import RegexError, SchemaError


def pattern_content(pattern, pointer: str) -> str:
    """Full-match regex for the string contents that `pattern` finds a match in.

    Raises
    ------
    SchemaError
        When the pattern is not a string, is invalid, or uses what a finite automaton cannot do.
    """
    if not isinstance(pattern, str):
        raise SchemaError(f"must be a string, not {pattern!r}", keyword="pattern", pointer=pointer)
    body = _ecma_to_python(pattern)
    content = "|".join(f"(?:{_anchor(branch)})" for branch in _top_level_branches(body))
    _check(content, pattern, pointer)
    return content


def pattern_min_length(regex: str) -> int:
    """Fewest characters any match of `regex` has."""
    return interegular.parse_pattern(regex).lengths[0]


def _ecma_to_python(pattern: str) -> str:
    pattern = re.sub(r"\(\?<(?![=!])", "(?P<", pattern)  # named groups
    return pattern.replace("\\/", "/")


def _anchor(branch: str) -> str:
    """Search semantics: an unanchored side may have anything before/after it."""
    start = branch[1:] if branch.startswith("^") else ".*" + branch
    ends_anchored = start.endswith("$") and not _escaped(start, len(start) - 1)
    return start[:-1] if ends_anchored else start + ".*"


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


def _check(content: str, pattern: str, pointer: str) -> None:
    from fsm.regex import _reject_unsound_lookarounds, _reason

    try:
        re.compile(content)
        _reject_unsound_lookarounds(interegular.parse_pattern(content), pattern)
    except RegexError as error:
        raise SchemaError(f"pattern {pattern!r}: {error}", keyword="pattern", pointer=pointer) from None
    except Exception as error:
        raise SchemaError(f"pattern {pattern!r} is not supported: {_reason(error)}", keyword="pattern", pointer=pointer) from None

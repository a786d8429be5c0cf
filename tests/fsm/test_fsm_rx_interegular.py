"""fsm/rx.py against two independent oracles: interegular's FSM (the design card's regex library) and
Python's `re`, on random regexes (ASCII, the syntax all three read the same way) and random strings."""

from __future__ import annotations

import re

import interegular
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fsm import rx
from fsm.rx_parse import parse

TEXT = "abc-\n"
leaves = st.sampled_from(["a", "b", "c", "\\-", ".", "[ab]", "[^a]", "[a-c]", "[^\\n]", "(?:)"])


def _extend(inner):
    return st.one_of(
        st.tuples(inner, inner).map("".join),
        st.tuples(inner, inner).map(lambda t: f"(?:{t[0]}|{t[1]})"),
        inner.map(lambda p: f"(?:{p})*"),
        inner.map(lambda p: f"(?:{p})+"),
        inner.map(lambda p: f"(?:{p})?"),
        st.tuples(inner, st.integers(0, 2), st.integers(0, 2)).map(
            lambda t: f"(?:{t[0]}){{{min(t[1:])},{max(t[1:])}}}"
        ),
    )


patterns = st.recursive(leaves, _extend, max_leaves=8)
texts = st.lists(st.text(alphabet=TEXT, max_size=6), min_size=8, max_size=8)


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(pattern=patterns, samples=texts)
def test_rx_agrees_with_interegular_and_re(pattern, samples):
    term, theirs, python = parse(pattern), interegular.parse_pattern(pattern).to_fsm(), re.compile(pattern)
    for text in samples + _walk(theirs):
        expected = python.fullmatch(text) is not None
        assert theirs.accepts(text) == expected, f"the oracles disagree on {pattern!r} {text!r}"
        assert rx.matches(term, text) == expected, f"{pattern!r} on {text!r}: re says {expected}"


def _walk(fsm, limit: int = 6) -> list[str]:
    """A few strings interegular's FSM accepts (members are where a wrong term is most likely to reject)."""
    found = []
    for text in fsm.strings():
        found.append("".join(c if isinstance(c, str) else "a" for c in text))
        if len(found) >= limit:
            break
    return found

"""Regex -> byte DFA: agreement with Python's `re` on generated and random text, and clear errors."""

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fsm import RegexError, compile_regex

PATTERNS = [
    r"[a-c]+x*",
    r"(ab|cd){2,4}e?",
    r"[0-9]{3}-[0-9]{2}",
    r"[^a]*b",
    r"é+|ü{2}",
    r"(?:😀|[α-ω])+",
    r"[\u4e00-\u4e0f]{1,3}",
    r'(?=[a-z]{2,4}".*)[a-c]+x*"',  # positive lookahead = intersection
    r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?",
    r"\.|\\|\"",
    r"(?!ab)[a-c]{2}x?",  # negative lookahead = intersection with a complement
]


@pytest.mark.parametrize("pattern", [p for p in PATTERNS if "(?=" not in p and "(?!" not in p])  # no lookaheads
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_accepts_what_re_fullmatches(pattern, data):
    dfa = compile_regex(pattern)
    text = data.draw(st.from_regex(pattern, fullmatch=True))
    assert dfa.fullmatch(text.encode()) == bool(re.fullmatch(pattern, text))


@pytest.mark.parametrize("pattern", PATTERNS)
@settings(max_examples=60, deadline=None)
@given(text=st.text(alphabet='abcdex-.0123456789éüα😀\\"丁', max_size=8))
def test_agrees_with_re_on_random_text(pattern, text):
    dfa = compile_regex(pattern)
    assert dfa.fullmatch(text.encode()) == bool(re.fullmatch(pattern, text))


def test_character_classes_are_ascii_as_in_json_schema():
    dfa = compile_regex(r"\d\w")
    assert dfa.fullmatch(b"1a") and not dfa.fullmatch("٠a".encode())


def test_tokens_may_end_inside_a_character():
    dfa = compile_regex("é|è")
    half = dfa.walk(b"\xc3")  # first byte of both characters
    assert half >= 0 and not dfa.accepting[half]
    assert dfa.fullmatch("é".encode()) and not dfa.fullmatch(b"\xc3")


def test_never_accepts_invalid_utf8():
    dfa = compile_regex("[^a]*")
    assert dfa.fullmatch("bé😀".encode())
    for bad in (b"\xed\xa0\x80", b"\xc0\xaf", b"\xff", b"\x80"):  # surrogate, overlong, junk
        assert not dfa.fullmatch(bad)


def test_outer_anchors_are_redundant():
    assert compile_regex("^ab$").fullmatch(b"ab")


def test_an_empty_language_is_an_error():
    with pytest.raises(RegexError, match="matches no string"):
        compile_regex(r"(?=a)b")


def test_states_are_discovered_lazily():
    dfa = compile_regex(r"[0-9]{3}-[a-z]{2}(?:)")  # a pattern no other test compiles
    assert dfa.n_states == 1  # only the root until something is walked
    assert dfa.walk(b"12") >= 0 and dfa.n_states <= 4
    assert dfa.explore_all().n_states == 7 and dfa.fullmatch(b"123-ab")


@pytest.mark.parametrize(
    "pattern, reason",
    [
        (r"(?<=a)b", "lookbehind"),
        (r"((?!a)b)*", "repetition"),
        (r"(a)\1", "backreference"),
        (r"a^b", "anchor"),
        (r"a$b", "anchor"),
        (r"\bfoo", r"\b"),
        (r"[a-", "invalid regex"),
        (r"a{3,1}", "invalid regex"),
    ],
)
def test_unsupported_constructs_raise_regex_error(pattern, reason):
    with pytest.raises(RegexError, match=re.escape(reason)):
        compile_regex(pattern)


def test_regex_error_is_a_value_error():
    assert issubclass(RegexError, ValueError)

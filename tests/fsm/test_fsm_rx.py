"""rx terms and the regex parser: agreement with Python's `re` on generated patterns, algebraic laws.

Patterns are drawn as pairs (ours, Python's): the same regex, except that categories are spelled out
for Python as the classes our dialect gives them (\\d, \\w ASCII; \\s ECMA-262 whitespace).
"""

from __future__ import annotations

import re
from collections import deque

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from fsm import rx, utf8
from fsm.errors import RegexError
from fsm.lazy_dfa import DEAD, LazyDFA
from fsm.rx_parse import parse

ALPHABET = "abcAB-.é\u00c9ßẞkK\u212aſs😀0 \n\u00a0"
SPACE = r"[\t-\r \xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]"
CATEGORIES = {r"\d": "[0-9]", r"\D": "[^0-9]", r"\w": "[A-Za-z0-9_]", r"\W": "[^A-Za-z0-9_]",
              r"\s": SPACE, r"\S": "[^" + SPACE[1:]}
FAST = settings(
    max_examples=int(__import__("os").environ.get("RX_EXAMPLES", 120)),
    deadline=None,
    suppress_health_check=list(HealthCheck),
)


def _same(text: str) -> tuple[str, str]:
    return text, text


chars = st.sampled_from(ALPHABET).map(lambda c: _same(re.escape(c)))
ranges = st.sampled_from(["a-c", "A-Z", "é-ü", "0-9", "\\-", "ß", "😀-🙏", "k", "\\n"])
classes = st.tuples(st.booleans(), st.lists(ranges, min_size=1, max_size=3)).map(
    lambda t: _same("[" + "^" * t[0] + "".join(t[1]) + "]"))
categories = st.sampled_from(sorted(CATEGORIES)).map(lambda c: (c, CATEGORIES[c]))
leaves = st.one_of(chars, classes, categories, st.just(_same(".")), st.just(_same("")))


def _join(parts, sep=""):
    return sep.join(p[0] for p in parts), sep.join(p[1] for p in parts)


def _wrap(part, before, after):
    return before + part[0] + after, before + part[1] + after


def _repeat(part, suffix):
    return _wrap(part, "(?:", ")" + suffix)


suffixes = st.sampled_from(["*", "+", "?", "{2}", "{0,2}", "{1,}", "*?", "{1,3}?"])


def _extend(inner):
    return st.one_of(
        st.lists(inner, min_size=2, max_size=3).map(_join),
        st.lists(inner, min_size=2, max_size=3).map(lambda ps: _wrap(_join(ps, "|"), "(?:", ")")),
        st.tuples(inner, suffixes).map(lambda t: _repeat(*t)),
        inner.map(lambda p: _wrap(p, "(?i:", ")")),
    )


plain_patterns = st.recursive(leaves, _extend, max_leaves=6)
lookaheads = st.tuples(st.sampled_from(["(?=", "(?!"]), plain_patterns).map(lambda t: _wrap(t[1], t[0], ".*)"))
bounded = st.sampled_from(["?", "{2}", "{0,2}", "{1,2}?"])
looping = st.tuples(lookaheads, plain_patterns, bounded).map(lambda t: _repeat(_join(t[:2]), t[2]))  # unrolled
patterns = st.lists(st.one_of(plain_patterns, lookaheads, looping), min_size=1, max_size=3).map(_join)
texts = st.text(alphabet=ALPHABET, max_size=6)


def _agree(ours: str, python: str, text: str) -> None:
    assert rx.matches(parse(ours), text) == bool(re.fullmatch(python, text)), (ours, text)


@FAST
@given(pattern=patterns, text=texts)
def test_parse_agrees_with_re_on_random_text(pattern, text):
    _agree(*pattern, text)


@FAST
@given(pattern=plain_patterns, data=st.data())
def test_parse_accepts_what_re_fullmatches(pattern, data):
    text = data.draw(st.from_regex(pattern[1], fullmatch=True))
    assume(not any(0xD800 <= ord(c) <= 0xDFFF for c in text))  # not encodable as UTF-8
    _agree(*pattern, text)


@FAST
@given(p=patterns, q=patterns, text=texts)
def test_intersection_union_complement_laws(p, q, text):
    a, b, data = parse(p[0]), parse(q[0]), text.encode()
    in_a, in_b = rx.matches(a, data), rx.matches(b, data)
    assert rx.matches(rx.inter(a, b), data) == (in_a and in_b)
    assert rx.matches(rx.alt(a, b), data) == (in_a or in_b)
    assert rx.matches(rx.complement(a), data) != in_a
    assert rx.matches(rx.complement(rx.alt(a, b)), data) == rx.matches(
        rx.inter(rx.complement(a), rx.complement(b)), data
    )


def _witness(term: rx.Rx, limit: int = 5000) -> bytes | None:
    """A shortest byte string in `term` (breadth-first over derivatives), None if there is none."""
    seen, queue = {term.id}, deque([(term, b"")])
    while queue and len(seen) < limit:
        t, path = queue.popleft()
        if t.nullable:
            return path
        for mask in t.classes:
            byte = rx.lowest_byte(mask)
            d = rx.derivative(t, byte)
            if d.id not in seen and d is not rx.NOTHING:
                seen.add(d.id)
                queue.append((d, path + bytes([byte])))
    return None


@FAST
@given(p=patterns, q=patterns, text=texts)
def test_is_empty_is_exact(p, q, text):
    both = rx.inter(parse(p[0]), parse(q[0]))
    assert rx.is_empty(rx.inter(both, rx.complement(both)))
    if rx.is_empty(both):  # no string is in both
        assert not (re.fullmatch(p[1], text) and re.fullmatch(q[1], text))
    else:  # a witness exists and Python agrees that it is in both
        found = _witness(both).decode("utf-8")
        assert re.fullmatch(p[1], found) and re.fullmatch(q[1], found)


@FAST
@given(pattern=patterns, text=texts)
def test_derivative_classes_group_bytes_with_equal_derivatives(pattern, text):
    term = parse(pattern[0])
    for byte in text.encode()[:3]:
        for mask in term.classes:
            first = rx._derive(term, rx.lowest_byte(mask))
            assert all(rx._derive(term, b) is first for b in range(256) if mask >> b & 1)
        term = rx.derivative(term, byte)


@FAST
@given(pattern=patterns, text=texts, cut=st.integers(0, 6))
def test_lazy_dfa_agrees_with_derivatives(pattern, text, cut):
    term, data = parse(pattern[0]), text.encode()
    dfa = LazyDFA(term)
    assert dfa.fullmatch(data) == rx.matches(term, data)
    state = dfa.walk(data[:cut])  # a vectorized step from there agrees with one byte at a time
    if state != DEAD and data[cut:]:
        rest = np.frombuffer(data[cut:], dtype=np.uint8)
        stepped = dfa.step(np.full(len(rest), state, dtype=np.int32), rest)
        assert stepped.tolist() == [dfa.walk(bytes([b]), state) for b in rest]
    if state != DEAD and data[:cut]:  # a state reached by some bytes can still reach acceptance
        assert not rx.is_empty(dfa.term(state))


@FAST
@given(pattern=patterns, text=texts)
def test_a_fresh_dfa_steps_to_the_derivatives(pattern, text):
    """`step` on a DFA whose rows are not filled yet (cells filled as the bytes need them) reaches the
    derivative of each byte, or DEAD where that is empty."""
    term, data = parse(pattern[0]), np.frombuffer(text.encode() or b"a", dtype=np.uint8)
    dfa = LazyDFA(term)
    stepped = dfa.step(np.zeros(len(data), dtype=np.int32), data)
    for byte, state in zip(data.tolist(), stepped.tolist()):
        after = rx.derivative(term, byte)
        assert (state == DEAD) == rx.is_empty(after) and (state == DEAD or dfa.term(state) is after)


def test_a_step_derives_only_the_blocks_its_bytes_need():
    """Through a state with a block per first letter, a step on two letters derives two blocks; `row`
    then derives the rest (work counted)."""
    words = [rx.literal(chr(c) + "xyz") for c in range(ord("a"), ord("z") + 1)]
    root = rx.alt(*words)
    dfa = LazyDFA(root)
    dfa.step(np.zeros(3, dtype=np.int32), np.frombuffer(b"aab", dtype=np.uint8))
    assert len(root._derivatives) == 2 and (dfa.transitions[0] != DEAD).sum() == 2
    assert (dfa.row(0) != DEAD).sum() == 26 and len(root._derivatives) == len(root.classes)


def test_a_step_on_many_bytes_of_a_row_derives_only_their_blocks():
    """A step on 12 of 26 first letters, each twice (a column walk's many cells of one row), derives those 12
    blocks, not the row, and reaches each letter's derivative."""
    words = [rx.literal(chr(c) + "xyz") for c in range(ord("a"), ord("z") + 1)]
    root = rx.alt(*words)
    dfa = LazyDFA(root)
    data = np.frombuffer(b"abcdefghijkl" * 2, dtype=np.uint8)
    stepped = dfa.step(np.zeros(len(data), dtype=np.int32), data)
    assert len(root._derivatives) == 12 and (dfa.transitions[0] != DEAD).sum() == 12 and not dfa._filled[0]
    assert [dfa.term(s) for s in stepped.tolist()] == [rx.derivative(root, b) for b in data.tolist()]


def test_terms_are_interned():
    assert parse("(?:ab|cd)+") is parse("(ab|cd)+") is parse("(?:cd|ab)+")
    assert parse("[a-c]x") is rx.seq(rx.byte_range(97, 99), rx.literal("x"))
    assert parse("a|b") is parse("[ab]")


def test_unicode_escapes_and_surrogates():
    assert rx.matches(parse(r"\u00e9\U0001F600"), "é😀")
    assert parse(r"\ud800") is rx.NOTHING  # a lone surrogate is no UTF-8 character
    assert not rx.matches(utf8.ANY_CHAR, b"\xed\xa0\x80")


def test_case_folding_follows_python():
    for text in ("K", "k", "\u212a", "ſ", "S", "ß", "ẞ"):
        for pattern in ("(?i)k", "(?i)[k-s]", "(?i)[^s]", "(?i)ß", "(?ai)k"):
            assert rx.matches(parse(pattern), text) == bool(re.fullmatch(pattern, text)), (pattern, text)


def test_categories_are_the_json_schema_dialect():
    assert rx.matches(parse(r"\d\w\s"), "1a\u00a0")
    assert not rx.matches(parse(r"\d"), "٣") and not rx.matches(parse(r"\w"), "é")
    assert rx.matches(parse("."), "é") and not rx.matches(parse("."), "\n") and rx.matches(parse("(?s)."), "\n")


def test_lookaheads_inside_bounded_repeats_are_unrolled():
    for pattern in (r"(?:(?=[ab]{2})[a-c]{3})?", r"(?:(?!ab)[a-c]{2}){1,2}c?"):
        for text in ("", "abc", "acc", "bbb", "ac", "ab", "acac", "acab", "acabc", "bbbc"):
            assert rx.matches(parse(pattern), text) == bool(re.fullmatch(pattern, text)), (pattern, text)


def test_lookaheads_and_anchors_inside_lookaheads():
    term = parse(r"^(?=.*[A-Z])(?=.*\d)(?!.*--$)[A-Za-z0-9-]{4,}$")
    for text in ("Ab1-", "ab1-", "AB--1", "A1--", "A1-b"):
        assert rx.matches(term, text) == bool(re.fullmatch(r"(?=.*[A-Z])(?=.*\d)(?!.*--$)[A-Za-z0-9-]{4,}", text))


@pytest.mark.parametrize(
    "pattern, reason",
    [(r"(?<=a)b", "lookbehind"), (r"(a)\1", "backreference"), (r"a^b", "anchor"), (r"a$b", "anchor"),
     (r"\bfoo", r"\b"), (r"[a-", "invalid regex"), (r"((?=a)a)*", "repetition"), (r"(?>a)", "atomic"),
     (r"a*+", "possessive"), (r"(a)(?(1)b)", "conditional")],
)
def test_unsupported_constructs_name_the_construct(pattern, reason):
    with pytest.raises(RegexError, match=re.escape(reason)):
        parse(pattern)


def test_long_sequences_concatenate_without_recursion():
    """Regression (coverage run, Github_ultra o21764): seq of two 5,000-byte literals hit the recursion limit."""
    joined = rx.seq(rx.literal("x" * 5000), rx.literal("y" * 5000))
    assert rx.matches(joined, "x" * 5000 + "y" * 5000)
    assert not rx.matches(joined, "x" * 4999 + "y" * 5001)


def test_emptiness_of_a_long_sequence_asks_only_its_parts_that_are_not_plain(monkeypatch):
    """A plain part is never empty, so deciding a sequence asks only its other parts: a derivative of a chain of
    thousands of literal bytes around two intersections (a document around two `not`s) asks a few questions, not
    one per byte (counted)."""
    negated = lambda text: rx.inter(rx.literal(text), rx.complement(rx.literal("zz")))  # noqa: E731
    term = rx.seq(negated("ab"), rx.literal("x" * 2000), negated("cd"), rx.literal("y" * 2000))
    assert not rx.is_empty(term)
    later = rx.derivative(term, ord("a"))  # a new head before the same tail
    asked = []
    real = rx._decide
    monkeypatch.setattr(rx, "_decide", lambda t, limit: asked.append(t) or real(t, limit))
    assert not rx.is_empty(later) and not rx.is_empty(rx.seq(rx.literal("x"), later))
    assert len(asked) <= 6


def test_witness_proves_an_intersection_non_empty_without_a_search(monkeypatch):
    """`L ∩ ¬U` (how `not`, `oneOf` and `if` compile) is non-empty when the shortest string of L avoids U:
    one membership check instead of a search of the intersection's derivatives."""
    searches = []
    real = rx._search_empty
    monkeypatch.setattr(rx, "_search_empty", lambda term, limit: searches.append(term) or real(term, limit))
    video = rx.seq(rx.literal('{"type":"video","n":'), rx.repeat(rx.byte_range(0x30, 0x39), 1), rx.literal("}"))
    image = rx.seq(rx.ANYTHING, rx.literal('"image"'), rx.ANYTHING)
    term = rx.inter(video, rx.complement(image))
    assert rx.witness(term) == b'{"type":"video","n":0}'
    assert not rx.is_empty(term) and searches == []


@pytest.mark.parametrize("make, expected, empty", [
    (lambda: rx.inter(rx.star(rx.literal("ab")), rx.complement(rx.literal("ab"))), b"", False),
    (lambda: rx.inter(rx.repeat(rx.literal("ab"), 1), rx.complement(rx.literal("ab"))), None, False),  # needs a search
    (lambda: rx.inter(rx.literal("ab"), rx.literal("ac")), None, True),
    (lambda: rx.any_order_list([rx.literal("x"), rx.literal("yy")], [rx.literal("z")], rx.NOTHING, rx.literal(",")),
     b"x,yy", False),
    (lambda: rx.complement(rx.star(rx.byte_set(rx.ALL_BYTES))), None, True),
])
def test_witness_is_a_string_of_the_term_or_none(make, expected, empty):
    """A witness is found by structure and matches; None where only a search would tell (the term may be
    inhabited: `is_empty` searches)."""
    term = make()
    found = rx.witness(term)
    assert found == expected and rx.is_empty(term) == empty
    if expected is not None:
        assert rx.matches(term, found)


def test_an_empty_search_marks_every_term_it_explored_empty(monkeypatch):
    """A search that finds no string explored all the term reaches: each of those terms is then known
    empty, and deciding one of them again derives nothing (work counted)."""
    even_ab = rx.star(rx.literal("ab"))
    odd = rx.seq(rx.literal("a"), rx.star(rx.literal("ba")))  # odd lengths: never in even_ab
    term = rx.inter(rx.seq(even_ab, rx.literal("c")), rx.seq(odd, rx.literal("c")))
    assert rx.is_empty(term)
    later = rx.derivative(rx.derivative(term, ord("a")), ord("b"))
    derived = []
    real = rx._derive
    monkeypatch.setattr(rx, "_derive", lambda t, byte: derived.append(t) or real(t, byte))
    assert later is not rx.NOTHING  # a term the search explored, not one the constructors already folded
    assert rx.is_empty(later) and derived == []


@pytest.mark.parametrize("words", [["a"], ["", "ab"], ["name", "names", "n", "é"], ["xxxxx", "xy", "日本"]])
def test_without_words_is_the_plain_difference(words):
    """without_words(S, W) = S ∩ ¬W, and plain where S is: no emptiness search along an undeclared key."""
    from fsm import json_terms as jt

    text = rx.star(jt.PLAIN_CHAR)
    less = rx.without_words(text, words)
    expected = rx.inter(text, rx.complement(rx.alt(*(rx.literal(w) for w in words))))
    assert less.plain
    assert rx.is_empty(rx.inter(less, rx.complement(expected))) and rx.is_empty(rx.inter(expected, rx.complement(less)))
    for word in (*words, "nam", "namex", "日", "b"):
        assert rx.matches(less, word) == (word not in words)


def _only_bs_after(lead: str, n: int) -> rx.Rx:
    """`lead` then n letters of [ab] with no "a" (only "b" * n): the shortest string of the positive part
    ("a" * n) is excluded, so deciding it needs a search."""
    ab = rx.byte_set(1 << ord("a") | 1 << ord("b"))
    has_a = rx.seq(rx.literal(lead), rx.star(ab), rx.literal("a"), rx.star(ab))
    return rx.inter(rx.seq(rx.literal(lead), rx.repeat(ab, n, n)), rx.complement(has_a))


def test_an_undecided_emptiness_raises_or_gives_the_callers_answer_unmemoized(monkeypatch):
    term = _only_bs_after("q", 14)
    with pytest.raises(rx.UndecidedError, match="more than 3 states"):
        rx.is_empty(term, limit=3)
    assert issubclass(rx.UndecidedError, ValueError)
    searches, real = [], rx._search_empty
    monkeypatch.setattr(rx, "_search_empty", lambda t, limit: searches.append(t) or real(t, limit))
    assert rx.is_empty(term, limit=3, undecided=True) is True and searches == []  # given up at 3 once: not again
    assert rx.is_empty(term) is False and rx.matches(term, "q" + "b" * 14)  # nothing was memoized: decided now


def test_a_union_is_settled_by_a_live_alternative_before_another_is_proved_empty():
    """A union's alternatives are searched to limits that grow together: one found live a few dozen states deep
    settles it while an empty one that needs thousands is left undecided (searched one after the other, the empty
    one came first and was explored in full)."""
    ab = rx.alt(rx.literal("a"), rx.literal("b"))
    window = lambda c: rx.seq(rx.star(ab), rx.literal(c), rx.repeat(ab, 11, 11))  # noqa: E731
    empty = rx.inter(window("a"), window("b"))  # the 12th byte from the end both "a" and "b": 2^12 states to see
    live = rx.inter(rx.repeat(rx.literal("a"), 41), rx.star(rx.literal("aa")))  # a^42, 42 states deep
    union = rx.alt(empty, live)
    assert union.args == (empty, live) and rx.witness(live) is None  # the empty one first; the live one needs a search
    assert rx.is_empty(union) is False and empty._empty is None
    assert rx.is_empty(empty) is True


def test_a_walk_forbids_what_it_cannot_decide_and_never_raises(monkeypatch):
    """A first visit whose emptiness search goes past `rx.WALK_LIMIT` makes the derivative DEAD: the guide's
    language narrows ("d" + "b" * 12 is lost), it never admits an invalid text and never raises mid-walk."""
    from tests.helpers_models import tiny_tokenizer

    monkeypatch.setattr(rx, "WALK_LIMIT", 3)
    # "cc", or "d" then twelve b's: the root is proved non-empty by its witness "cc" before any walk
    root = rx.alt(rx.literal("cc"), _only_bs_after("d", 12))
    assert not rx.is_empty(root)
    dfa = LazyDFA(root)
    assert dfa.walk(b"d") == DEAD and dfa.fullmatch(b"cc")
    import fsm

    tokenizer = tiny_tokenizer()
    guide = fsm.Guide.from_rx(root, tokenizer)
    allowed = {tokenizer.convert_ids_to_tokens(int(i)) for i in np.flatnonzero(guide.mask())}
    assert allowed == {"c"}  # "cd" and "d" would lead into the undecided state
    with pytest.raises(fsm.InvalidTokenError):
        guide.copy().advance(tokenizer.convert_tokens_to_ids("d"))
    for token in tokenizer.encode("cc", add_special_tokens=False):
        guide.advance(token)
    assert guide.is_final()

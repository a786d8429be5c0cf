"""Bounded strings (fsm.bounded_strings): the per-token count of string characters is what `minLength` and
`maxLength` count, guides that mask a bounded string from its unbounded twin give bitwise the masks and next states
of guides that walk every count (the reference, BOUNDED_STRINGS off), and a string's counts cost one vocabulary walk,
not one each."""

from __future__ import annotations

import json

import numpy as np
import pytest

import fsm
from fsm import index as ix
from fsm import json_terms as jt
from fsm import bounded_strings, rx
from fsm.bounded_strings import BoundedStringInfo, closing_quotes, string_chars, unbounded_twin
from fsm.caches import clear_caches
from fsm.lazy_dfa import DEAD, LazyDFA
from fsm.vocabulary import Vocabulary, vocabulary_from_tokenizer

ANY_BYTES = rx.star(rx.byte_range(0, 255))
SCHEMAS = (
    ({"type": "object", "properties": {"a": {"type": "string", "maxLength": 40}, "b": {"type": "integer"}},
      "required": ["a", "b"]},
     {"a": 'Baltic "Office" \\ Supply é 🙂 \u00e9\n\t x', "b": 1}),
    ({"type": "object", "properties": {"n": {"type": ["string", "null"], "minLength": 3, "maxLength": 12},
                                       "d": {"type": "string", "pattern": "^[0-9]{4}$"},
                                       "l": {"type": "array", "items": {"type": "string", "maxLength": 5}}},
      "required": ["n", "d", "l"]},
     {"n": "naïve café", "d": "2024", "l": ["ab", "🙂🙂", "xyzzy", ""]}),
    ({"type": "string", "maxLength": 30}, "a \"quoted\" \\u escape-like text"),
    ({"type": "object", "properties": {"s": {"type": "string", "minLength": 12},
                                       "t": {"type": "array", "items": {"type": "string", "minLength": 2}}},
      "required": ["s", "t"]},
     {"s": 'naïve "café" \\ 🙂 x', "t": ["ab", "🙂🙂", "xyz"]}),
)


@pytest.fixture
def tokenizer(sentencepiece_tokenizer):
    """A vocabulary that spells every byte (token liveness is trivial: where the twin's mask is used)."""
    return sentencepiece_tokenizer


def test_string_chars_counts_code_points_escapes_and_pairs():
    words = (b"abc", b'ab"cd', b'\\"x', b"\\u00e9", b"\\ud83d\\ude00", b"\\ud83d", b"\xc3\xa9", b"\xc3", b'"',
             b"\\", b"\\u", b"\xf0\x9f\x99\x82a", b'\\\\"x', b"x\\n\\t", b"")
    got = string_chars(Vocabulary(words, ())).tolist()
    assert got == [3, 2, 2, 1, 1, 1, 1, 1, 0, 1, 1, 2, 1, 3, 0]
    closes = closing_quotes(Vocabulary(words, ())).tolist()
    assert closes == [False, True, False, False, False, False, False, False, True, False, False, False, True, False,
                      False]


def test_string_chars_is_the_fewest_characters_a_token_needs(smol_tokenizer):
    """Against the DFA itself: a token allowed inside a string of k characters left (then a quote, then anything)
    first fits at k = its string_chars."""
    vocabulary = vocabulary_from_tokenizer(smol_tokenizer)
    layout = vocabulary.walk_layout
    fits_at = np.full(len(layout.order), -1)  # (n_tokens,) over order
    for k in range(layout.max_length + 1):
        dfa = LazyDFA(rx.seq(rx.repeat(jt.STRING_CHAR, 0, k), jt.QUOTE, ANY_BYTES))
        fits = ix._walk_rows(dfa, layout, 0, stays=[])[0] != DEAD
        fits_at[(fits_at < 0) & fits] = k
    counted = string_chars(vocabulary)[layout.order]
    inside = fits_at >= 0
    assert inside.sum() > 40_000 and np.array_equal(counted[inside], fits_at[inside])


def test_closing_quotes_are_the_tokens_that_leave_the_string(smol_tokenizer):
    """Against the DFA itself: among the tokens allowed inside a string (then a quote, then anything), those that close
    it are those that die where a control byte must follow the string's characters instead of the quote."""
    vocabulary = vocabulary_from_tokenizer(smol_tokenizer)
    layout = vocabulary.walk_layout
    inside = ix._walk_rows(LazyDFA(rx.seq(rx.star(jt.STRING_CHAR), jt.QUOTE, ANY_BYTES)), layout, 0, stays=[])[0]
    open_ = ix._walk_rows(LazyDFA(rx.seq(rx.star(jt.STRING_CHAR), rx.literal("\x01"))), layout, 0, stays=[])[0]
    allowed = inside != DEAD
    closes = closing_quotes(vocabulary)[layout.order]
    assert closes[allowed].sum() > 100 and np.array_equal(closes[allowed], open_[allowed] == DEAD)


def test_the_twin_lifts_only_the_bounds():
    tail = rx.seq(jt.QUOTE, rx.literal(","))
    twin = rx.seq(rx.star(jt.STRING_CHAR), tail)
    assert unbounded_twin(rx.seq(rx.repeat(jt.STRING_CHAR, 2, 9), tail)) == (twin, 2, 9)
    assert unbounded_twin(rx.seq(rx.repeat(jt.STRING_CHAR, 0, 9), tail)) == (twin, 0, 9)
    assert unbounded_twin(rx.seq(rx.repeat(jt.STRING_CHAR, 3, None), tail)) == (twin, 3, None)
    assert unbounded_twin(twin) is None  # unbounded already
    assert unbounded_twin(rx.seq(rx.repeat(jt.PLAIN_CHAR, 0, 9), tail)) is None  # not a JSON string
    assert unbounded_twin(rx.seq(rx.repeat(jt.STRING_CHAR, 0, 9), rx.literal(","))) is None  # no closing quote


def _walk(schema, instance, tokenizer, slack: int | None = None) -> tuple[list[bytes], int]:
    """(packed masks along the instance's tokens, bounded-string states met); `slack`: within that many tokens more
    than the instance's."""
    text = json.dumps(instance, separators=(",", ":"), ensure_ascii=False)
    tokens = vocabulary_from_tokenizer(tokenizer).encode(text)
    left = None if slack is None else len(tokens) + slack
    guide = fsm.Guide.from_schema(schema, tokenizer, policy="compact").within(left)
    masks, bounded = [], 0
    for token in tokens:
        info = guide.index.info(guide.state)
        bounded += isinstance(info, BoundedStringInfo)
        masks.append(np.packbits(guide.mask().numpy()).tobytes())
        guide.advance(token)
    masks.append(np.packbits(guide.mask().numpy()).tobytes())
    return masks, bounded


@pytest.mark.parametrize("case", range(len(SCHEMAS)))
@pytest.mark.parametrize("slack", [None, 1])
def test_bounded_strings_give_the_walked_masks(tokenizer, monkeypatch, case, slack):
    """Plain masks, and masks that close within a token budget (`fsm.closing`, which reads every successor)."""
    schema, instance = SCHEMAS[case]
    out = []
    for on in (False, True):
        monkeypatch.setattr(ix, "BOUNDED_STRINGS", on)
        clear_caches()
        out.append(_walk(schema, instance, tokenizer, slack))
    (reference, none), (masks, bounded) = out
    assert masks == reference and none == 0 and bounded >= 3


def test_bounded_string_successors_are_the_walked_ones(tokenizer):
    clear_caches()
    guide = fsm.Guide.from_schema(SCHEMAS[0][0], tokenizer)
    for token in vocabulary_from_tokenizer(tokenizer).encode('{"a":"Bal'):
        guide.advance(token)
    index, state = guide.index, guide.state
    info = index.info(state)
    assert isinstance(info, BoundedStringInfo)
    ids, nexts = ix._walk_all_tokens(index.dfa, index.vocabulary, state)
    order = np.argsort(ids)
    assert np.array_equal(info.token_ids, ids[order]) and np.array_equal(info.next_states, nexts[order])
    assert [info.next_of(t) for t in ids[order][::97].tolist()] == nexts[order][::97].tolist()
    assert info.next_of(int(np.flatnonzero(~info.mask.numpy())[0])) == DEAD


def test_a_bounded_string_costs_one_walk_per_tail_not_per_count(tokenizer, monkeypatch):
    schema, instance = SCHEMAS[0]
    walks = []
    for on in (False, True):
        monkeypatch.setattr(ix, "BOUNDED_STRINGS", on)
        clear_caches()
        count = [0]
        walk = ix._walk_all_tokens

        def counted(*args, walk=walk, count=count):
            count[0] += 1
            return walk(*args)

        monkeypatch.setattr(ix, "_walk_all_tokens", counted)
        _walk(schema, instance, tokenizer)
        monkeypatch.setattr(ix, "_walk_all_tokens", walk)
        walks.append(count[0])
    assert walks[1] + 10 <= walks[0], walks


@pytest.mark.parametrize("case, count", [(1, 0), (3, 99)])
def test_the_differential_sees_a_wrong_count(tokenizer, monkeypatch, case, count):
    """Negative control: counting every token's characters as none lets the twin's longer tokens through a
    `maxLength`, as too many (99) lets its closing tokens through a `minLength`, and the masks differ."""
    schema, instance = SCHEMAS[case]
    monkeypatch.setattr(ix, "BOUNDED_STRINGS", False)
    clear_caches()
    reference = _walk(schema, instance, tokenizer)[0]
    monkeypatch.setattr(ix, "BOUNDED_STRINGS", True)

    def wrong(vocabulary):
        return np.full(vocabulary.vocab_size, count, np.int32)

    monkeypatch.setattr(bounded_strings, "string_chars", wrong)
    clear_caches()
    assert _walk(schema, instance, tokenizer)[0] != reference

"""Spelling bytes in a tokenizer's tokens (`drafting.respell`): the tokenizer's own tokenization where it spells the
bytes back, a longest match elsewhere, and the settled tokens that more text cannot change."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import fsm
from drafting.respell import char_start, common_prefix, speller, whole_chars

TEXTS = ["Maria Lopez, 36", '{"name":"Ada","age":36}', "  two  spaces\nand a line", "añós é 中文 🙂", "x"]


@pytest.fixture(params=["smollm2", "sentencepiece"])
def tokenizer(request, smol_tokenizer, sentencepiece_tokenizer):
    return smol_tokenizer if request.param == "smollm2" else sentencepiece_tokenizer


def spelled(tokenizer, ids) -> bytes:
    return b"".join(fsm.vocabulary_from_tokenizer(tokenizer).token_bytes[i] for i in ids)


@pytest.mark.parametrize("text", TEXTS)
def test_a_spelling_is_the_tokenizers_own_and_spells_the_bytes(tokenizer, text):
    spelling = speller(fsm.vocabulary_from_tokenizer(tokenizer)).spell(text.encode())
    assert spelled(tokenizer, spelling.ids) == text.encode()
    own = fsm.vocabulary_from_tokenizer(tokenizer).encode(text)  # the canonical ids, dummy-prefix space defeated
    assert list(spelling.ids) == own
    assert 0 <= spelling.settled < len(spelling.ids)


def test_sentencepiece_text_gets_no_dummy_prefix_space(sentencepiece_tokenizer):
    """`{` alone is "{", not "▁{": the spelling of a continuation must not insert a space."""
    spelling = speller(fsm.vocabulary_from_tokenizer(sentencepiece_tokenizer)).spell(b'{"a"')
    assert spelled(sentencepiece_tokenizer, spelling.ids) == b'{"a"'


def test_settled_tokens_stay_when_the_text_goes_on(smol_tokenizer):
    """Every settled token of a prefix is a token of the longer text's spelling, at the same place; the last word is
    not (" intern" may become " international")."""
    spell = speller(fsm.vocabulary_from_tokenizer(smol_tokenizer)).spell
    whole = "the international committee met in Lisbon"
    for cut in range(1, len(whole)):
        prefix = spell(whole[:cut].encode())
        assert prefix.ids[:prefix.settled] == spell(whole.encode()).ids[:prefix.settled], whole[:cut]
    assert spell(b"the intern").settled == 1  # " intern" is held back


def test_settled_falls_back_to_spaces_where_the_pre_tokenizer_splits_nothing(sentencepiece_tokenizer):
    spelling = speller(fsm.vocabulary_from_tokenizer(sentencepiece_tokenizer)).spell(b"hello big world")
    words = [spelled(sentencepiece_tokenizer, [i]) for i in spelling.ids]
    assert b"".join(words[spelling.settled:]) == b" world"


def test_bytes_that_are_not_text_get_a_longest_match_spelling(smol_tokenizer, sentencepiece_tokenizer):
    for tokenizer in (smol_tokenizer, sentencepiece_tokenizer):  # byte-level pieces, <0xNN> byte fallback
        data = "中".encode()[1:] + b"ab"  # starts inside a character
        spelling = speller(fsm.vocabulary_from_tokenizer(tokenizer)).spell(data)
        assert spelled(tokenizer, spelling.ids) == data and spelling.settled == len(spelling.ids) - 1


def test_a_byte_no_token_spells_gives_none():
    from tests.helpers_models import tiny_tokenizer

    assert speller(fsm.vocabulary_from_tokenizer(tiny_tokenizer())).spell(b"abz") is None
    assert speller(fsm.vocabulary_from_tokenizer(tiny_tokenizer())).spell(b"abba").ids  # "ab" "ba"


@given(st.text(max_size=12), st.integers(0, 40))
def test_whole_chars_and_char_start(text, cut):
    data = text.encode()[:cut]
    whole = whole_chars(data)
    data[:whole].decode("utf-8")  # whole characters
    assert len(data) - whole < 4 and (whole == len(data) or data[whole] >= 0xC0)
    for end in range(len(data) + 1):
        start = char_start(data, end)
        assert start <= end and (start == len(data) or start == 0 or not 0x80 <= data[start] < 0xC0)


@given(st.lists(st.integers(0, 3), max_size=20), st.lists(st.integers(0, 3), max_size=20))
def test_common_prefix(a, b):
    n = common_prefix(a, b)
    assert a[:n] == b[:n] and (n == min(len(a), len(b)) or a[n] != b[n])
    assert common_prefix(bytes(a), bytearray(b)) == n


def test_qwen_spellings_are_canonical_and_settle_digit_by_digit():
    """Qwen2.5's pre-tokenizer splits digits one by one: a number's digits settle as soon as the next one is written."""
    from assisted.models.sources import tokenizer_dir

    folder = tokenizer_dir("qwen2.5-coder-0.5b")
    if not folder.is_dir():
        pytest.skip("needs the Qwen2.5 tokenizer (structspec prepare qwen2.5-coder-0.5b); CI has none")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    vocabulary = fsm.vocabulary_from_tokenizer(tokenizer)
    for text in [*TEXTS, '{"year":2026,"name":"Ada Lovelace"}']:
        spelling = speller(vocabulary).spell(text.encode())
        assert list(spelling.ids) == vocabulary.encode(text)
    assert speller(vocabulary).spell(b'{"year":20').settled == 4  # '{"', 'year', '":', '2' settled; '0' waits

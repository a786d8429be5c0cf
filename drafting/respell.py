"""Text between two vocabularies: a byte string spelled in one tokenizer's tokens, the way that tokenizer spells text.

A foreign assistant's draft is text (docs/design.md, "A draft from another tokenizer is text"): its bytes are spelled
in the target's tokens to be verified, and the target's committed bytes are spelled in the assistant's tokens to be
fed to it. A spelling is the tokenizer's own (canonical) tokenization where its tokens spell the bytes back exactly
(SentencePiece's dummy-prefix space defeated by a leading newline, as `fsm.Vocabulary.encode` does), else a
longest-match spelling (bytes that are not UTF-8 text, a normalizer that changes them).

Text that goes on may respell its last word (" intern" + "ational" is one token " international"), so a spelling
also says how many of its leading tokens are *settled*: those before the last pre-token (word) of the tokenizer's
pre-tokenizer, or, where that splits nothing (SentencePiece), before the last token that starts with a space, else
all but the last token.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import fsm


@dataclass(frozen=True)
class Spelling:
    """Token ids spelling a byte string exactly, and how many leading ones more text cannot change."""

    ids: tuple[int, ...]
    settled: int  # ids[:settled] stay whatever follows the text


class Speller:
    """Spells byte strings in the tokens of `vocabulary`'s tokenizer (one per vocabulary: `speller`)."""

    def __init__(self, vocabulary: fsm.Vocabulary):
        self.vocabulary, self.tokenizer, self.token_bytes = vocabulary, vocabulary.tokenizer, vocabulary.token_bytes
        self.backend = getattr(self.tokenizer, "backend_tokenizer", None)  # fast tokenizers: ids and words at once

    def spell(self, data: bytes) -> Spelling | None:
        """`data` in this tokenizer's tokens (None when no token sequence spells it, e.g. a byte without a token)."""
        return self._canonical(data) or self._longest_match(data)

    def _canonical(self, data: bytes) -> Spelling | None:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return None
        for prefix in ("", "\n"):  # "\n" defeats SentencePiece's dummy-prefix space
            ids, words = self._encode(prefix + text)
            start = _skip_prefix(ids, prefix.encode(), self.token_bytes)
            if start is not None and self._spells(ids[start:], data):
                return Spelling(tuple(ids[start:]), self._settled(ids[start:], words and words[start:]))
        return None

    def _encode(self, text: str) -> tuple[list[int], list[int | None] | None]:
        """(ids, the pre-token index of each id or None) of `text`, without special tokens."""
        if self.backend is None:
            return list(self.tokenizer.encode(text, add_special_tokens=False)), None
        encoding = self.backend.encode(text, add_special_tokens=False)
        return encoding.ids, encoding.word_ids

    def _spells(self, ids: list[int], data: bytes) -> bool:
        size = len(self.token_bytes)
        return all(i < size for i in ids) and b"".join(self.token_bytes[i] for i in ids) == data

    def _settled(self, ids: list[int], words: list[int | None] | None) -> int:
        """Leading ids before the last word: by the pre-tokenizer's words, else before the last space-led token."""
        if not ids:
            return 0
        if words and words[0] != words[-1]:
            return words.index(words[-1])
        spaced = [i for i, t in enumerate(ids) if self.token_bytes[t][:1] == b" "]
        return spaced[-1] if spaced and spaced[-1] > 0 else len(ids) - 1

    def _longest_match(self, data: bytes) -> Spelling | None:
        by_bytes, longest = self.vocabulary.ids_by_bytes, self.vocabulary.walk_layout.max_length
        ids, start = [], 0
        while start < len(data):
            end = next((e for e in range(min(len(data), start + longest), start, -1) if data[start:e] in by_bytes),
                       None)
            if end is None:
                return None
            ids.append(by_bytes[data[start:end]])
            start = end
        return Spelling(tuple(ids), max(len(ids) - 1, 0))


_SPELLERS: "weakref.WeakKeyDictionary[fsm.Vocabulary, Speller]" = weakref.WeakKeyDictionary()


def speller(vocabulary: fsm.Vocabulary) -> Speller:
    """The `Speller` of a vocabulary (made once; `fsm.vocabulary_from_tokenizer` keeps one vocabulary per tokenizer)."""
    found = _SPELLERS.get(vocabulary)
    if found is None:
        found = _SPELLERS[vocabulary] = Speller(vocabulary)
    return found


def _skip_prefix(ids: list[int], prefix: bytes, token_bytes) -> int | None:
    """How many leading ids spell exactly `prefix` (None if they do not)."""
    spelled, n = b"", 0
    while len(spelled) < len(prefix) and n < len(ids):
        spelled += token_bytes[ids[n]] if ids[n] < len(token_bytes) else b"\xff"
        n += 1
    return n if spelled == prefix else None


def whole_chars(data: bytes | bytearray) -> int:
    """Length of the longest prefix of `data` that does not end inside a UTF-8 character."""
    if not data:
        return 0
    last = char_start(data, len(data) - 1)
    lead = data[last]
    size = 1 if lead < 0xC0 else 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
    return len(data) if last + size <= len(data) else last


def char_start(data: bytes | bytearray, end: int) -> int:
    """The largest offset <= `end` where a UTF-8 character of `data` starts (or `data` ends); at most 3 bytes back
    (further back, the bytes are not UTF-8 text and any offset will do)."""
    for _ in range(3):
        if not (0 < end < len(data) and 0x80 <= data[end] < 0xC0):  # not a continuation byte
            break
        end -= 1
    return end


def common_prefix(a, b) -> int:
    """Length of the longest common prefix of two sequences (lists or bytes), by halving slice comparisons."""
    low, high = 0, min(len(a), len(b))
    if a[:high] == b[:high]:
        return high
    while low < high:  # the first mismatch m: low <= m <= high
        middle = (low + high + 1) // 2
        if a[low:middle] == b[low:middle]:
            low = middle
        else:
            high = middle - 1
    return low

"""The exact bytes of every token id of a transformers tokenizer.

Byte-level BPE vocabularies (GPT-2, Qwen, SmolLM2, Llama-3) spell bytes with printable stand-in
characters; SentencePiece vocabularies spell spaces as `▁` and unknown bytes as `<0xNN>` tokens.
Special tokens (BOS, EOS, chat markers) never carry text: they get no bytes, and EOS is handled by
the index on its own. Ids beyond the tokenizer (the model's logits can be wider) get no bytes either.
"""

from __future__ import annotations

import re
import weakref
from dataclasses import dataclass, field
from functools import cached_property, partial

import numpy as np

from fsm.vocabulary_cache import load_or_build

_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


@dataclass(frozen=True, eq=False)
class Vocabulary:
    """Token bytes for ids 0..vocab_size-1 (b"" = never allowed) and the EOS ids."""

    token_bytes: tuple[bytes, ...]
    eos_token_ids: tuple[int, ...]
    tokenizer: object = None  # used once per state for the canonical tokenization of forced strings
    prebuilt_layout: "WalkLayout | None" = field(default=None, repr=False)  # the walk_layout, when already built

    @property
    def vocab_size(self) -> int:
        return len(self.token_bytes)

    @cached_property
    def walk_layout(self) -> "WalkLayout":
        return self.prebuilt_layout if self.prebuilt_layout is not None else WalkLayout.build(self.token_bytes)

    @cached_property
    def single_bytes(self) -> frozenset[int]:
        """Bytes that a token spells on its own (all 256 for byte-level and byte-fallback vocabularies)."""
        return frozenset(b[0] for b in self.token_bytes if len(b) == 1)

    def encode(self, text: str) -> list[int]:
        """Canonical token ids of `text` as the tokenizer itself splits it (no special tokens)."""
        data = text.encode()
        for prefix in ("", "\n"):  # "\n" defeats SentencePiece's dummy-prefix space
            ids = self.tokenizer.encode(prefix + text, add_special_tokens=False)
            ids = _drop_prefix(ids, prefix.encode(), self.token_bytes)
            if ids is not None and b"".join(self.token_bytes[i] for i in ids) == data:
                return ids
        return self._greedy_encode(data)

    def _greedy_encode(self, data: bytes) -> list[int]:
        """Longest-match spelling, used only when the tokenizer's own ids do not spell `data`."""
        by_bytes = self.ids_by_bytes
        ids, start = [], 0
        while start < len(data):
            ends = range(min(len(data), start + self.walk_layout.max_length), start, -1)
            end = next((e for e in ends if data[start:e] in by_bytes), None)
            if end is None:
                return ids  # a byte that no token spells: the spelling stops here
            ids.append(by_bytes[data[start:end]])
            start = end
        return ids

    @cached_property
    def ids_by_bytes(self) -> dict[bytes, int]:
        out: dict[bytes, int] = {}
        for i, b in enumerate(self.token_bytes):
            if b and b not in out:
                out[b] = i
        return out


def _drop_prefix(ids: list[int], prefix: bytes, token_bytes) -> list[int] | None:
    """Remove the leading ids that spell exactly `prefix` (None if they do not)."""
    spelled, n = b"", 0
    while len(spelled) < len(prefix) and n < len(ids):
        spelled += token_bytes[ids[n]] if ids[n] < len(token_bytes) else b"?"
        n += 1
    return ids[n:] if spelled == prefix else None


@dataclass(frozen=True, eq=False)
class WalkLayout:
    """Token bytes laid out column by column for vectorized walks through a DFA.

    order:   (n_tokens,) token ids sorted by byte length, longest first.
    columns: columns[j] is the (counts[j],) uint8 array of byte j of the first counts[j] tokens of
             `order` (exactly those longer than j bytes).
    lengths: (vocab_size,) byte length of every id (0 = no token).
    tail_bytes: (n_tokens, 4) uint64 over `order`: bit b set when the token holds byte b after its first.
    valid_utf8: (n_tokens,) bool over `order`: the token's bytes are whole UTF-8 characters.
    char_counts: (n_tokens,) int32 over `order`: the token's bytes that start a character (not 0x80-0xBF).
    """

    order: np.ndarray
    columns: tuple[np.ndarray, ...]
    counts: np.ndarray
    lengths: np.ndarray
    tail_bytes: np.ndarray
    valid_utf8: np.ndarray
    char_counts: np.ndarray
    _tails_within: dict = field(default_factory=dict, repr=False)  # byte mask -> tails_within(mask)
    prebuilt_trie: object = field(default=None, repr=False)  # the trie, when already built (a TokenTrie)

    @property
    def max_length(self) -> int:
        return len(self.columns)

    @classmethod
    def build(cls, token_bytes: tuple[bytes, ...]) -> "WalkLayout":
        lengths = np.fromiter((len(b) for b in token_bytes), dtype=np.int32, count=len(token_bytes))
        order = np.argsort(-lengths, kind="stable").astype(np.int32)
        order = order[lengths[order] > 0]
        width = int(lengths.max(initial=0))
        padded = np.zeros((len(order), width), dtype=np.uint8)
        for row, token in enumerate(order.tolist()):
            data = token_bytes[token]
            padded[row, : len(data)] = np.frombuffer(data, dtype=np.uint8)
        counts = np.array([(lengths[order] > j).sum() for j in range(width)], dtype=np.int64)
        columns = tuple(np.ascontiguousarray(padded[: counts[j], j]) for j in range(width))
        valid = np.fromiter((_is_utf8(token_bytes[i]) for i in order.tolist()), dtype=bool, count=len(order))
        inside = np.arange(width) < lengths[order][:, None]  # (n_tokens, width) bytes of the token, not padding
        starts = (((padded & 0xC0) != 0x80) & inside).sum(axis=1).astype(np.int32)
        return cls(order, columns, counts, lengths, _byte_sets(columns[1:], len(order)), valid, starts)

    @cached_property
    def order_index(self) -> np.ndarray:
        """`order` as intp, to index with (numpy converts an int32 index array on every use)."""
        return self.order.astype(np.intp)

    @cached_property
    def trie(self):
        """The tokens as a `fsm.token_trie.TokenTrie` (built on first use unless prebuilt)."""
        from fsm.token_trie import TokenTrie

        return self.prebuilt_trie if self.prebuilt_trie is not None else TokenTrie.build(self)

    @cached_property
    def row_of(self) -> np.ndarray:
        """(vocab_size,) int32: the row of each id in `order`, -1 for ids of no bytes."""
        out = np.full(len(self.lengths), -1, dtype=np.int32)
        out[self.order] = np.arange(len(self.order), dtype=np.int32)
        return out

    def chars_within(self, mask: int) -> np.ndarray:
        """(n_tokens,) bool over `order`: `tails_within(mask)` among the tokens of whole UTF-8 characters (cached)."""
        found = self._tails_within.get(("chars", mask))
        if found is None:
            found = self._tails_within[("chars", mask)] = self.tails_within(mask) & self.valid_utf8
        return found

    def tails_within(self, mask: int) -> np.ndarray:
        """(n_tokens,) bool over `order`: tokens whose bytes after the first are all in the 256-bit `mask`
        (cached per mask: free-string states of every schema share a few masks)."""
        found = self._tails_within.get(mask)
        if found is None:
            outside = ~np.frombuffer(mask.to_bytes(32, "little"), dtype="<u8").astype(np.uint64)
            found = np.ones(len(self.order), dtype=bool)
            for word in range(4):
                found &= (self.tail_bytes[:, word] & outside[word]) == 0
            if len(self._tails_within) >= MAX_CACHED_MASKS:
                self._tails_within.clear()
            self._tails_within[mask] = found
        return found


MAX_CACHED_MASKS = 64  # byte masks whose tails_within a layout keeps (n_tokens bytes each)


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _byte_sets(columns: tuple[np.ndarray, ...], n_tokens: int) -> np.ndarray:
    """(n_tokens, 4) uint64: which bytes of `columns` each token (a row of them) holds."""
    out = np.zeros((n_tokens, 4), dtype=np.uint64)
    for column in columns:  # the rows of one column are distinct tokens: fancy `|=` is safe
        out[np.arange(len(column)), column >> 6] |= np.left_shift(np.uint64(1), (column & 63).astype(np.uint64))
    return out


# per tokenizer: (size, EOS ids) -> its Vocabulary, and size -> (token bytes, layout) shared by those
_CACHE: "weakref.WeakKeyDictionary[object, dict]" = weakref.WeakKeyDictionary()


def vocabulary_from_tokenizer(
    tokenizer, vocab_size: int | None = None, eos_token_ids: tuple[int, ...] | None = None
) -> Vocabulary:
    """Build (once per tokenizer, size and EOS set) the Vocabulary of a transformers tokenizer.

    Parameters
    ----------
    tokenizer : transformers tokenizer
    vocab_size : int, optional
        The model's logits width; defaults to ``len(tokenizer)``. Ids without a token get no bytes.
    eos_token_ids : tuple of int, optional
        Ids that end generation; defaults to the tokenizer's EOS token.

    The token bytes and their layout come from the disk cache of `fsm.vocabulary_cache` when it holds this
    tokenizer's content, and are stored there otherwise.
    """
    vocab_size = vocab_size or len(tokenizer)
    if eos_token_ids is None:
        eos_token_ids = () if tokenizer.eos_token_id is None else (tokenizer.eos_token_id,)
    key = (vocab_size, tuple(eos_token_ids))
    per_tokenizer = _CACHE.setdefault(tokenizer, {})
    if key not in per_tokenizer:
        if vocab_size < len(tokenizer):
            raise ValueError(f"vocab_size={vocab_size} is smaller than the tokenizer ({len(tokenizer)} tokens)")
        if vocab_size not in per_tokenizer:  # the token bytes and layout, the same whatever the EOS set
            per_tokenizer[vocab_size] = load_or_build(tokenizer, vocab_size,
                                                      partial(_token_bytes, tokenizer, vocab_size), WalkLayout)
        token_bytes, layout = per_tokenizer[vocab_size]
        per_tokenizer[key] = Vocabulary(token_bytes, tuple(eos_token_ids), tokenizer, layout)
    return per_tokenizer[key]


def _token_bytes(tokenizer, vocab_size: int) -> tuple[bytes, ...]:
    if vocab_size < len(tokenizer):
        raise ValueError(f"vocab_size={vocab_size} is smaller than the tokenizer ({len(tokenizer)} tokens)")
    out = [b""] * vocab_size
    special = set(tokenizer.all_special_ids)
    added = {i: t for i, t in tokenizer.added_tokens_decoder.items() if i < vocab_size}
    special |= {i for i, t in added.items() if t.special}
    decode = _piece_decoder(tokenizer)
    for piece, i in tokenizer.get_vocab().items():
        if i >= vocab_size or i in special:
            continue
        out[i] = added[i].content.encode() if i in added else decode(piece)
    return tuple(out)


def _piece_decoder(tokenizer):
    """piece -> bytes for the tokenizer's spelling convention."""
    kind = _decoder_kind(tokenizer)
    if kind == "byte_level":
        table = {c: b for b, c in _bytes_to_unicode().items()}
        return lambda piece: bytes(table[c] for c in piece) if all(c in table for c in piece) else piece.encode()
    if kind == "sentencepiece":
        return _sentencepiece_bytes
    return lambda piece: tokenizer.convert_tokens_to_string([piece]).encode()


def _decoder_kind(tokenizer) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:  # the decoder's own JSON: the whole tokenizer's costs a second at 150k tokens
        decoder = "null" if backend.decoder is None else backend.decoder.__getstate__().decode()
        if '"ByteLevel"' in decoder:
            return "byte_level"
        if "\\u2581" in decoder or "▁" in decoder or '"Metaspace"' in decoder:
            return "sentencepiece"
    if "<0x0A>" in tokenizer.get_vocab():
        return "sentencepiece"
    return "generic"


def _sentencepiece_bytes(piece: str) -> bytes:
    match = _BYTE_FALLBACK.match(piece)
    if match:
        return bytes([int(match.group(1), 16)])
    return piece.replace("▁", " ").encode()


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table

"""Prompt lookup: copy what follows the latest match of the generated text's tail in the prompt.

Extraction answers are mostly copies of the input ("Maria Lopez", "Lisbon"). Once the model has
written the first token of such a value, its text occurs in the prompt, and the prompt's own tokens
after that place are a free draft (Saxena 2023, transformers' `prompt_lookup_num_tokens`). Matching
is on text, not token ids, because a value inside JSON is tokenized differently from the same words
in prose (`"Maria` vs ` Maria`); a match counts only where it ends on a prompt token boundary, so the
draft is the prompt's own tokenization. The copy stops before the first token with clause punctuation
(a copied value rarely runs past it, and on a compute-bound device every drafted token costs verification
time). Drafts are point masses the target verifies: lossless.
"""

from __future__ import annotations

import re

CLAUSE_END = re.compile(r'[,.;:!?()\[\]{}"\n]')  # a copied value rarely runs past these


class PromptLookup:
    """Drafts from one prompt; the text of each token is decoded once and cached."""

    def __init__(self, tokenizer, prompt: list[int], min_chars: int = 3, max_chars: int = 32):
        self.tokenizer, self.min_chars, self.max_chars = tokenizer, min_chars, max_chars
        self._pieces: dict[int, str] = {}
        self.prompt = list(prompt)
        pieces = [self.piece(t) for t in self.prompt]
        self.text = "".join(pieces)
        ends, offset = {}, 0
        for i, piece in enumerate(pieces):
            offset += len(piece)
            ends[offset] = i + 1  # text offset where a token ends -> index of the next prompt token
        self._next_token_at = ends

    def piece(self, token: int) -> str:
        """Text of one token (cached: the tokenizer is called once per distinct id)."""
        found = self._pieces.get(token)
        if found is None:
            found = self._pieces[token] = self.tokenizer.decode([token], skip_special_tokens=False,
                                                                clean_up_tokenization_spaces=False)
        return found

    def continuation(self, seq: list[int], n: int) -> list[int]:
        """Up to `n` prompt tokens that followed the longest tail of `seq`'s text found in the prompt."""
        tail = self._tail(seq)
        for length in range(min(len(tail), self.max_chars), self.min_chars - 1, -1):
            start = self._latest_aligned(tail[-length:])
            if start is not None:
                return self._clause(start, n)
        return []

    def _clause(self, start: int, n: int) -> list[int]:
        """Up to `n` prompt tokens from `start`, stopping before clause punctuation (at least one token)."""
        out = self.prompt[start : start + n]
        for i, token in enumerate(out[1:], 1):
            if CLAUSE_END.search(self.piece(token)):
                return out[:i]
        return out

    def _tail(self, seq: list[int]) -> str:
        pieces, size = [], 0
        for token in reversed(seq):
            pieces.append(self.piece(token))
            size += len(pieces[-1])
            if size >= self.max_chars:
                break
        return "".join(reversed(pieces))

    def _latest_aligned(self, needle: str) -> int | None:
        """Index of the prompt token after the latest occurrence of `needle` that ends on a token boundary."""
        end = len(self.text)
        while True:
            at = self.text.rfind(needle, 0, end)
            if at < 0:
                return None
            following = self._next_token_at.get(at + len(needle))
            if following is not None and following < len(self.prompt):
                return following
            end = at + len(needle) - 1

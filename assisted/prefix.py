"""Prefix reuse: the KV caches a generation leaves behind serve the next prompt that starts the same way.

A batch usually repeats one instruction (often with few-shot examples) before each document. After a
`generate(..., prefix_cache=cache)` call, the target's and the assistant's KV caches are kept with the
tokens they hold (prompt and output). The next call takes the kept entry sharing the longest token prefix
with its prompt, crops both caches to that prefix and runs only the rest of the prompt. The cached keys
and values are the ones a full prefill computes, up to float rounding (a different split of the same
product), so greedy output is that of a call without the cache wherever the top two logits are not within
rounding of each other.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

from drafting.kv_cache import crop_to, new_cache


@dataclass
class _Entry:
    """The caches one generation left, and the tokens each holds."""

    model: weakref.ref
    assistant_model: weakref.ref | None
    tokens: tuple[int, ...]  # the target cache holds these
    target: object  # DynamicCache
    assistant: object | None  # the assistant's DynamicCache, holding tokens[:assistant_tokens]
    assistant_tokens: int


class PrefixCache:
    """A small store of KV caches, reused for the longest shared token prefix (see `generate(prefix_cache=)`).

    Parameters
    ----------
    capacity : int
        How many generations' caches are kept (least recently used dropped first); memory is bounded by
        `capacity` times one generation's caches (target and assistant). 1 reuses the previous call's.
    min_tokens : int
        Shorter shared prefixes are not reused.

    Entries belong to one (model, assistant_model) pair; a call with other models never sees them. A cache
    entry is taken out while a call uses it, so a store may be shared by sequential calls, not concurrent ones.
    """

    def __init__(self, capacity: int = 1, min_tokens: int = 1):
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be an int >= 1, got {capacity!r}")
        if isinstance(min_tokens, bool) or not isinstance(min_tokens, int) or min_tokens < 1:
            raise ValueError(f"min_tokens must be an int >= 1, got {min_tokens!r}")
        self.capacity, self.min_tokens = capacity, min_tokens
        self._entries: list[_Entry] = []  # least recently used first

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Drop every kept cache."""
        self._entries.clear()

    def take(self, model, assistant_model, prompt: list[int]) -> tuple[object, int, object | None, int]:
        """(target cache, tokens it holds, assistant cache or None, tokens it holds) for `prompt`.

        The caches hold a prefix of `prompt` short of its last token (whose logits the call needs); fresh
        empty caches when nothing kept shares at least `min_tokens` tokens.
        """
        best, shared = None, 0
        for entry in self._entries:
            if entry.model() is model and _ref(entry.assistant_model) is assistant_model:
                n = _common_prefix(entry.tokens, prompt, len(prompt) - 1)
                if n > shared:
                    best, shared = entry, n
        if best is None or shared < self.min_tokens:
            return new_cache(), 0, None, 0
        self._entries.remove(best)
        crop_to(best.target, shared)
        if best.assistant is None:
            return best.target, shared, None, 0
        assistant_tokens = min(shared, best.assistant_tokens)
        crop_to(best.assistant, assistant_tokens)
        return best.target, shared, best.assistant, assistant_tokens

    def put(self, model, assistant_model, seq: list[int], target, assistant=None) -> None:
        """Keep the caches a call left; `seq` is its prompt and output, of which the caches hold a prefix."""
        held = target.get_seq_length()
        if held < self.min_tokens:
            return
        assistant_tokens = 0 if assistant is None else min(assistant.get_seq_length(), held)
        ref = None if assistant_model is None else weakref.ref(assistant_model)
        self._entries.append(_Entry(weakref.ref(model), ref, tuple(seq[:held]), target, assistant, assistant_tokens))
        while len(self._entries) > self.capacity:
            self._entries.pop(0)


def _ref(ref: weakref.ref | None):
    return None if ref is None else ref()


def _common_prefix(a: tuple[int, ...], b: list[int], limit: int) -> int:
    n = 0
    for x, y in zip(a[:limit], b[:limit]):
        if x != y:
            break
        n += 1
    return n

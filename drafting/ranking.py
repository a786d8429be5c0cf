"""Which token ids an assistant drafts over with a reduced head: a frequency ranking derived offline.

For byte-level BPE the order of the merges is the order in which pairs were most frequent in the
tokenizer's training corpus, so a token's merge rank approximates its frequency (Qwen2.5's ids follow
merge order exactly: id = 256 + merge rank). `top_ids(tokenizer, n)` keeps, in this order:

1. every added/special token and every token that no merge produces (the byte alphabet),
2. then the tokens produced by the first merges, up to `n` ids in all.

Tokenizers without BPE merges are ranked by id (most vocabularies put frequent tokens first). The
ranking needs no data besides the tokenizer; `generate` adds the prompt's ids per call (copies).
"""

from __future__ import annotations

import json
import weakref

import torch

_RANKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> (V,) ranks


def top_ids(tokenizer, n: int, vocab_size: int) -> torch.Tensor:
    """The `n` best-ranked token ids below `vocab_size` (more when the always-kept tokens exceed n); (N,) long, sorted."""
    ranks = token_ranks(tokenizer, vocab_size)  # (V,)
    always = int((ranks < 0).sum())
    order = torch.argsort(ranks, stable=True)  # always-kept (rank -1) first, then by merge rank
    return order[: max(n, always)].sort().values


def token_ranks(tokenizer, vocab_size: int) -> torch.Tensor:
    """(vocab_size,) long: -1 for always-kept tokens, else the merge rank (or the id without merges).

    Ids the tokenizer does not know (padding rows of a larger head) rank last.
    """
    try:
        cached = _RANKS.get(tokenizer)
    except TypeError:
        cached = None
    if cached is None or cached.numel() != vocab_size:
        cached = _compute_ranks(tokenizer, vocab_size)
        try:
            _RANKS[tokenizer] = cached
        except TypeError:
            pass
    return cached


def _compute_ranks(tokenizer, vocab_size: int) -> torch.Tensor:
    unknown = 2**62
    ranks = torch.full((vocab_size,), unknown, dtype=torch.long)  # (V,)
    vocab = {token: i for token, i in tokenizer.get_vocab().items() if i < vocab_size}
    merges = _merges(tokenizer)
    if merges is None:  # no BPE merges: id order
        known = torch.tensor(sorted(vocab.values()), dtype=torch.long)
        ranks[known] = known
    else:
        produced = {}
        for rank, (left, right) in enumerate(merges):
            produced.setdefault(left + right, rank)
        for token, i in vocab.items():
            ranks[i] = produced.get(token, -1)  # not produced by a merge: the alphabet, always kept
    special = [i for i in _added_ids(tokenizer) if i < vocab_size]
    ranks[torch.tensor(special, dtype=torch.long)] = -1
    return ranks


def _merges(tokenizer) -> list[tuple[str, str]] | None:
    """The BPE merges of a fast tokenizer, in rank order, or None."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    model = json.loads(backend.to_str()).get("model", {})
    if model.get("type") != "BPE" or not model.get("merges"):
        return None
    return [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1)) for m in model["merges"]]


def _added_ids(tokenizer) -> list[int]:
    """Ids of the added and special tokens."""
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    ids.update(getattr(tokenizer, "added_tokens_decoder", {}) or {})
    return sorted(i for i in ids if isinstance(i, int))

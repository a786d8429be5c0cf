"""Give an assistant a draft vocabulary: its head computes the rows of K likely tokens instead of all V.

FR-Spec's observation: the next token is almost always among the most frequent few tens of thousands, so a drafter
whose head scores only those loses little acceptance and a large share of its bytes (Qwen2.5-0.5B's head is 151,936 x
896 of its ~500M parameters). The draft vocabulary is the tokens a ranking puts first: by default the token ids'
order, which for byte-level BPE (GPT-2, Llama-3, Qwen, SmolLM) is the merge order, frequent pieces first, and for
SentencePiece roughly the score order; or a ranking counted from text of the kind drafted (`frequency_ranking`). The
special tokens (EOS and the chat turn enders among them) are always in it. Where the guide allows only a few tokens,
some outside it, the assistant uses its full head for that position (`drafting.draft_head`).

Only the assistant: the target verifies every draft, so greedy output stays token-identical and sampled output keeps
its distribution, whatever tokens the assistant can draft.

    from assisted.models.draft_vocab import restrict_vocabulary
    restrict_vocabulary(assistant, 32768, tokenizer=tokenizer)  # in place
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

import torch

from assisted.models.int4_linear import Int4Linear
from assisted.models.int8 import Int8Linear, as_linear
from drafting.draft_head import DraftHead, draft_head
from drafting.kv_cache import logits_size

AUTO_SIZE = 32768  # load_pair's default draft vocabulary (FR-Spec's size for Llama-3's 128k)
AUTO_MIN_VOCAB = 2 * AUTO_SIZE  # the default applies to vocabularies at least this large (where the head is big)


def head_rows(head: torch.nn.Module, ids: torch.Tensor) -> torch.nn.Module:
    """(..., H) -> (..., K): a module computing rows `ids` (K,) of `head`, on the same kind of kernel.

    Raises
    ------
    ValueError
        For a head of a kind it does not know (float Linear or GPT-2 Conv1D, `Int8Linear`, `Int4Linear`).
    """
    if isinstance(head, Int4Linear):
        bias = None if head.bias is None else head.bias[ids]
        return Int4Linear(head.groups().rows(ids), bias)
    if isinstance(head, Int8Linear):
        rows = torch.nn.Linear(head.in_features, len(ids), bias=head.bias is not None)
        rows.weight.data = head.dequantized()[ids].contiguous()
        if head.bias is not None:
            rows.bias.data = head.bias[ids].clone()
        return Int8Linear(rows, head.reduce_range)
    linear = as_linear(head)
    if linear is None:
        raise ValueError(f"cannot give a {type(head).__name__} output head a draft vocabulary (it needs a Linear, "
                         "Int8Linear or Int4Linear head)")
    rows = torch.nn.Linear(linear.in_features, len(ids), bias=linear.bias is not None,
                           device=linear.weight.device, dtype=linear.weight.dtype)
    with torch.no_grad():
        rows.weight.copy_(linear.weight[ids.to(linear.weight.device)])  # (K, H): its own memory, also when tied
        if linear.bias is not None:
            rows.bias.copy_(linear.bias[ids.to(linear.bias.device)])
    return rows.requires_grad_(False)


def frequency_ranking(tokenizer, texts: Iterable[str]) -> list[int]:
    """Token ids by how often `tokenizer` spells `texts` with them, most frequent first (ties by id); ids never seen
    are left out (`draft_ids` appends them in id order)."""
    counts = Counter()
    for text in texts:
        counts.update(tokenizer(text, add_special_tokens=False)["input_ids"])
    return sorted(counts, key=lambda i: (-counts[i], i))


def special_ids(model, tokenizer=None) -> set[int]:
    """Ids a draft vocabulary always holds: the tokenizer's special tokens and the model's EOS ids."""
    ids = set(getattr(tokenizer, "all_special_ids", None) or [])
    for source in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        eos = getattr(source, "eos_token_id", None)
        ids.update([eos] if isinstance(eos, int) else list(eos or []))
    return ids


def draft_ids(vocab_size: int, size: int, ranking: Sequence[int] = (), keep: Iterable[int] = ()) -> torch.Tensor:
    """(size,) sorted ids: every id of `keep`, then `ranking`'s in order, then the rest in id order, up to `size`.

    Raises
    ------
    ValueError
        If `size` is not an int in [1, vocab_size), or `keep` alone exceeds it, or an id is out of range.
    """
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size < vocab_size:
        raise ValueError(f"draft_vocab_size must be an int in [1, {vocab_size}) (the vocabulary's size), not {size!r}")
    keep, ranking = [int(i) for i in keep], [int(i) for i in ranking]
    bad = [i for i in keep + ranking if not 0 <= i < vocab_size]
    if bad:
        raise ValueError(f"token id {bad[0]} is outside the vocabulary of {vocab_size}")
    chosen = dict.fromkeys(keep)
    if len(chosen) > size:
        raise ValueError(f"draft_vocab_size={size} cannot hold the {len(chosen)} special tokens it must keep")
    for i in ranking:
        if len(chosen) == size:
            break
        chosen.setdefault(i)
    for i in range(vocab_size):
        if len(chosen) == size:
            break
        chosen.setdefault(i)
    return torch.tensor(sorted(chosen), dtype=torch.long)


def restrict_vocabulary(model, size: int, *, tokenizer=None, ranking: Sequence[int] = (), keep: Iterable[int] = ()):
    """Give `model` (an assistant) a draft vocabulary of `size` tokens, in place; returns the model.

    Its head becomes a `drafting.draft_head.DraftHead` over the rows of `draft_ids(V, size, ranking, special ids +
    keep)`; a model that has one already is restricted anew from its full head. Never apply it to a target: its
    logits outside the draft vocabulary are a floor, not its own.

    Parameters
    ----------
    model : transformers causal LM
        The assistant, with a float, `Int8Linear` or `Int4Linear` head.
    size : int
        K, tokens in the draft vocabulary (1 <= K < V).
    tokenizer : transformers tokenizer, optional
        Its special tokens are always kept.
    ranking : sequence of int
        Token ids, most likely first (e.g. `frequency_ranking`); default: the ids' order.
    keep : iterable of int
        More ids always kept.

    Raises
    ------
    ValueError
        For a size out of range or a head of an unknown kind.
    """
    head = draft_head(model)
    full = model.get_output_embeddings() if head is None else head.full
    vocab_size = logits_size(model) if head is None else head.out_features
    ids = draft_ids(vocab_size, size, ranking, {*special_ids(model, tokenizer), *keep})
    rows = head_rows(full, ids)
    model.set_output_embeddings(DraftHead(full, rows, ids, vocab_size))
    return model


def auto_draft_vocab_size(model, on_cpu: bool) -> int | None:
    """`load_pair`'s default for an assistant: `AUTO_SIZE` on the CPU for a vocabulary of `AUTO_MIN_VOCAB` or more
    (where its head is a large share of its bytes), else None (the full head)."""
    return AUTO_SIZE if on_cpu and logits_size(model) >= AUTO_MIN_VOCAB else None

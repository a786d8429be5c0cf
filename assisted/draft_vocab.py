"""generate(draft_vocab=...): the assistant drafts over a reduced head (see `drafting.heads`).

Checked before any model call; the head is built per call from the cached slice of the N best-ranked
ids (`drafting.ranking`) and the prompt's ids.
"""

from __future__ import annotations

import torch

from drafting.heads import DraftHead, reducible
from drafting.ranking import top_ids

# Under a constraint, compute only the allowed rows where a mask allows few tokens (`drafting.heads`). Off: exact,
# but measured no faster end to end (experiments/results/draft-head-qwen-0.5b-cpu-2026-11-26/).
MASK_SPARSE = False


def check_draft_vocab(draft_vocab, assistant_model) -> int | None:
    """`draft_vocab` validated: None (the full head) or an int >= 1 with an assistant whose head can be reduced."""
    if draft_vocab is None:
        return None
    if isinstance(draft_vocab, bool) or not isinstance(draft_vocab, int) or draft_vocab < 1:
        raise ValueError(f"draft_vocab must be None or an int >= 1 (token ids the assistant drafts over), "
                         f"got {draft_vocab!r}")
    if assistant_model is None:
        raise ValueError("draft_vocab reduces the assistant's head: it needs an assistant_model")
    why = reducible(assistant_model)
    if why is not None:
        raise ValueError(f"draft_vocab cannot reduce this assistant's head: {why}")
    return draft_vocab


def draft_head(assistant_model, tokenizer, prompt: list[int], vocab_size: int, draft_vocab: int | None,
               constrained: bool) -> DraftHead | None:
    """The assistant's head for this call: N ranked ids plus the prompt's (with mask-sparse rows if `MASK_SPARSE`),
    mask-sparse rows only (under a constraint, if `MASK_SPARSE`), or None for the model's own forward."""
    if draft_vocab is None or draft_vocab >= vocab_size:
        sparse = MASK_SPARSE and constrained and reducible(assistant_model) is None
        return DraftHead(assistant_model, vocab_size, None) if sparse else None
    top = top_ids(tokenizer, draft_vocab, vocab_size)  # (N,)
    return DraftHead(assistant_model, vocab_size, top, torch.tensor(prompt, dtype=torch.long), sparse=MASK_SPARSE)

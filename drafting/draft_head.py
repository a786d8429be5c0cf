"""A draft vocabulary: the assistant's output head computes only the rows of the tokens it is likely to draft.

An assistant's head over a large vocabulary (Qwen2.5's 151,936 x 896) is a large share of its bytes, and most of its
rows hold tokens that are almost never the next one. `DraftHead` replaces the head: it computes the rows of a ranked
subset (`ids`, e.g. the 32,768 most frequent tokens, as FR-Spec does) and gives every other token the logit `FLOOR`,
so its softmax weight is exactly 0 wherever a subset token is allowed: those tokens are never drafted. The target
verifies every draft, so this changes acceptance only, never the output (greedy identity and sampling exactness need
only that a draft is drawn from the q it reports, and q is computed from these logits).

Where the guide's mask allows only a few tokens and some lie outside the subset, or allows none of the subset, the
draft would otherwise be a blind pick among floor logits: there the drafter asks for the full head for that forward
(`use_full_head`, before each assistant forward, from the masks of the positions it drafts). Tokens the guide forces
need no forward at all. The switch is read in Python at each forward, so a captured CUDA graph cannot replay it
(`drafting.static_cache.graphs_unsupported` says so).

The subset's module is built by `assisted.models.draft_vocab.restrict_vocabulary` (float, int8 and 4-bit heads).
"""

from __future__ import annotations

import torch

FLOOR = -1e9  # logit of a token outside the subset: exp(FLOOR - max) is 0 in float32 at any temperature above 1e-29
SMALL_ALLOWED = 1024  # a mask allowing at most this many tokens, some outside the subset, gets the full head


class DraftHead(torch.nn.Module):
    """(..., H) -> (..., V): the rows of `ids` from `rows`, `FLOOR` elsewhere; all of `full` when `exact` is set.

    Parameters
    ----------
    full : torch.nn.Module
        The model's own head, (..., H) -> (..., V).
    rows : torch.nn.Module
        (..., H) -> (..., K): the rows `ids` of `full`, in that order.
    ids : torch.Tensor
        (K,) int64, distinct token ids below `vocab_size`: the draft vocabulary.
    vocab_size : int
        V, the length of `full`'s output.
    """

    def __init__(self, full: torch.nn.Module, rows: torch.nn.Module, ids: torch.Tensor, vocab_size: int):
        super().__init__()
        self.full, self.rows, self.out_features = full, rows, vocab_size
        self.register_buffer("ids", ids.to(torch.long), persistent=False)  # (K,)
        members = torch.zeros(vocab_size, dtype=torch.bool)
        members[ids] = True
        self.register_buffer("members", members, persistent=False)  # (V,) bool: in the draft vocabulary
        self.exact = False  # the next forward computes every row (set per forward by `use_full_head`)
        self.forwards, self.full_forwards = 0, 0  # forwards, and of those, forwards with the full head
        self._needs: dict[int, tuple[torch.Tensor, bool]] = {}  # id(mask) -> (mask, needs the full head)

    @property
    def size(self) -> int:
        """K, the number of tokens in the draft vocabulary."""
        return int(self.ids.numel())

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        self.forwards += 1
        if self.exact:
            self.full_forwards += 1
            return self.full(hidden)
        part = self.rows(hidden)  # (..., K)
        floor = max(FLOOR, torch.finfo(part.dtype).min / 2)  # float16 holds no -1e9
        out = part.new_full((*part.shape[:-1], self.out_features), floor)  # (..., V)
        return out.index_copy_(-1, self.ids.to(part.device), part)

    def needs_full(self, mask: torch.Tensor | None) -> bool:
        """Whether a position under the guide's `mask` (V,) bool needs the full head: some allowed token lies outside
        the draft vocabulary, and the mask allows at most `SMALL_ALLOWED` tokens or none of the draft vocabulary.
        Cached per mask object (guides keep one mask per state)."""
        if mask is None:
            return False
        if id(mask) not in self._needs:
            if len(self._needs) >= 4096:  # masks of guides long gone
                self._needs.clear()
            members = self.members.to(mask.device)
            allowed = mask[: self.out_features]
            outside = bool((allowed & ~members).any())
            needs = outside and (int(allowed.sum()) <= SMALL_ALLOWED or not bool((allowed & members).any()))
            self._needs[id(mask)] = (mask, needs)
        return self._needs[id(mask)][1]

    def extra_repr(self) -> str:
        return f"draft vocabulary {self.size} of {self.out_features}"


def draft_head(model) -> DraftHead | None:
    """`model`'s `DraftHead`, or None when its head computes every row."""
    head = model.get_output_embeddings() if model is not None else None
    return head if isinstance(head, DraftHead) else None


def use_full_head(model, masks) -> None:
    """Before an assistant forward: the full head if any position it drafts (under `masks`, (V,) bool or None each)
    needs it (`DraftHead.needs_full`), else the draft vocabulary. No-op for a model without a `DraftHead`."""
    head = draft_head(model)
    if head is not None:
        head.exact = any(head.needs_full(mask) for mask in masks)


def describe(model) -> str:
    """One line on the assistant's head for `Stats`, e.g. "draft vocabulary 32768 of 151936"; "" without one."""
    head = draft_head(model)
    return "" if head is None else f"draft vocabulary {head.size} of {head.out_features}"

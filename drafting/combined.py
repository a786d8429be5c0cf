"""One row's draft source outside the engine: the guide's forced runs, prompt lookup and an assistant, each optional.

The proposal rule itself (forced run first, then the assistant or prompt lookup, the cut, the budget's last slot)
is `drafting.proposal.Proposal`, shared with the rows engine; this source asks its assistant for each token the
proposal wants at once. Without an assistant it yields forced runs and lookup copies only; without those either,
empty drafts (plain decoding: one target forward per token).
"""

from __future__ import annotations

import torch

from drafting.assistant import AssistantDrafter
from drafting.base import Cursor, DeviceMasks, Draft
from drafting.lookup import PromptLookup
from drafting.proposal import Proposal
from drafting.tree import BRANCH_BELOW, Branch, grow_branch


class CombinedSource:
    """Forced tokens (when `use_forced`), then prompt lookup and an assistant, each optional."""

    def __init__(self, assistant: AssistantDrafter | None, use_forced: bool, vocab_size: int, sampling: bool,
                 lookup: PromptLookup | None = None, mask_device: torch.device | str = "cpu", coalesced: bool = False):
        self.assistant, self.use_forced, self.lookup = assistant, use_forced, lookup
        self.coalesced = coalesced  # forced tokens are appended unverified: one may also take the budget's last slot
        self.vocab_size, self.sampling = vocab_size, sampling
        self.device = assistant.device if assistant is not None else torch.device("cpu")
        self.target_masks = DeviceMasks(mask_device)  # each guide mask is copied to the target's device once

    def propose(self, seq: list[int], cursor: Cursor, k: int, limit: int, cut=None, lookup_k: int | None = None
                ) -> Draft:
        """Draft after `seq` from the committed guide state `cursor` (which this advances); see DraftSource.

        The assistant drafts up to `k` tokens, then prompt lookup up to `lookup_k` (default: k); `cut` as in
        `Proposal` (when sampling it may only drop the last model draft).
        """
        proposal = Proposal(seq, cursor, k=k if self.assistant is not None else 0,
                            lookup_k=k if lookup_k is None else lookup_k, limit=limit, lookup=self.lookup,
                            use_forced=self.use_forced, coalesced=self.coalesced, sampling=self.sampling, cut=cut)
        while proposal.fill():
            proposal.give(self.assistant.draft(proposal.context, proposal.mask))
        return proposal.draft(self.target_masks, self.vocab_size, self.device)

    def branch(self, draft: Draft, cursor: Cursor, threshold: float = BRANCH_BELOW) -> Branch | None:
        """The runner-up leaf of this source's last `draft` where the assistant was unsure, from the committed
        guide state `cursor` (`drafting.tree.grow_branch`; its mask on the target's device)."""
        return grow_branch(draft, cursor, self.coalesced, self.assistant.generator, self.target_masks, threshold)

    @property
    def seconds(self) -> float:
        """Wall time of the assistant's forward passes so far (0 without an assistant)."""
        return self.assistant.seconds if self.assistant is not None else 0.0

    @property
    def calls(self) -> int:
        """The assistant's forward passes so far, cut drafts included (0 without an assistant)."""
        return self.assistant.calls if self.assistant is not None else 0

    def rollback(self, valid: int) -> None:
        if self.assistant is not None:
            self.assistant.rollback(valid)

"""A small causal LM as drafter, masked by the guide at each position: `pick` / `settle` (its choice) and `Assistant`
(the engine's: one forward drafts a token for every row that asks, on a `drafting.row_kv.RowsKV` of one row or
many)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from drafting.base import DeviceMasks, Drafted
from drafting.draft_head import use_full_head
from drafting.kv_cache import input_device
from drafting.masked_head import only_allowed
from drafting.proposal import Proposal
from drafting.row_kv import RowsKV
from drafting.sampling import Warp, confidence, masked, probs, sample


@dataclass(frozen=True)
class Pick:
    """The assistant's choice at one position before the host sync."""

    found: torch.Tensor  # (2,) float64 [token, confidence] on the assistant's device
    q: torch.Tensor | None  # (1, V) the masked, warped distribution when sampling, else None
    logits: torch.Tensor  # (1, V) masked logits before the warpers


def pick(logits: torch.Tensor, mask: torch.Tensor | None, warp: Warp, generator: torch.Generator | None,
         processors=None, context: list[int] | None = None) -> Pick:
    """The assistant's next token from its logits (1, V): processors, the guide's mask, warpers, then a draw (sampling)
    or the argmax. One implementation for the engine's rows (`Assistant`) and a foreign assistant's own tokens
    (`drafting.foreign_drafter.ForeignDrafter`).

    `mask` (V,) bool on the logits' device or None; `processors(context, logits, len(context))` are the target's,
    so that drafts follow what the target will be asked (`context`: the sequence the logits follow). The confidence is
    the greedy token's probability under the masked distribution before the warpers (temperature 1): at a low sampling
    temperature the warped distribution is near one-hot wherever the assistant is unsure, and would hide the positions
    where it disagrees with the target. It depends on the distribution only, never on the token drawn from it, so a
    draft cut by confidence keeps sampling lossless (`drafting.proposal.Proposal`).
    """
    if processors:
        logits = processors(context, logits, len(context))
    logits = masked(logits.float(), None if mask is None else mask[None])  # (1, V)
    q = probs(logits, None, warp) if warp.do_sample else None  # (1, V), already masked
    token = sample(q, generator) if q is not None else logits.argmax(-1)  # (1,)
    return Pick(torch.cat([token.double(), confidence(logits).double()]), q, logits)


def settle(picks: list[Pick]) -> list[Drafted]:
    """The picks' tokens and confidences, in one host sync for all of them."""
    found = torch.stack([p.found for p in picks]).tolist()  # (n, 2)
    return [Drafted(int(token), p.q, conf, p.logits) for p, (token, conf) in zip(picks, found)]


class Assistant:
    """The assistant over the engine's rows cache: one forward drafts one token for every row that asks.

    `Proposal`s hold each row's rule (forced runs and prompt-lookup copies on the host, the cut); each row is asked
    for its tokens in its proposal's order, so it drafts what it would draft alone.
    """

    def __init__(self, kv: RowsKV, warp: Warp):
        self.kv, self.warp = kv, warp
        self.masks = DeviceMasks(input_device(kv.model))
        self.forwards, self.seconds = 0, 0.0  # drafting rounds (assistant forwards) and their wall time

    def draft(self, proposals: list[Proposal], generators: list, processors: list) -> list[int]:
        """Complete every row's proposal; returns how many assistant forwards each row took part in.

        Row r's assistant cache holds a prefix of its context; each forward feeds every asking row what its cache
        lacks (the target's tokens since, and the last drafted token) and picks its next token with its own
        generator (`generators[r]`), after its logits processors and its guide's mask: one host sync per round.
        """
        took = [0] * len(proposals)
        asking = [r for r, p in enumerate(proposals) if p.fill()]
        while asking:
            start = time.perf_counter()
            feeds = [proposals[r].tail(n) if r in asking else [] for r, n in enumerate(self.kv.lengths)]
            use_full_head(self.kv.model, [proposals[r].mask for r in asking])  # a draft vocabulary's exceptions
            with only_allowed(self.kv.model, self._masks([proposals[r] for r in asking], processors)):
                logits = self.kv.run(feeds, [1] * len(feeds))  # (1, V) per asking row: after its whole context
            picks = [self._pick(logits[r], proposals[r], generators[r], processors[r]) for r in asking]
            for r, drafted in zip(asking, settle(picks)):  # the round's one host sync
                proposals[r].give(drafted)
                took[r] += 1
            # timed up to the sync: on a GPU that is the forward's kernels, not only their launch
            self.forwards, self.seconds = self.forwards + 1, self.seconds + time.perf_counter() - start
            asking = [r for r in asking if proposals[r].fill()]
        return took

    def _masks(self, asking: list[Proposal], processors: list) -> list[torch.Tensor] | None:
        """The guide's mask (1, V) at each asking row's next position; None where some row's logits are read
        unmasked (no guide, or logits processors that run before the mask)."""
        if any(p.mask is None for p in asking) or any(processors):
            return None
        return [self.masks(p.mask)[None] for p in asking]

    def _pick(self, logits: torch.Tensor, proposal: Proposal, generator, processors) -> Pick:
        context = proposal.context if processors else None  # built only for processors: no copy per step
        return pick(logits, self.masks(proposal.mask), self.warp, generator, processors, context)

    def rollback(self, valid: list[int]) -> None:
        """Row r committed only the first `valid[r]` tokens of its last context."""
        self.kv.crop_rows(valid)

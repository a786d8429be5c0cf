"""A small causal LM as drafter: its own persistent KV cache, masked by the guide at each position."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from drafting.base import DeviceMasks
from drafting.kv_cache import crop_to, forward, input_device, new_cache
from drafting.sampling import Warp, confidence, masked, probs, sample


@dataclass(frozen=True)
class Drafted:
    """One assistant token and what it was drawn from."""

    token: int
    q: torch.Tensor | None  # (1, V) the masked, warped distribution when sampling, else None
    confidence: float  # max of the masked distribution at temperature 1 (see `AssistantDrafter.draft`)
    logits: torch.Tensor  # (1, V) masked logits before the warpers: a draft tree's runner-up is chosen from them


class AssistantDrafter:
    """Proposes one token at a time from the assistant's masked, warped distribution.

    The cache holds the first `cached` tokens of the sequence it was last shown. Tokens it did not
    produce (the target's corrections and bonus tokens, forced tokens) are fed on the next call.
    """

    def __init__(self, model, warp: Warp, generator: torch.Generator | None, processors=None):
        self.model, self.warp, self.generator, self.processors = model, warp, generator, processors
        self.cache, self.cached = new_cache(), 0
        self.device = input_device(model)
        self.masks = DeviceMasks(self.device)
        self.calls, self.seconds = 0, 0.0  # forward passes and their wall time

    def next(self, seq: list[int], mask: torch.Tensor | None) -> tuple[int, torch.Tensor | None, float]:
        """Draft the token after `seq`: (token, q row (1, V) or None when greedy, the assistant's confidence)."""
        drafted = self.draft(seq, mask)
        return drafted.token, drafted.q, drafted.confidence

    def draft(self, seq: list[int], mask: torch.Tensor | None) -> Drafted:
        """Draft the token after `seq` under the guide's `mask`, with its distribution and masked logits.

        The confidence is the greedy token's probability under the masked distribution before the warpers
        (temperature 1): at a low sampling temperature the warped distribution is near one-hot wherever the
        assistant is unsure, and would hide the positions where it disagrees with the target. It depends on
        the distribution only, never on the token drawn from it, so a draft cut by confidence keeps sampling
        lossless (see `CombinedSource.propose`).
        """
        start = time.perf_counter()
        logits = forward(self.model, self.cache, seq[self.cached :], 1)  # (1, V)
        self.cached = len(seq)
        if self.processors:  # the target's processors, so that drafts follow what the target will be asked
            logits = self.processors(seq, logits, len(seq))
        mask = self.masks(mask)
        logits = masked(logits.float(), None if mask is None else mask[None])  # (1, V)
        q = probs(logits, None, self.warp) if self.warp.do_sample else None  # (1, V), already masked
        token = sample(q, self.generator) if q is not None else logits.argmax(-1)  # (1,)
        token, conf = torch.cat([token.double(), confidence(logits).double()]).tolist()  # the one host sync
        # timed up to the sync: on a GPU that is the forward's kernels, not only their launch
        self.calls, self.seconds = self.calls + 1, self.seconds + time.perf_counter() - start
        return Drafted(int(token), q, conf, logits)

    def rollback(self, valid: int) -> None:
        """Keep only the first `valid` tokens of the last sequence in the cache."""
        self.cached = min(self.cached, valid)
        crop_to(self.cache, self.cached)

"""The benchmarks' one forward-cost timer: what one forward over k new tokens costs after a cached prefix (logits
for all k, as verification needs), the curve every drafting policy lives on (on a CPU it grows with k; on a GPU it is
flat for small k)."""

from __future__ import annotations

import time

import torch

from drafting.kv_cache import crop_to, forward, new_cache


class Prefixed:
    """A model with `prefix` (token ids) prefilled once in its own KV cache; every timed forward is cropped back."""

    def __init__(self, model, prefix: list[int], synchronize=None):
        self.model, self.length, self.synchronize = model, len(prefix), synchronize
        self.cache = new_cache()
        with torch.inference_mode():
            forward(model, self.cache, list(prefix), 1)

    def seconds(self, tokens: list[int]) -> float:
        """Wall seconds of one forward over `tokens` after the prefix (`synchronize`, e.g. a GPU's
        `torch.cuda.synchronize`, is called before each clock read)."""
        with torch.inference_mode():
            if self.synchronize:
                self.synchronize()
            start = time.perf_counter()
            forward(self.model, self.cache, list(tokens), len(tokens))
            if self.synchronize:
                self.synchronize()
            spent = time.perf_counter() - start
        crop_to(self.cache, self.length)
        return spent


"""The benchmarks' one forward-cost timer: what one target forward over n new tokens costs after a cached prefix,
the curve every drafting policy lives on (on a CPU it grows with n; on a GPU it is flat for small n)."""

from __future__ import annotations

import statistics
import time

import torch

from drafting.kv_cache import cache_argument


def forward_seconds(model, prefix: torch.Tensor, n: int, synchronize=None) -> float:
    """Seconds of one forward over n tokens (logits for all n, as verification needs) after `prefix` (1, p) is
    cached; `synchronize`: called before each clock read (a GPU's `torch.cuda.synchronize`)."""
    from transformers import DynamicCache
    cache, kw = DynamicCache(), cache_argument(type(model))
    with torch.inference_mode():
        model(input_ids=prefix, use_cache=True, logits_to_keep=1, **{kw: cache})
        x = prefix[:, :n]
        if synchronize:
            synchronize()
        start = time.perf_counter()
        model(input_ids=x, use_cache=True, logits_to_keep=n, **{kw: cache})
        if synchronize:
            synchronize()
    return time.perf_counter() - start


def forward_costs(model, prefix: torch.Tensor, ns, repeats: int = 5, synchronize=None) -> dict[int, float]:
    """{n: median seconds of `forward_seconds`} over `repeats` interleaved rounds after one untimed warm-up round."""
    seconds: dict[int, list[float]] = {n: [] for n in ns}
    for round_ in range(repeats + 1):
        for n in ns:
            spent = forward_seconds(model, prefix, n, synchronize)
            if round_:
                seconds[n].append(spent)
    return {n: statistics.median(v) for n, v in seconds.items()}

"""Logits -> probabilities: the guide's mask first, then temperature, top-k and top-p; seeded draws.

Target and assistant go through the same `probs()`, so "p" and "q" in the acceptance test are both
distributions after the mask and the warpers, as docs/design.md (section 1) requires. The warpers follow
transformers' TemperatureLogitsWarper, TopKLogitsWarper and TopPLogitsWarper (ties at the top-k
threshold are kept; top-p keeps the smallest set whose mass exceeds `top_p`, at least one token).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

NEG_INF = float("-inf")


@dataclass(frozen=True)
class Warp:
    """How next-token logits become a distribution (validated at the user boundary)."""

    do_sample: bool = False  # False: argmax of the masked logits (warpers cannot change it)
    temperature: float = 1.0  # divides the logits; only used when sampling
    top_k: int | None = None  # keep the k largest logits (ties at the threshold kept)
    top_p: float | None = None  # keep the smallest nucleus with mass > top_p


def masked(logits: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Disallowed tokens -> -inf. logits (n, V) float, mask (n, V) bool or None."""
    return logits if mask is None else logits.masked_fill(~mask, NEG_INF)


def warped(logits: torch.Tensor, warp: Warp) -> torch.Tensor:
    """Temperature, then top-k, then top-p, row by row. (n, V) -> (n, V)."""
    if warp.temperature != 1.0:
        logits = logits / warp.temperature
    if warp.top_k is not None and warp.top_k < logits.shape[-1]:
        kth = torch.topk(logits, warp.top_k, dim=-1).values[..., -1:]  # (n, 1)
        logits = logits.masked_fill(logits < kth, NEG_INF)
    if warp.top_p is not None and warp.top_p < 1.0:
        logits = _nucleus(logits, warp.top_p)
    return logits


def _nucleus(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Drop the low tail whose cumulative mass is <= 1 - top_p; the top token always stays."""
    sorted_logits, order = torch.sort(logits, dim=-1)  # ascending, (n, V)
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    drop = cumulative <= 1.0 - top_p
    drop[..., -1] = False
    return logits.masked_fill(drop.scatter(-1, order, drop), NEG_INF)


def probs(logits: torch.Tensor, mask: torch.Tensor | None, warp: Warp) -> torch.Tensor:
    """Masked, warped next-token probabilities in float32. (n, V) -> (n, V)."""
    return warped(masked(logits.float(), mask), warp).softmax(dim=-1)


def confidence(logits: torch.Tensor) -> torch.Tensor:
    """The largest probability of softmax(logits) per row, at temperature 1. (n, V) -> (n,)."""
    return torch.exp(logits.max(-1).values - torch.logsumexp(logits, dim=-1))


def sample(weights: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One draw per row from non-negative (unnormalized) weights. (n, V) -> (n,)."""
    return torch.multinomial(weights, 1, generator=generator).squeeze(-1)


def make_generator(device: torch.device, seed: int | None) -> torch.Generator:
    """A generator on `device`, seeded when `seed` is given (fresh entropy otherwise)."""
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator

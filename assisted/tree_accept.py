"""Acceptance on a draft tree: the chain of k tokens plus one leaf `alt`, a sibling of chain token `at`.

Rows 0..k of the target's output score the chain as in `assisted.acceptance`; row k+1 is the leaf's own
row (the position after it). Both rules return a (3,) long tensor `[n, took, token]`: n accepted chain
tokens, whether the leaf was taken after them (then n == at), and the target's token after the
accepted path — one host sync per step, as for a chain. `assisted.rows.engine.verify` runs both shapes.

Sampling uses recursive rejection with candidates drawn without replacement (Jeon et al. 2024,
"Recursive Speculative Decoding"; Chen et al. 2023, SpecTr): at position `at`, x1 ~ q is accepted with
probability min(1, p(x1)/q(x1)) as usual. On rejection the output must follow r = norm(max(p - q, 0)),
and x2 was drawn from q' = q without x1, renormalized, independently of the test on x1: a second
speculative step with target r and draft q' — accept x2 with probability min(1, r(x2)/q'(x2)), else
sample from norm(max(r - q', 0)) — yields exactly r, so the position keeps p's distribution.
"""

from __future__ import annotations

import torch

from assisted.acceptance import greedy_accept, speculative_accept
from drafting.sampling import sample


def greedy_tree_accept(logits: torch.Tensor, draft: torch.Tensor, auto: torch.Tensor, at: int, alt: int
                       ) -> torch.Tensor:
    """Greedy on a tree: the chain's accepted prefix; where it stops at `at`, the leaf if it is the argmax.

    logits (k+2, V) already masked; draft (k,) long; auto (k,) bool. Returns [n, took, token].
    """
    k = draft.shape[0]
    n, token = greedy_accept(logits[: k + 1], draft, auto)  # (), ()
    took = (n == at) & (token == alt)
    leaf_token = logits[k + 1].argmax()
    return torch.stack([n, took.long(), torch.where(took, leaf_token, token)])


def speculative_tree_accept(p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor, auto: torch.Tensor, at: int,
                            alt: int, generator: torch.Generator | None) -> torch.Tensor:
    """Speculative sampling on a tree: exact samples from p (module docstring).

    p (k+2, V) target probabilities (row k+1: after the leaf), q (k, V) chain draft probabilities,
    draft (k,) long, auto (k,) bool; `alt` was drawn from q[at] without draft[at]. Returns [n, took, token].
    """
    k = draft.shape[0]
    n, token = speculative_accept(p[: k + 1], q, draft, auto, generator)  # token: from r when n == at
    r = _normalized((p[at] - q[at]).clamp_min(0.0), p[at])  # (V,) the target after rejecting x1
    q2 = q[at].clone()
    q2[draft[at]] = 0.0
    q2 = _normalized(q2, q[at])  # (V,) the distribution alt was drawn from
    u = torch.rand((), generator=generator, device=p.device)
    took = (n == at) & (u * q2[alt] < r[alt])
    residual = _normalized((r - q2).clamp_min(0.0), r)  # (V,)
    second = sample(torch.stack([residual, p[k + 1]]), generator)  # (2,): after rejecting alt, after taking it
    token = torch.where(n == at, torch.where(took, second[1], second[0]), token)
    return torch.stack([n, took.long(), token])


def _normalized(weights: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """`weights` / their sum, or `fallback` where they are all zero (a branch of probability 0)."""
    total = weights.sum()
    return torch.where(total > 0, weights / total.clamp_min(1e-30), fallback)

"""Pure acceptance rules on (k+1, V) tensors (docs/design.md, section 1).

Row i of the target's output scores draft token i; row k is the bonus position after the whole draft.
Both functions return a (2,) long tensor `[n, token]` on the logits' device — n accepted draft tokens,
then the target's own token at position n — so the caller syncs with the host once per step.

`auto` marks coalesced forced tokens: appended without verification, so they always "match".
A deterministic draft (a forced token, verified) is a one-hot row of `q`: accepting with probability
min(1, p(x)/1) = p(x) and resampling from max(p - onehot(x), 0) is exactly "p with x removed".
"""

from __future__ import annotations

import torch

from drafting.sampling import sample


def greedy_accept(logits: torch.Tensor, draft: torch.Tensor, auto: torch.Tensor) -> torch.Tensor:
    """Accept while the draft equals the target's argmax; the first mismatch becomes the argmax.

    logits (k+1, V) already masked; draft (k,) long; auto (k,) bool. Returns [n, token].
    """
    best = logits.argmax(dim=-1)  # (k+1,)
    k = draft.shape[0]
    ok = (best[:k] == draft) | auto  # (k,)
    n = ok.long().cumprod(dim=0).sum()  # accepted prefix length, ()
    return torch.stack([n, best[n]])


def speculative_accept(
    p: torch.Tensor,
    q: torch.Tensor,
    draft: torch.Tensor,
    auto: torch.Tensor,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """Speculative sampling (Leviathan et al. 2023): exact samples from p whatever q is.

    p (k+1, V) target probabilities, q (k, V) draft probabilities (one-hot rows for point masses),
    draft (k,) long, auto (k,) bool. Returns [n, token].
    """
    k = draft.shape[0]
    px = p[:k].gather(-1, draft[:, None]).squeeze(-1)  # (k,)
    qx = q.gather(-1, draft[:, None]).squeeze(-1)  # (k,)
    u = torch.rand(k, generator=generator, device=p.device)  # (k,)
    ok = (u * qx < px) | auto  # accept with probability min(1, p/q)
    n = ok.long().cumprod(dim=0).sum()  # ()
    residual = torch.cat([(p[:k] - q).clamp_min(0.0), p[k:]])[n]  # (V,): row k is the bonus row
    row = torch.where(residual.sum() > 0, residual, p[n])  # p == q exactly: rejection had prob 0
    return torch.stack([n, sample(row[None], generator)[0]])

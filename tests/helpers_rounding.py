"""Tolerances from the arithmetic: float32 results against a float64 reference, never two float32 results against
each other with a fixed tolerance.

Two float32 computations of the same quantity that add in different orders (another kernel, another CPU's
instruction set, another blocking) differ by rounding; how much depends on the magnitudes summed, not on a constant.
Each side is therefore compared with a float64 evaluation of the same math, within a bound that follows from
float32's unit roundoff u = 2^-24 (Higham, "Accuracy and Stability of Numerical Algorithms", ch. 3: a sum of n
products computed in any order errs by at most gamma(n) = n u / (1 - n u) times the sum of their magnitudes).

Where a whole model is compared (many layers: no closed bound), each float32 side is compared with the float64 model
within a few times the float32 rounding error that the plain computation itself shows against float64 on the same
machine, plus a few ulps of the logits' scale (`assert_same_function`): a ratio of rounding errors, which no CPU's
choice of kernels changes, while a wrong mask, position or cache row changes results by orders of magnitude more.
"""

from __future__ import annotations

import copy

import torch

U = 2.0**-24  # float32 unit roundoff


def gamma(n: int) -> float:
    """Higham's gamma_n for float32: the relative error bound of n rounded operations in sequence."""
    return n * U / (1 - n * U)


def assert_within(actual: torch.Tensor, reference: torch.Tensor, bound: torch.Tensor | float, what: str = "") -> None:
    """|actual - reference| <= bound element-wise; reference and bound in float64."""
    error = (actual.double() - reference.double()).abs()
    bound = torch.as_tensor(bound, dtype=torch.float64).expand_as(error)
    beyond = error > bound
    if beyond.any():
        worst = int((error - bound).argmax())
        raise AssertionError(f"{what}: {int(beyond.sum())} of {error.numel()} values beyond their rounding bound; "
                             f"worst at flat index {worst}: error {float(error.flatten()[worst]):.3g} > bound "
                             f"{float(bound.flatten()[worst]):.3g}")


def linear_bound(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Rounding bound of a float32 x @ weight.T + bias in any summation order: gamma(in + 1) (|x| |W|^T + |b|)."""
    magnitude = x.double().abs() @ weight.double().abs().T
    if bias is not None:
        magnitude = magnitude + bias.double().abs()
    return gamma(x.shape[-1] + 1) * magnitude


def attention_bound(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, allowed: torch.Tensor,
                    scaling: float | None = None) -> torch.Tensor:
    """(B, n, H, D) float64: a first-order rounding bound of float32 softmax(scale q k^T) v against its exact value.

    query (B, H, n, D), key and value (B, H_kv, L, D) (heads grouped, GQA), allowed (.., n, L) bool. Per attended key
    j: its score errs by s_j <= gamma(D + 1) scale sum |q||k_j|; its weight exp(score - max) by a relative
    e_j <= s_j + max s + u |score - max| + 4 u (an exp within 2 ulps, the subtraction); the weighted sum of L
    products and the normaliser of L terms add gamma(2 L) and gamma(L); the division one u. With w_j the exact
    weights: |error_d| <= sum_j w_j |v_jd| (e_j + gamma(2L)) + |out_d| (sum_j w_j e_j + gamma(L) + u), doubled for the
    second-order terms.
    """
    groups = query.shape[1] // key.shape[1]
    q = query.double()
    k, v = (t.double().repeat_interleave(groups, 1) for t in (key, value))  # (B, H, L, D)
    scale = scaling or query.shape[-1] ** -0.5
    length = key.shape[-2]
    scores = q @ k.transpose(-1, -2) * scale  # (B, H, n, L)
    score_error = gamma(query.shape[-1] + 1) * scale * (q.abs() @ k.abs().transpose(-1, -2))
    score_error = score_error.masked_fill(~allowed, 0.0)
    top = scores.masked_fill(~allowed, float("-inf")).amax(-1, keepdim=True)
    weights = (scores - top).masked_fill(~allowed, float("-inf")).exp()
    weights = (weights / weights.sum(-1, keepdim=True)).nan_to_num(0.0)  # (B, H, n, L)
    relative = (score_error + score_error.amax(-1, keepdim=True) + U * (scores - top).abs().nan_to_num(0.0) + 4 * U)
    relative = relative.masked_fill(~allowed, 0.0)
    out = weights @ v  # (B, H, n, D)
    numerator = (weights * (relative + gamma(2 * length))) @ v.abs()
    normaliser = (weights * relative).sum(-1, keepdim=True) + gamma(length) + U
    return (2 * (numerator + out.abs() * normaliser)).transpose(1, 2)


def assert_same_function(sides: dict[str, torch.Tensor], reference: torch.Tensor, plain: torch.Tensor,
                         factor: float = 16.0, ulps: float = 8.0) -> None:
    """Whole-model float32 results `sides` (name -> tensor) against the float64 model's `reference`.

    `plain` is the straightforward float32 computation of the same values (e.g. one full forward): its error against
    float64 is this machine's float32 rounding for this model. Each side must stay within `factor` times that error
    plus `ulps` float32 ulps of the largest reference value.
    """
    scale = float(reference.detach().abs().max())
    noise = float((plain.detach().double() - reference.detach()).abs().max())
    bound = factor * noise + ulps * U * 2 * scale
    for name, side in sides.items():
        assert_within(side, reference, bound, f"{name} against the float64 model (noise {noise:.3g})")


def float64_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A float64 copy of a (tiny) model: the reference its float32 results are held to."""
    return copy.deepcopy(model).double()

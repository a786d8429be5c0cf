"""A Llama / Qwen2 decoder layer around its attention in two C++ calls (structspec_ops/csrc/decoder_layer.cpp).

`attention_in` is RMSNorm, the q, k, v linears (with their biases) and the rotary embedding; `attention_out` the o
linear, the residual, RMSNorm, the gate and up linears, SiLU(gate) * up, the down linear and the second residual. The
caller keeps the cache update and the row-invariant attention between them. The linears are the project's 4-bit and
6-bit ones (`Weight`: a packed weight and which kernel reads it); every step works row by row in a fixed order, so a
row's output is bitwise the same whatever else the call holds.

    q, k, v = decoder.attention_in(x, norm, eps, Weights.of(wq, wk, wv), cos, sin, heads, kv_heads, head_dim)
    y = decoder.attention_out(a, x, norm, eps, Weights.of(wo, wg, wu, wd))
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from structspec_ops import int4

Q6_K = 0  # `Weight.groups_per_block` of a Q6_K weight (4-bit weights have 1 or 8)


@dataclass(frozen=True)
class Weight:
    """A packed weight as the layer op takes it: 4-bit (`groups_per_block` >= 1) or Q6_K (`Q6_K`)."""

    packed: torch.Tensor  # uint8, the kernel's layout
    bias: torch.Tensor | None  # (out,) float32
    out_features: int
    groups_per_block: int


@dataclass(frozen=True)
class Weights:
    """Several `Weight`s as the layer ops take them: four lists (packed, biases, out_features, groups_per_block),
    built once rather than at every call."""

    packed: list[torch.Tensor]
    biases: list[torch.Tensor | None]
    out_features: list[int]
    groups_per_block: list[int]

    @classmethod
    def of(cls, *weights: Weight) -> Weights:
        return cls([w.packed for w in weights], [w.bias for w in weights], [w.out_features for w in weights],
                   [w.groups_per_block for w in weights])

    def lists(self) -> tuple[list, list, list, list]:
        return self.packed, self.biases, self.out_features, self.groups_per_block


def attention_in(x: torch.Tensor, norm: torch.Tensor, eps: float, weights: Weights, cos: torch.Tensor,
                 sin: torch.Tensor, heads: int, kv_heads: int, head_dim: int) -> list[torch.Tensor]:
    """x (n, hidden) float32 -> [q (n, heads * head_dim), k, v (n, kv_heads * head_dim)], q and k rotated by cos, sin
    (n, head_dim); `weights`: q, k, v."""
    return torch.ops.structspec.decoder_attention_in(x, norm, eps, *weights.lists(), cos, sin, heads, kv_heads,
                                                     head_dim, int4.path())


def attention_out(a: torch.Tensor, x: torch.Tensor, norm: torch.Tensor, eps: float, weights: Weights) -> torch.Tensor:
    """a (n, heads * head_dim) the attention's output, x (n, hidden) the layer's input -> the layer's output;
    `weights`: o, gate, up, down."""
    return torch.ops.structspec.decoder_attention_out(a, x, norm, eps, *weights.lists(), int4.path())

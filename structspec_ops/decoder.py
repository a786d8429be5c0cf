"""A Llama / Qwen2 decoder layer around its attention in two C++ calls (structspec_ops/csrc/decoder_layer.cpp).

`attention_in` is RMSNorm, the q, k, v linears (with their biases) and the rotary embedding; `attention_out` the o
linear, the residual, RMSNorm, the gate and up linears, SiLU(gate) * up, the down linear and the second residual. The
caller keeps the cache update and the row-invariant attention between them. The linears are the project's 4-bit and
6-bit ones (`Weight`: a packed weight and which kernel reads it); every step works row by row in a fixed order, so a
row's output is bitwise the same whatever else the call holds.

    q, k, v = decoder.attention_in(x, norm, eps, Weights.of(wq, wk, wv), cos, sin, heads, kv_heads, head_dim)
    y = decoder.attention_out(a, x, norm, eps, Weights.of(wo, wg, wu, wd))

Adjacent 4-bit weights that read the same input (q, k, v; gate, up) may be passed merged (`merged`): one kernel call
then quantizes the input once and forks its threads once. A column's value does not depend on the other columns of
its call, so merged weights give bitwise the same layer (tested).
"""

from __future__ import annotations

from collections.abc import Sequence
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


def merged(*inputs: Sequence[Weight]) -> tuple[list[Weight], list[torch.Tensor]]:
    """The weights of `inputs` (each a list of weights that read one input, in the layer op's order) with each run of
    adjacent 4-bit weights of one input and kind (same groups per block, all with a bias or all without) merged into
    one whose columns are theirs side by side. Each weight but a run's last must fill its 16-column blocks, so the
    packed bytes concatenate block by block. Returns (the weights for the layer op, and per weight of `inputs` its
    packed bytes as a view into the merged ones, for the module that owns them to hold instead)."""
    runs: list[list[Weight]] = []
    for weights in inputs:
        first = len(runs)  # runs from here on read this input
        for weight in weights:
            if len(runs) > first and _joins(runs[-1][-1], weight):
                runs[-1].append(weight)
            else:
                runs.append([weight])
    together, views = [], []
    for run in runs:
        if len(run) == 1:
            together.append(run[0])
            views.append(run[0].packed)
            continue
        packed = torch.cat([w.packed.reshape(-1) for w in run])
        bias = None if run[0].bias is None else torch.cat([w.bias for w in run])
        together.append(Weight(packed, bias, sum(w.out_features for w in run), run[0].groups_per_block))
        views += list(packed.split([w.packed.numel() for w in run]))
    return together, views


def _joins(last: Weight, weight: Weight) -> bool:
    """Whether `weight` can follow `last` in one merged 4-bit weight."""
    return (weight.groups_per_block != Q6_K and last.groups_per_block == weight.groups_per_block
            and (last.bias is None) == (weight.bias is None) and last.out_features % int4.LANES == 0)


def attention_in(x: torch.Tensor, norm: torch.Tensor, eps: float, weights: Weights, cos: torch.Tensor,
                 sin: torch.Tensor, heads: int, kv_heads: int, head_dim: int) -> list[torch.Tensor]:
    """x (n, hidden) float32 -> [q (n, heads * head_dim), k, v (n, kv_heads * head_dim)], q and k rotated by cos, sin
    (n, head_dim); `weights`: q, k, v, adjacent ones possibly `merged`."""
    return torch.ops.structspec.decoder_attention_in(x, norm, eps, *weights.lists(), cos, sin, heads, kv_heads,
                                                     head_dim, int4.path())


def attention_out(a: torch.Tensor, x: torch.Tensor, norm: torch.Tensor, eps: float, weights: Weights) -> torch.Tensor:
    """a (n, heads * head_dim) the attention's output, x (n, hidden) the layer's input -> the layer's output;
    `weights`: o, gate, up, down, or o, gate|up `merged`, down."""
    return torch.ops.structspec.decoder_attention_out(a, x, norm, eps, *weights.lists(), int4.path())


def silu_times(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for (n, d) float32 tensors, as `attention_out` computes its MLP's activation: exp by range
    reduction and a polynomial (within an ulp), 16 lanes at a time, the same bits on every CPU and in any lane."""
    return torch.ops.structspec.silu_times(gate, up)

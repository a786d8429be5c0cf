"""`Int4Linear`: a weight as 4-bit groups (a GGUF's Q4_K, Q4_1, Q4_0, or a float weight quantized to Q4_K's form),
run by `structspec_ops.int4` (row-invariant, bitwise the same on every x86 CPU). `assisted.models.int4_models` builds
models of them.
"""

from __future__ import annotations

import torch

from assisted.models.packed_linear import PackedLinear
from structspec_ops import int4


class Int4Linear(PackedLinear):
    """(..., in) -> (..., out): a weight held as 4-bit `structspec_ops.int4.Groups`, per-row int8 activations.

    Row-invariant: each row's output depends on that row alone (bitwise), whatever the number of rows or threads.
    """

    kernel, unpack = staticmethod(int4.linear), staticmethod(int4.unpack)

    def __init__(self, groups: int4.Groups, bias: torch.Tensor | None = None):
        super().__init__()
        self._set(int4.pack(groups), bias)

    def _set(self, packed: int4.Packed, bias: torch.Tensor | None) -> None:
        super()._set(packed, bias)
        self.groups_per_block = packed.groups_per_block

    @classmethod
    def quantized(cls, linear: torch.nn.Linear) -> Int4Linear:
        """A float Linear quantized to Q4_K's form (super-blocks of `int4.groups_per_block_for(in)` groups: 8 where
        they fit); its `in_features` must be a multiple of 32 (`fits`)."""
        blocks = int4.groups_per_block_for(linear.in_features)
        return cls(int4.quantize(linear.weight.detach(), blocks), linear.bias)

    def layout(self) -> int4.Packed:
        return int4.Packed(self.packed, self.out_features, self.in_features, self.groups_per_block)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, groups_per_block={self.groups_per_block}"


def fits(linear: torch.nn.Linear) -> bool:
    """Whether a Linear's inputs split into groups of 32."""
    return linear.in_features % int4.GROUP == 0

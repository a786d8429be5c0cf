"""`Q6KLinear`: a GGUF's Q6_K weight as the file stores it, run by `structspec_ops.q6k` (row-invariant, any x86).

A Q4_K_M file keeps its head and half of its v_proj and down_proj in Q6_K. `quantize_int4` keeps those groups
exactly, as it keeps the Q4_K ones: 6.6 bits a weight, the file's own values, bitwise the same output on every x86
CPU (an int8 copy through fbgemm rounded them again, and fbgemm's AVX2 kernels saturate where VNNI's do not).
"""

from __future__ import annotations

import torch

from assisted.models.packed_linear import PackedLinear
from structspec_ops import q6k


class Q6KLinear(PackedLinear):
    """(..., in) -> (..., out): a weight held as Q6_K `structspec_ops.q6k.Groups`, per-row int8 activations.

    Row-invariant: each row's output depends on that row alone (bitwise), whatever the number of rows or threads.
    """

    kernel, unpack = staticmethod(q6k.linear), staticmethod(q6k.unpack)

    def __init__(self, groups: q6k.Groups, bias: torch.Tensor | None = None):
        super().__init__()
        self._set(q6k.pack(groups), bias)

    @classmethod
    def quantized(cls, linear: torch.nn.Linear) -> Q6KLinear:
        """A float Linear quantized to Q6_K's form; its `in_features` must be a multiple of 256 (`fits`)."""
        return cls(q6k.quantize(linear.weight.detach()), linear.bias)

    @staticmethod
    def fits(linear: torch.nn.Linear) -> bool:
        return linear.in_features % q6k.SUPER == 0

    def layout(self) -> q6k.Packed:
        return q6k.Packed(self.packed, self.out_features, self.in_features)

"""`Int4Linear`: a weight as 4-bit groups (a GGUF's Q4_K, Q4_1, Q4_0, or a float weight quantized to Q4_K's form),
run by `structspec_ops.int4` (row-invariant, bitwise the same on every x86 CPU). `assisted.models.int4_models` builds
models of them.
"""

from __future__ import annotations

import torch

from structspec_ops import int4


class Int4Linear(torch.nn.Module):
    """(..., in) -> (..., out): a weight held as 4-bit `structspec_ops.int4.Groups`, per-row int8 activations.

    Row-invariant: each row's output depends on that row alone (bitwise), whatever the number of rows or threads.
    """

    def __init__(self, groups: int4.Groups, bias: torch.Tensor | None = None):
        super().__init__()
        self._set(int4.pack(groups), bias)

    @classmethod
    def from_packed(cls, packed: int4.Packed, bias: torch.Tensor | None = None) -> Int4Linear:
        """The module of weights already in the kernel's layout (packed a few rows at a time, or read back from a
        cache): bitwise ``Int4Linear(int4.unpack(packed), bias)``."""
        module = cls.__new__(cls)
        torch.nn.Module.__init__(module)
        module._set(packed, bias)
        return module

    def _set(self, packed: int4.Packed, bias: torch.Tensor | None) -> None:
        self.register_buffer("packed", packed.data)
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())
        self.out_features, self.in_features = packed.out_features, packed.in_features
        self.groups_per_block = packed.groups_per_block

    @classmethod
    def quantized(cls, linear: torch.nn.Linear) -> Int4Linear:
        """A float Linear quantized to Q4_K's form (super-blocks of 8 groups, or 1 where `in` is not a multiple of
        256); its `in_features` must be a multiple of 32 (`fits`)."""
        blocks = 8 if linear.in_features % (8 * int4.GROUP) == 0 else 1
        return cls(int4.quantize(linear.weight.detach(), blocks), linear.bias)

    def layout(self) -> int4.Packed:
        return int4.Packed(self.packed, self.out_features, self.in_features, self.groups_per_block)

    @torch.no_grad()  # an inference kernel: the op has no gradient
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).float()  # (n, in)
        y = int4.linear(rows, self.layout(), self.bias)  # (n, out)
        return y.to(x.dtype).view(*x.shape[:-1], self.out_features)

    def groups(self) -> int4.Groups:
        return int4.unpack(self.layout())

    def dequantized(self) -> torch.Tensor:
        """(out, in) float32: the weight this module multiplies by (for tests and reports)."""
        return self.groups().dequantize()

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, " \
               f"groups_per_block={self.groups_per_block}, bias={self.bias is not None}"


def fits(linear: torch.nn.Linear) -> bool:
    """Whether a Linear's inputs split into groups of 32."""
    return linear.in_features % int4.GROUP == 0

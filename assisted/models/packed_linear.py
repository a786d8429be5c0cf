"""`PackedLinear`: a Linear whose weight lives in one of the project's kernel layouts (`Int4Linear`, `Q6KLinear`).

The weight is one uint8 buffer, ``packed``, in the layout its op reads; the bias a float32 buffer. A subclass names
its op's `layout` (the op's Packed record), `kernel` ((n, in) float32, layout, bias -> (n, out)) and `unpack`
(layout -> groups with ``dequantize()``).
"""

from __future__ import annotations

import torch

from drafting.masked_head import LANES


class PackedLinear(torch.nn.Module):
    """(..., in) -> (..., out) through a packed kernel; row-invariant as its kernel is.

    `only_blocks`: (m,) int64 blocks of 16 output columns the forwards compute, every other column -inf
    (`drafting.masked_head`); None (the default): every column.
    """

    kernel = None  # staticmethod: (x, layout, bias, blocks=None) -> y
    unpack = None  # staticmethod: layout -> groups
    only_blocks: torch.Tensor | None = None

    @classmethod
    def from_packed(cls, packed, bias: torch.Tensor | None = None):
        """The module of weights already in the kernel's layout (packed a few rows at a time, or read back from a
        cache): bitwise the module made from the groups `packed` holds."""
        module = cls.__new__(cls)
        torch.nn.Module.__init__(module)
        module._set(packed, bias)
        return module

    def _set(self, packed, bias: torch.Tensor | None) -> None:
        self.register_buffer("packed", packed.data)
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())
        self.out_features, self.in_features = packed.out_features, packed.in_features

    def layout(self):
        raise NotImplementedError

    @torch.no_grad()  # an inference kernel: the op has no gradient
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).float()  # (n, in)
        y = type(self).kernel(rows, self.layout(), self.bias) if self.only_blocks is None else self._blocks(rows)
        return y.to(x.dtype).view(*x.shape[:-1], self.out_features)

    def _blocks(self, rows: torch.Tensor) -> torch.Tensor:
        """(n, in) -> (n, out): the columns of `only_blocks`, -inf elsewhere."""
        part = type(self).kernel(rows, self.layout(), self.bias, self.only_blocks)  # (n, 16 m)
        blocks = -(-self.out_features // LANES)
        y = rows.new_full((len(rows), blocks, LANES), float("-inf"))  # (n, blocks, 16)
        y[:, self.only_blocks] = part.view(len(rows), -1, LANES)
        y = y.view(len(rows), -1)  # (n, 16 blocks)
        return y if y.shape[1] == self.out_features else y[:, : self.out_features].contiguous()

    def groups(self):
        return type(self).unpack(self.layout())

    def dequantized(self) -> torch.Tensor:
        """(out, in) float32: the weight this module multiplies by (for tests and reports)."""
        return self.groups().dequantize()

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"

"""`PackedLinear`: a Linear whose weight lives in one of the project's kernel layouts (`Int4Linear`, `Q6KLinear`).

The weight is one uint8 buffer, ``packed``, in the layout its op reads; the bias a float32 buffer. A subclass names
its op's `layout` (the op's Packed record), `kernel` ((n, in) float32, layout, bias -> (n, out)) and `unpack`
(layout -> groups with ``dequantize()``).
"""

from __future__ import annotations

import torch


class PackedLinear(torch.nn.Module):
    """(..., in) -> (..., out) through a packed kernel; row-invariant as its kernel is."""

    kernel = None  # staticmethod: (x, layout, bias) -> y
    unpack = None  # staticmethod: layout -> groups

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
        y = type(self).kernel(rows, self.layout(), self.bias)  # (n, out)
        return y.to(x.dtype).view(*x.shape[:-1], self.out_features)

    def groups(self):
        return type(self).unpack(self.layout())

    def dequantized(self) -> torch.Tensor:
        """(out, in) float32: the weight this module multiplies by (for tests and reports)."""
        return self.groups().dequantize()

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"

"""A 4-bit copy of an assistant for CPU drafting: group-wise int4 weights, computed by torch's int4 CPU kernel.

Each Linear's weight is cut into groups of `group_size` inputs per output row; a group keeps 4-bit codes and its
own scale and offset (asymmetric min-max rounding), so an outlier spoils only its group. The earlier
per-tensor dynamic int8 copy kept one scale per tensor; on Qwen2.5-Coder-0.5B that copy's argmax agreed with
the 1.5B target's less often than the 4-bit one (results: `docs/results.md`). Activations enter the kernel as
bfloat16 and the outputs come back in the input's dtype. Only the drafts change: the target verifies them, and
under sampling the drafts' distribution is the one the copy computed, so outputs stay exactly the target's.
"""

from __future__ import annotations

import copy

import torch

GROUP_SIZES = (32, 64, 128, 256)  # what torch's int4 CPU kernel accepts
OUT_MULTIPLE = 16  # the kernel packs output rows in blocks of 16
KERNEL_ROWS = 8  # inputs of at most this many rows use the int4 kernel; longer ones (prefills, forced runs) a
# bfloat16 matmul over the same dequantized weights, which costs less there (200 rows: 0.08 against 0.52 s over
# 24 of Qwen2.5-0.5B's MLP projections, one thread)


class Int4Linear(torch.nn.Module):
    """(..., in) -> (..., out): a Linear whose weight is held as group-wise 4-bit codes.

    A few rows (a drafting step) go through torch's int4 kernel; more rows through a bfloat16 copy of the same
    dequantized weight (2 bytes a weight in memory, read only by prefills and long catch-ups).
    """

    def __init__(self, linear: torch.nn.Linear, group_size: int = 32):
        super().__init__()
        out_features, in_features = linear.weight.shape
        if not fits(linear, group_size):
            raise ValueError(f"a {in_features} -> {out_features} Linear does not fit int4 groups of {group_size} "
                             f"(needs in % {group_size} == 0 and out % {OUT_MULTIPLE} == 0)")
        weight = linear.weight.detach().float().reshape(out_features, in_features // group_size, group_size)
        low, high = weight.amin(-1, keepdim=True), weight.amax(-1, keepdim=True)  # (out, groups, 1)
        scale = ((high - low) / 15).clamp(min=1e-12)
        codes = ((weight - low) / scale).round().clamp(0, 15).to(torch.int32).reshape(out_features, in_features)
        # the kernel dequantizes (code - 8) * scale + zero, so zero is the value of code 8
        zero = low + 8 * scale
        scale, zero = scale.to(torch.bfloat16), zero.to(torch.bfloat16)  # as the kernel reads them
        self.register_buffer("packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1))
        self.register_buffer("scales_and_zeros", torch.cat([scale, zero], -1).transpose(0, 1).contiguous())
        dense = (codes.reshape(weight.shape) - 8) * scale.float() + zero.float()  # (out, groups, group_size)
        self.register_buffer("dense", dense.reshape(out_features, in_features).to(torch.bfloat16))
        bias = None if linear.bias is None else linear.bias.detach().clone()
        self.register_buffer("bias", bias)
        self.in_features, self.out_features, self.group_size = in_features, out_features, group_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).to(torch.bfloat16)  # (n, in)
        if rows.shape[0] > KERNEL_ROWS:
            y = torch.nn.functional.linear(rows, self.dense)  # (n, out)
        else:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(rows, self.packed, self.group_size, self.scales_and_zeros)
        y = y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)  # (..., out)
        return y if self.bias is None else y + self.bias

    def dequantized(self) -> torch.Tensor:
        """(out, in) float32: the weight this module multiplies by (for tests and error reports)."""
        eye = torch.eye(self.in_features)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(eye.to(torch.bfloat16), self.packed, self.group_size,
                                                      self.scales_and_zeros)  # (in, out)
        return y.float().T.contiguous()


def fits(linear: torch.nn.Linear, group_size: int) -> bool:
    """Whether torch's int4 CPU kernel can hold this Linear's weight in groups of `group_size`."""
    out_features, in_features = linear.weight.shape
    return in_features % group_size == 0 and out_features % OUT_MULTIPLE == 0


def int4_copy(model: torch.nn.Module, group_size: int = 32) -> torch.nn.Module:
    """A copy of `model` whose Linear layers hold int4 weights (CPU); a faster, closer drafter than `int8_copy`.

    Parameters
    ----------
    model : torch.nn.Module
        A float model on the CPU (left unchanged).
    group_size : int
        Inputs per quantization group, one of `GROUP_SIZES`.

    Returns
    -------
    torch.nn.Module
        The copy, in eval mode. Every Linear whose shape the kernel cannot hold (`fits`) stays as it was.
        A replaced Linear keeps 2.5 bytes a weight: the 4-bit codes, and the bfloat16 copy long inputs use.

    Raises
    ------
    ValueError
        For a group size the kernel does not accept, a model off the CPU, or when no Linear fits.
    """
    if group_size not in GROUP_SIZES:
        raise ValueError(f"group_size must be one of {GROUP_SIZES}, not {group_size}")
    off_cpu = {str(p.device) for p in model.parameters() if p.device.type != "cpu"}
    if off_cpu:
        raise ValueError(f"int4_copy needs the model on the CPU (torch's int4 kernel here is CPU-only), not {off_cpu}")
    model = copy.deepcopy(model)
    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is torch.nn.Linear and fits(child, group_size):
                setattr(parent, name, Int4Linear(child, group_size))
                replaced += 1
    if not replaced:
        raise ValueError(f"no Linear layer of this model fits int4 groups of {group_size}")
    return model.eval()

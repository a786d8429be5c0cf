"""A GGUF's Q6_K weights as they are stored, times per-row int8 activations: a row-invariant CPU linear on any x86.

A weight matrix (out, in) is held as `Groups`: for each output column, groups of 16 inputs, each ``d * sc * (q - 32)``
with codes q in 0..63, an int8 sc per group and a float32 d (the file's fp16) per super-block of 16 groups. That is
Q6_K's own form, so a GGUF's Q6_K tensors (a Q4_K_M file's head and half of its v_proj and down_proj) are kept
exactly, in 6.6 bits a weight. `linear` quantizes each row of x as the int4 op does, sums each super-block exactly in
int32 and adds the super-blocks in float in one fixed order (structspec_ops/csrc/q6k_linear.cpp): a row's output is
bitwise the same whatever else the call holds. Its paths are the int4 op's ("amx", "vnni", "avx2", "portable":
bitwise the same output; its "amx" runs the VNNI code), and it runs the one `structspec_ops.int4.path()` names.

    from structspec_ops import q6k
    if q6k.built().ok:
        y = q6k.linear(x, q6k.pack(q6k.quantize(weight)), bias)   # (n, in) -> (n, out), in % 256 == 0
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from structspec_ops import int4
from structspec_ops.build import Built

GROUP = 16  # inputs per group
GROUPS = 16  # groups per super-block
SUPER = GROUP * GROUPS  # inputs per super-block
LANES = 16  # output columns per block of the packed layout
SUPER_BYTES = 64 + GROUPS * LANES + GROUPS * 192  # d, sc, codes of one (block, super-block)


def built() -> Built:
    """Whether the op library is loaded on this machine: the int4 op's library (`structspec_ops.int4.built`)."""
    return int4.built()


def kernel_name() -> str:
    """What runs the Q6_K Linears here, for stats: the int4 op's path, whose "amx" runs the VNNI code for this op."""
    path = int4.path()
    return f"q6k ({int4.PATHS['vnni' if path == 'amx' else path]})"


@dataclass(frozen=True)
class Groups:
    """An (out, in) weight as Q6_K groups: w[o, 16 j + t] = d[o, j // 16] * sc[o, j] * (codes[o, 16 j + t] - 32)."""

    codes: torch.Tensor  # (out, in) uint8 in 0..63
    sc: torch.Tensor  # (out, in / 16) int8
    d: torch.Tensor  # (out, in / 256) float32

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.codes.shape)

    def dequantize(self) -> torch.Tensor:
        """(out, in) float32: ``(d * sc) * (q - 32)`` in float32, as gguf (and so transformers) de-quantize Q6_K."""
        scale = self.d.repeat_interleave(GROUPS, 1) * self.sc.float()  # (out, in / 16), exact
        return scale.repeat_interleave(GROUP, 1) * (self.codes.float() - 32)

    def rows(self, index: torch.Tensor) -> Groups:
        """The groups of output rows `index`, in that order (a row permutation such as llama's q/k one)."""
        return Groups(*(t[index] for t in (self.codes, self.sc, self.d)))


@dataclass(frozen=True)
class Packed:
    """`Groups` in the kernel's layout: per block of 16 output columns one byte stream of super-blocks."""

    data: torch.Tensor  # (blocks * supers * SUPER_BYTES,) uint8
    out_features: int
    in_features: int


def quantize(weight: torch.Tensor) -> Groups:
    """Float weights (out, in) to `Groups` as Q6_K's simple quantizer does: per group of 16 its max-abs scale, the
    scales in int8 steps of d per super-block, the codes for those scales. ``in % 256 == 0``. A lossy copy."""
    out_features, in_features = weight.shape
    if in_features % SUPER:
        raise ValueError(f"in_features {in_features} is not a multiple of {SUPER} (Q6_K super-blocks)")
    w = weight.detach().float().reshape(out_features, -1, GROUP)  # (out, groups, 16)
    step = w.abs().amax(-1) / 31  # (out, groups): codes -31..31 around 32
    d = step.reshape(out_features, -1, GROUPS).amax(-1) / 127  # (out, supers)
    sc = (step / d.repeat_interleave(GROUPS, 1).clamp_min(1e-30)).round().clamp(-128, 127).to(torch.int8)
    scale = (d.repeat_interleave(GROUPS, 1) * sc.float()).clamp_min(1e-30)  # (out, groups)
    codes = (w / scale[..., None]).round().clamp(-32, 31) + 32
    return Groups(codes.to(torch.uint8).reshape(out_features, in_features), sc, d)


def pack(groups: Groups) -> Packed:
    """The kernel's layout of `groups` (columns padded with zero weights to a multiple of 16)."""
    out_features, in_features = groups.shape
    blocks, supers = -(-out_features // LANES), in_features // SUPER
    pad = blocks * LANES - out_features

    def lanes(t: torch.Tensor) -> torch.Tensor:  # (out, ...) -> (blocks, 16, ...), zero rows appended
        t = torch.cat([t, t.new_zeros(pad, *t.shape[1:])]) if pad else t
        return t.reshape(blocks, LANES, *t.shape[1:])

    d = lanes(groups.d).permute(0, 2, 1).contiguous().view(torch.uint8).reshape(blocks, supers, 64)
    sc = lanes(groups.sc).reshape(blocks, LANES, supers, GROUPS).permute(0, 2, 3, 1)  # (blocks, supers, g, lane)
    sc = sc.contiguous().view(torch.uint8).reshape(blocks, supers, GROUPS * LANES)
    # input 16 j + 4 i + b of lane l -> byte 4 l + b of vector i of group j
    q = lanes(groups.codes).reshape(blocks, LANES, -1, 4, 4).permute(0, 2, 3, 1, 4)  # (blocks, group, i, lane, b)
    q = q.reshape(blocks, -1, 4, 64)
    low = (q & 15)[:, :, 0::2] | ((q & 15)[:, :, 1::2] << 4)  # (blocks, group, 2, 64): vectors 0|1, 2|3
    top = (q >> 4)
    top = top[:, :, 0] | (top[:, :, 1] << 2) | (top[:, :, 2] << 4) | (top[:, :, 3] << 6)  # (blocks, group, 64)
    codes = torch.cat([low.reshape(blocks, -1, 128), top], 2).reshape(blocks, supers, GROUPS * 192)
    data = torch.cat([d, sc, codes], 2).reshape(-1)
    return Packed(data.contiguous(), out_features, in_features)


def unpack(packed: Packed) -> Groups:
    """The `Groups` that `packed` holds (the inverse of `pack`)."""
    out_features, in_features = packed.out_features, packed.in_features
    blocks, supers = -(-out_features // LANES), in_features // SUPER
    data = packed.data.reshape(blocks, supers, SUPER_BYTES)
    d = data[..., :64].contiguous().view(torch.float32).permute(0, 2, 1).reshape(-1, supers)
    sc = data[..., 64 : 64 + GROUPS * LANES].contiguous().view(torch.int8).reshape(blocks, supers, GROUPS, LANES)
    sc = sc.permute(0, 3, 1, 2).reshape(-1, supers * GROUPS)
    raw = data[..., 64 + GROUPS * LANES :].reshape(blocks, supers * GROUPS, 192)
    low, top = raw[..., :128].reshape(blocks, -1, 2, 64), raw[..., 128:]
    nibbles = torch.stack([low[:, :, 0] & 15, low[:, :, 0] >> 4, low[:, :, 1] & 15, low[:, :, 1] >> 4], 2)
    tops = torch.stack([(top >> s) & 3 for s in (0, 2, 4, 6)], 2)  # (blocks, group, i, 64)
    q = (nibbles | (tops << 4)).reshape(blocks, -1, 4, LANES, 4).permute(0, 3, 1, 2, 4)  # (blocks, lane, group, i, b)
    codes = q.reshape(-1, in_features)
    return Groups(codes[:out_features].contiguous(), sc[:out_features].contiguous(), d[:out_features].contiguous())


def from_blocks(raw: torch.Tensor) -> Groups:
    """(rows, bytes) a GGUF's raw Q6_K blocks of one tensor (210 bytes a block of 256 inputs: ql[128], qh[64],
    sc[16] int8, d fp16) -> its `Groups`, rows in the file's order. Decoded, not de-quantized."""
    blocks = raw.reshape(raw.shape[0], -1, 210)
    ql, qh = blocks[..., :128].reshape(*blocks.shape[:2], 2, 64), blocks[..., 128:192].reshape(*blocks.shape[:2], 2, 32)
    low = torch.cat([ql & 15, ql >> 4], -1)  # (rows, blocks, half, 128): inputs 0..127 of each half
    top = torch.cat([(qh >> s) & 3 for s in (0, 2, 4, 6)], -1)
    codes = (low | (top << 4)).reshape(raw.shape[0], -1)
    sc = blocks[..., 192:208].contiguous().view(torch.int8).reshape(raw.shape[0], -1)
    d = blocks[..., 208:210].contiguous().view(torch.float16)[..., 0].float()
    return Groups(codes.contiguous(), sc.contiguous(), d.contiguous())


def to_blocks(groups: Groups) -> torch.Tensor:
    """The inverse of `from_blocks` (rows, bytes): the file's bytes (d must be an fp16 value)."""
    rows = groups.shape[0]
    q = groups.codes.reshape(rows, -1, 2, 4, 32)  # (rows, blocks, half, quarter, 32)
    low, top = q & 15, q >> 4
    ql = torch.cat([low[:, :, :, 0] | (low[:, :, :, 2] << 4), low[:, :, :, 1] | (low[:, :, :, 3] << 4)], -1)
    qh = top[:, :, :, 0] | (top[:, :, :, 1] << 2) | (top[:, :, :, 2] << 4) | (top[:, :, :, 3] << 6)
    sc = groups.sc.reshape(rows, -1, 16).view(torch.uint8)
    d = groups.d.half().reshape(rows, -1, 1).view(torch.uint8)
    return torch.cat([ql.reshape(rows, -1, 128), qh.reshape(rows, -1, 64), sc, d], -1).reshape(rows, -1)


def linear(x: torch.Tensor, packed: Packed, bias: torch.Tensor | None = None,
           blocks: torch.Tensor | None = None) -> torch.Tensor:
    """(n, in) float32 -> (n, out): x times the packed Q6_K weight, plus `bias`; row-invariant.

    With `blocks` (int64 indices of 16-column blocks), only those blocks are computed: (n, 16 * len(blocks)), block
    j's columns at 16 j..16 j + 15, each bitwise the full call's. Runs `structspec_ops.int4.path()`. Raises
    RuntimeError unless `built().ok`.
    """
    if x.shape[-1] != packed.in_features:
        raise ValueError(f"x has {x.shape[-1]} features, the weight takes {packed.in_features}")
    if not built().ok:
        raise RuntimeError(f"the Q6_K kernel is not available: {built().reason}")
    return torch.ops.structspec.q6k_linear(x.contiguous(), packed.data, bias, packed.out_features, blocks,
                                           int4.path())

"""4-bit weights in groups of 32 times per-row int8 activations: a row-invariant CPU linear on any x86 CPU.

A weight matrix (out, in) is held as `Groups`: for each output column, groups of 32 inputs, each ``scale * q +
offset`` with codes q in 0..15, ``scale = d * sc`` and ``offset = -(dmin * m)``; d and dmin are float32 per
super-block of `groups_per_block` groups, sc and m are bytes per group. That is Q4_K's own form (8 groups a block,
6-bit sc and m), and Q4_0's and Q4_1's with one group a block and sc = m = 1, so a GGUF's 4-bit weights are kept
exactly. `linear` quantizes each row of x with its own max-abs scale inside the op, sums each group in int32 and
adds the groups in float in one fixed order (structspec_ops/csrc/int4_linear.cpp): a row's output is bitwise the same
whatever other rows, threads or output columns share the call. Four paths run it, the best the CPU has: "amx"
(AMX-INT8 tiles for 16 rows at a time, the rest as "vnni"), "vnni" (AVX-512 VNNI), "avx2" (AVX2 + FMA) and "portable"
(plain C++); their int32 sums are exact and their float steps the same IEEE operations in the same order, so all
give bitwise the same output: one model on every x86 CPU.

    from structspec_ops import int4
    if int4.built().ok:
        packed = int4.pack(int4.quantize(weight))   # weight (out, in) float32, in % 256 == 0
        y = int4.linear(x, packed, bias)             # (n, in) -> (n, out)
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from structspec_ops.build import Built, load

GROUP = 32  # inputs per group
MAX_GROUPS_PER_BLOCK = 8  # groups a super-block holds at most (Q4_K's 8; the op keeps one block's sums on its stack)
LANES = 16  # output columns per block of the packed layout (one AVX-512 register)
CODE_BYTES = GROUP * LANES // 2  # code bytes per (block, group)
# No -m flags: each path's code carries its own target (#pragma GCC target), chosen at run time by the CPU's cpuid.
# -fopenmp: without it at::parallel_for compiles to a serial loop (the op ran on one core at any thread count).
CFLAGS = ("-ffp-contract=off", "-fopenmp")
PATHS = {"amx": "AMX-INT8", "vnni": "AVX-512 VNNI", "avx2": "AVX2", "portable": "portable C++"}  # best first
PATH_VARIABLE = "STRUCTSPEC_INT4_PATH"  # names a path to run instead of the best one (tests, comparisons)
_forced: list[str] = []


# One library for the quantized linears and the decoder layer that calls them (structspec_ops.q6k, .decoder).
SOURCES = ("int4_linear.cpp", "q6k_linear.cpp", "decoder_layer.cpp")


@functools.cache
def built() -> Built:
    """Whether the op library is loaded on this machine (built once; else ``reason`` says why in one line)."""
    return load("quantized", SOURCES, CFLAGS)


@functools.cache
def paths() -> tuple[str, ...]:
    """The paths this CPU runs, best first ("portable" always; empty where the library did not build)."""
    return tuple(torch.ops.structspec.int4_paths()) if built().ok else ()


def path() -> str:
    """The path `linear` runs: `forced_path`'s, else ``$STRUCTSPEC_INT4_PATH``, else the best in `paths()`."""
    return _forced[-1] if _forced else _default_path()


@functools.cache
def _default_path() -> str:
    return _checked(os.environ.get(PATH_VARIABLE) or (paths() or ("portable",))[0])


def _checked(name: str) -> str:
    if name not in PATHS:
        raise ValueError(f"unknown int4 path {name!r}: one of {', '.join(PATHS)}")
    if built().ok and name not in paths():
        raise ValueError(f"this CPU cannot run the int4 path {name!r} (it runs {', '.join(paths())})")
    return name


def kernel_name() -> str:
    """What runs the 4-bit Linears here, for stats: e.g. "int4 (AVX-512 VNNI)", "int4 (AVX2)"."""
    return f"int4 ({PATHS[path()]})"


@contextlib.contextmanager
def forced_path(name: str) -> Iterator[None]:
    """Run `linear` on the path `name` inside the block (all paths give bitwise the same output; only speed)."""
    _forced.append(_checked(name))  # refuses an unknown path, or one this CPU cannot run
    try:
        yield
    finally:
        _forced.pop()


@dataclass(frozen=True)
class Groups:
    """An (out, in) weight as 4-bit groups: w[o, 32 j + t] = (d * sc)[o, j] * codes[o, 32 j + t] - (dmin * m)[o, j],
    with d and dmin repeated over the `groups_per_block` groups of a super-block."""

    codes: torch.Tensor  # (out, in) uint8 in 0..15
    d: torch.Tensor  # (out, in / (32 G)) float32
    dmin: torch.Tensor  # (out, in / (32 G)) float32
    sc: torch.Tensor  # (out, in / 32) uint8
    m: torch.Tensor  # (out, in / 32) uint8

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.codes.shape)

    @property
    def groups_per_block(self) -> int:
        return self.sc.shape[1] // self.d.shape[1]

    def scale_offset(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(out, in / 32) float32 each: every group's scale d * sc and offset -(dmin * m)."""
        g = self.groups_per_block
        return self.d.repeat_interleave(g, 1) * self.sc.float(), -(self.dmin.repeat_interleave(g, 1) * self.m.float())

    def dequantize(self) -> torch.Tensor:
        """(out, in) float32: scale * q + offset per weight, as gguf and transformers de-quantize Q4_K (for a GGUF's
        groups every product is exact and the sum rounds once)."""
        scale, offset = (t.repeat_interleave(GROUP, 1) for t in self.scale_offset())
        return scale * self.codes.float() + offset

    def rows(self, index: torch.Tensor) -> Groups:
        """The groups of output rows `index`, in that order (a row permutation such as llama's q/k one)."""
        return Groups(*(t[index] for t in (self.codes, self.d, self.dmin, self.sc, self.m)))


@dataclass(frozen=True)
class Packed:
    """`Groups` in the kernel's layout: per block of 16 output columns one byte stream of super-blocks."""

    data: torch.Tensor  # (blocks * supers * bytes per super-block,) uint8
    out_features: int
    in_features: int
    groups_per_block: int


def groups_per_block_for(in_features: int) -> int:
    """The super-block `quantize` should use for `in_features` (a multiple of 32): Q4_K's 8 groups where they fit,
    else the largest count below 8 that divides the row (Qwen2.5-0.5B's 896 inputs: 7 groups of 32), so that d and
    dmin are shared by several groups rather than stored per group (4.8 bits a weight against 6.5)."""
    groups = in_features // GROUP
    return next(g for g in range(8, 0, -1) if groups % g == 0)


def quantize(weight: torch.Tensor, groups_per_block: int = 8) -> Groups:
    """Float weights (out, in) to `Groups` the way Q4_K's simple quantizer does: per group its min-max range (the
    minimum clipped to <= 0), then d, dmin per super-block with 6-bit sc, m, then the codes for those scales.

    ``in`` must be a multiple of 32 * `groups_per_block`. Not exact: a lossy 4.75-bit copy of a float weight.
    """
    out_features, in_features = weight.shape
    if not 1 <= groups_per_block <= MAX_GROUPS_PER_BLOCK:
        raise ValueError(f"groups_per_block {groups_per_block} is not in 1..{MAX_GROUPS_PER_BLOCK}")
    if in_features % (GROUP * groups_per_block):
        raise ValueError(f"in_features {in_features} is not a multiple of {GROUP * groups_per_block} "
                         f"({groups_per_block} groups of {GROUP})")
    w = weight.detach().float().reshape(out_features, -1, GROUP)  # (out, groups, 32)
    low = w.amin(-1).clamp(max=0.0)  # (out, groups): offset = low <= 0
    step = (w.amax(-1) - low) / 15  # (out, groups)
    blocks = (out_features, -1, groups_per_block)
    d = step.reshape(blocks).amax(-1) / 63  # (out, supers)
    dmin = (-low).reshape(blocks).amax(-1) / 63
    sc = _codes(step.reshape(blocks), d, 63).reshape(out_features, -1)
    m = _codes((-low).reshape(blocks), dmin, 63).reshape(out_features, -1)
    groups = Groups(torch.zeros(out_features, in_features, dtype=torch.uint8), d, dmin, sc, m)
    scale, offset = groups.scale_offset()  # (out, groups)
    codes = ((w - offset[..., None]) / scale.clamp_min(1e-30)[..., None]).round().clamp(0, 15)
    return Groups(codes.to(torch.uint8).reshape(out_features, in_features), d, dmin, sc, m)


def _codes(values: torch.Tensor, unit: torch.Tensor, top: int) -> torch.Tensor:
    """round(values / unit) in 0..top as uint8; values (out, supers, G), unit (out, supers); 0 where unit is 0."""
    ratio = values / unit.clamp_min(1e-30)[..., None]
    return ratio.round().clamp(0, top).to(torch.uint8)


def pack(groups: Groups) -> Packed:
    """The kernel's layout of `groups` (columns padded with zero weights to a multiple of 16)."""
    (out_features, in_features), g = groups.shape, groups.groups_per_block
    blocks, supers = -(-out_features // LANES), groups.d.shape[1]
    pad = blocks * LANES - out_features

    def lanes(t: torch.Tensor) -> torch.Tensor:  # (out, ...) -> (blocks, 16, ...), zero rows appended
        t = torch.cat([t, t.new_zeros(pad, *t.shape[1:])]) if pad else t
        return t.reshape(blocks, LANES, *t.shape[1:])

    floats = torch.stack([lanes(groups.d), lanes(groups.dmin)], 2)  # (blocks, 16, 2, supers)
    floats = floats.permute(0, 3, 2, 1).contiguous().view(torch.uint8).reshape(blocks, supers, 128)
    sc_m = torch.stack([lanes(groups.sc), lanes(groups.m)], 2).reshape(blocks, LANES, 2, supers, g)
    sc_m = sc_m.permute(0, 3, 2, 4, 1).reshape(blocks, supers, 2 * g * LANES)  # [sc: G x 16][m: G x 16]
    # codes: input 32 j + 16 h + 4 i + b of lane l -> byte 4 l + b of vector i of group j, nibble h
    codes = lanes(groups.codes).reshape(blocks, LANES, -1, 2, 4, 4)  # (blocks, lane, group, h, i, b)
    codes = codes.permute(0, 2, 3, 4, 1, 5)  # (blocks, group, h, i, lane, b)
    codes = (codes[:, :, 0] | (codes[:, :, 1] << 4)).reshape(blocks, supers, g * CODE_BYTES)
    data = torch.cat([floats, sc_m, codes], 2).reshape(-1)
    return Packed(data.contiguous(), out_features, in_features, g)


def unpack(packed: Packed) -> Groups:
    """The `Groups` that `packed` holds (the inverse of `pack`)."""
    out_features, in_features, g = packed.out_features, packed.in_features, packed.groups_per_block
    blocks, supers = -(-out_features // LANES), in_features // (GROUP * g)
    data = packed.data.reshape(blocks, supers, -1)
    floats = data[..., :128].contiguous().view(torch.float32).reshape(blocks, supers, 2, LANES)
    d, dmin = (floats[:, :, i].permute(0, 2, 1).reshape(-1, supers)[:out_features] for i in (0, 1))
    sc_m = data[..., 128 : 128 + 2 * g * LANES].reshape(blocks, supers, 2, g, LANES).permute(0, 4, 2, 1, 3)
    sc, m = (sc_m[:, :, i].reshape(-1, supers * g)[:out_features] for i in (0, 1))
    nibbles = data[..., 128 + 2 * g * LANES :].reshape(blocks, supers * g, 4, LANES, 4)  # (blocks, group, i, lane, b)
    codes = torch.stack([nibbles & 15, nibbles >> 4], 2)  # (blocks, group, h, i, lane, b)
    codes = codes.permute(0, 4, 1, 2, 3, 5).reshape(-1, in_features)[:out_features]
    return Groups(codes.contiguous(), d.contiguous(), dmin.contiguous(), sc.contiguous(), m.contiguous())


def linear(x: torch.Tensor, packed: Packed, bias: torch.Tensor | None = None,
           blocks: torch.Tensor | None = None) -> torch.Tensor:
    """(n, in) float32 -> (n, out): x times the packed 4-bit weight, plus `bias`; row-invariant.

    With `blocks` (int64 indices of 16-column blocks), only those blocks are computed: (n, 16 * len(blocks)), block
    j's columns at 16 j..16 j + 15, each bitwise the full call's. Runs `path()`. Raises RuntimeError unless
    `built().ok`.
    """
    if x.shape[-1] != packed.in_features:
        raise ValueError(f"x has {x.shape[-1]} features, the weight takes {packed.in_features}")
    if not built().ok:
        raise RuntimeError(f"the int4 kernel is not available: {built().reason}")
    return torch.ops.structspec.int4_linear(x.contiguous(), packed.data, bias, packed.out_features,
                                            packed.groups_per_block, blocks, path())

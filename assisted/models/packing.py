"""Pre-packed CPU weights: cheaper multi-token target forwards, the forwards that verify drafts.

On a CPU one decoding step multiplies one row by each weight matrix (matrix-vector, bound by memory
bandwidth), but a verification multiplies 2-20 rows, and the dense matrix-matrix kernel then costs several
steps on small row counts. oneDNN runs the same product from a copy of the weight reordered once into its
blocked layout, often at about the cost of one row. Where the packed kernel starts to win depends on the
machine and its load, so by default `pack_linear_weights` times both kernels once per weight shape, from 1
row, and uses the packed copy from the smallest row count where it is faster: a model that decodes at least as
fast and verifies cheaply (`docs/results.md` has the measured curves).

The cost is memory: every packed Linear keeps a second copy of its weight (a 1.5B float32 model: +6 GB).
Outputs agree with the dense kernel to float rounding (a different summation order, as any change of
kernel or row count gives); greedy speculation stays token-identical where the top two logits are not
within rounding of each other, the same caveat as verification with the dense matrix-matrix kernel.
"""

from __future__ import annotations

import statistics
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F

PACKABLE_DTYPES = (torch.float32, torch.bfloat16)
CALIBRATION_ROWS = (1, 2, 3, 4, 8, 16)  # row counts timed per weight shape when min_rows is measured
_PACKED: weakref.WeakSet = weakref.WeakSet()  # models whose Linear forwards run packed now


def is_packed(model: torch.nn.Module) -> bool:
    """Whether `model`'s Linear forwards run packed (costs measured on it differ from the dense model's)."""
    return model in _PACKED


@dataclass(frozen=True)
class PackedLinears:
    """The Linear modules `pack_linear_weights` packed; `unpack()` restores their dense forward."""

    model: torch.nn.Module
    modules: tuple[torch.nn.Linear, ...]
    forwards: tuple[Callable[[torch.Tensor], torch.Tensor], ...]  # the packed forward of each module
    min_rows: Mapping[tuple[int, int], int | None]  # weight shape (out, in) -> rows from which it runs packed

    def unpack(self) -> None:
        _PACKED.discard(self.model)
        for module in self.modules:
            module.__dict__.pop("forward", None)

    @contextmanager
    def dense(self) -> Iterator[None]:
        """Inside the block every row count runs the dense kernel (to time or compare both)."""
        self.unpack()
        try:
            yield
        finally:
            self._install()

    def _install(self) -> None:
        for module, forward in zip(self.modules, self.forwards):
            module.forward = forward
        _PACKED.add(self.model)


def pack_linear_weights(model: torch.nn.Module, min_rows: int | None = None, batch_hint: int = 8) -> PackedLinears:
    """Give every CPU Linear of `model` a oneDNN pre-packed copy of its weight for forwards over `min_rows`
    or more rows (tokens); fewer rows keep the dense kernel.

    Parameters
    ----------
    model : torch.nn.Module
        A model on the CPU with float32 or bfloat16 Linear weights (typically the target: the assistant
        drafts one row at a time and would only pay the memory). Quantized modules are left alone.
    min_rows : int or None
        Forwards over at least this many rows use the packed weight. None (the default) measures it once
        per weight shape on this machine: both kernels are timed at `CALIBRATION_ROWS` (a few seconds for
        a 1.5B model) and the packed one is used from the smallest row count where it is at least 5%
        faster at every larger count timed; a shape where it never is stays dense, without a copy.
    batch_hint : int
        The row count oneDNN chooses the packed layout for.

    Returns
    -------
    PackedLinears
        The packed modules and the row threshold chosen per weight shape; `.unpack()` restores the dense
        forward (the copies go with the handle).

    Raises
    ------
    RuntimeError
        This torch build has no oneDNN (MKL-DNN) or lacks its linear ops.
    ValueError
        A Linear weight is not on the CPU, or not float32/bfloat16, or the model has no Linear at all.

    Notes
    -----
    The copies are a snapshot: pack after loading, moving and converting the model, and pack again after
    changing its weights. Measure with the thread count generation will use.
    """
    if min_rows is not None and min_rows < 1:
        raise ValueError(f"min_rows must be at least 1, got {min_rows}")
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")):
        raise RuntimeError("pack_linear_weights needs a torch build with oneDNN (MKL-DNN) linear ops")
    linears = [(name, m) for name, m in model.named_modules() if type(m) is torch.nn.Linear]
    if not linears:
        raise ValueError("pack_linear_weights: the model has no torch.nn.Linear module to pack")
    for name, module in linears:
        w = module.weight
        if w.device.type != "cpu" or w.dtype not in PACKABLE_DTYPES:
            raise ValueError(f"pack_linear_weights: {name or 'model'}.weight is {w.dtype} on {w.device}; "
                             f"packing needs float32 or bfloat16 on the CPU")
    by_shape: dict[tuple[int, int], list[torch.nn.Linear]] = {}
    for _, module in linears:
        by_shape.setdefault(tuple(module.weight.shape), []).append(module)
    thresholds: dict[tuple[int, int], int | None] = {}
    modules, forwards = [], []
    with torch.inference_mode():
        for shape, group in by_shape.items():
            weights = [_reorder(group[0], batch_hint)]  # the first module's copy is also what gets timed
            thresholds[shape] = min_rows or _measure_min_rows(group[0], weights[0])
            if thresholds[shape] is None:
                continue  # this shape stays dense, without copies
            weights += [_reorder(module, batch_hint) for module in group[1:]]
            modules += group
            forwards += [_packed_forward(m, w, thresholds[shape]) for m, w in zip(group, weights)]
    packed = PackedLinears(model, tuple(modules), tuple(forwards), thresholds)
    packed._install()
    return packed


def smallest_winning_rows(dense: Mapping[int, float], packed: Mapping[int, float], margin: float = 0.95) -> int | None:
    """The smallest row count from which the packed kernel's seconds are within `margin` x the dense
    kernel's at every larger count timed; None where it loses at the largest."""
    winning = None
    for rows in sorted(dense, reverse=True):
        if packed[rows] > margin * dense[rows]:
            break
        winning = rows
    return winning


def _measure_min_rows(module: torch.nn.Linear, packed_weight: torch.Tensor, repeats: int = 3) -> int | None:
    weight, bias = module.weight.detach(), None if module.bias is None else module.bias.detach()
    dense, packed = {}, {}
    for rows in CALIBRATION_ROWS:
        x = torch.randn(rows, weight.shape[1], dtype=weight.dtype)  # (rows, in)
        dense[rows] = _median_seconds(lambda: F.linear(x, weight, bias), repeats)
        packed[rows] = _median_seconds(lambda: _packed_linear(x, packed_weight, bias), repeats)
    return smallest_winning_rows(dense, packed)


def _median_seconds(call: Callable[[], object], repeats: int) -> float:
    call()  # warm-up: first-call dispatch and allocation
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def _packed_forward(module: torch.nn.Linear, packed: torch.Tensor, min_rows: int):
    weight, bias = module.weight, module.bias  # (out, in), (out,) or None
    packed_bias = None if bias is None else bias.detach()

    def forward(x: torch.Tensor) -> torch.Tensor:  # (..., in) -> (..., out)
        if x.numel() < min_rows * x.shape[-1] or x.dtype != weight.dtype:
            return F.linear(x, weight, bias)
        return _packed_linear(x.contiguous(), packed, packed_bias)

    return forward


def _reorder(module: torch.nn.Linear, batch_hint: int) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(module.weight.detach(), batch_hint)


def _packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")  # (..., in) -> (..., out)

"""Packed weights in transparent huge pages: a decode step streams every weight once, 4 KB page after 4 KB page.

A one-row step of Qwen2.5-Coder 1.5B's int4 target reads about a gigabyte of packed weights: some 250,000 pages of
4 KB, each a TLB entry to walk to. `into_huge_pages` moves the packed weights the kernels read (each `PackedLinear`'s
and the fused layers' merged ones: `assisted.models.fused_layers.packed_places`) into one buffer aligned to 2 MB that
Linux is asked to back with transparent huge pages (`madvise(MADV_HUGEPAGE)` before any of its pages is touched;
where the kernel says no, or on another system, it is an ordinary buffer). The bytes are copied as they are, so every
output is bitwise the same. Weights move one storage at a time, each freed once nothing points to it any more: the
load's peak grows by one storage, not by the model.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys
from collections import defaultdict
from collections.abc import Callable, Iterator

import torch

HUGE_PAGE = 2 << 20  # bytes: x86's transparent huge page
ALIGN = 64  # bytes: each tensor's start in the buffer (a cache line)
TRIM_EVERY = 64 << 20  # bytes moved between asks to hand freed memory back to the system
_MADV_HUGEPAGE = 14  # linux/mman.h


@functools.cache
def _libc():
    return ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True) if sys.platform.startswith("linux") else None


def _hand_back_freed() -> None:
    """Ask glibc's allocator to return the memory of freed tensors to the system (it keeps it otherwise)."""
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


def huge_buffer(nbytes: int) -> torch.Tensor:
    """(nbytes,) uint8, uninitialized, starting on a 2 MB boundary; on Linux advised to be backed by huge pages."""
    raw = torch.empty(nbytes + HUGE_PAGE, dtype=torch.uint8)
    start = (-raw.data_ptr()) % HUGE_PAGE
    buffer = raw[start : start + nbytes]  # a view: keeps `raw` alive
    libc = _libc()
    if libc is not None and nbytes >= HUGE_PAGE:
        length = -(-nbytes // HUGE_PAGE) * HUGE_PAGE  # within raw: it has HUGE_PAGE bytes to spare
        libc.madvise(ctypes.c_void_p(buffer.data_ptr()), ctypes.c_size_t(length), _MADV_HUGEPAGE)  # best effort
    return buffer


def into_huge_pages(places: Iterator[tuple[torch.Tensor, Callable[[torch.Tensor], None]]]) -> int:
    """Move the tensors of `places` ((a contiguous tensor, a function that puts its replacement where it is held),
    several of them may view one storage) into one `huge_buffer`, each storage whole, its views views into the
    buffer; returns the buffer's bytes (0: nothing to move). An iterator, so that nothing else holds the old tensors
    while they move."""
    refs = defaultdict(list)  # storage address -> its places
    for tensor, put in places:
        if not tensor.is_contiguous():
            raise ValueError("a tensor that is not contiguous cannot move")
        refs[tensor.untyped_storage().data_ptr()].append((tensor, put))
    if not refs:
        return 0
    layout, total = {}, 0
    for storage, held in refs.items():
        layout[storage] = total = -(-total // ALIGN) * ALIGN
        total += held[0][0].untyped_storage().nbytes()
    buffer, unreturned = huge_buffer(total), 0
    while refs:
        storage, held = refs.popitem()
        old = held[0][0].untyped_storage()
        base, unreturned = layout[storage], unreturned + old.nbytes()
        buffer[base : base + old.nbytes()].copy_(torch.empty(0, dtype=torch.uint8).set_(old))
        for tensor, put in held:  # the same bytes, now in the buffer; the old storage goes with its last holder
            start = base + tensor.storage_offset() * tensor.element_size()
            put(buffer[start : start + tensor.nbytes].view(tensor.dtype).view(tensor.shape))
        del old, held
        if unreturned >= TRIM_EVERY:
            _hand_back_freed()
            unreturned = 0
    _hand_back_freed()
    return total

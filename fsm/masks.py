"""Fresh all-False masks over a vocabulary, cut from slabs of several masks at once.

A state's mask is a (vocab_size,) bool array, ~150 KB for a 151k vocabulary; most states allow a few tokens (a key's
prefixes). Allocated one by one, such a mask comes from the C heap, whose calloc clears all of it, and the heap's
top is given back to the system and taken again as large temporaries come and go: ~30 page faults and ~75 us a mask
on a first walk. A slab of several masks is mapped fresh and zero, and a mask's pages are touched only where a token
is set. The slab is mapped by `mmap` itself, not by numpy: once numpy has freed a large array, the C heap serves
allocations of a slab's size from memory it clears whole (a quarter of a first walk's page faults). The rows are
views: a slab is unmapped once all its masks are gone.

Each token index cuts its masks from its own slabs (`MaskSlabs`), which grow from one mask to SLAB_BYTES, so that a
small index holds little more than its masks and the masks of one index go when it goes. Taken under
`fsm.budget.BUILD_LOCK`, as every first visit is.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

SLAB_BYTES = 2 << 20  # largest slab: under numpy's 4 MiB for huge pages (their first touch costs more than it saves)


@dataclass(eq=False)
class MaskSlabs:
    """Fresh (size,) bool masks, all False, for one owner: `take` one; the slabs double up to SLAB_BYTES."""

    size: int
    _rows: Iterator[np.ndarray] = field(default_factory=lambda: iter(()), repr=False)
    _next_count: int = 1

    def take(self) -> np.ndarray:
        """A fresh all-False (size,) bool mask (a row of a slab)."""
        row = next(self._rows, None)
        if row is None:
            self._rows = iter(_mapped_zeros(self._next_count, self.size))
            self._next_count = min(2 * self._next_count, max(1, SLAB_BYTES // max(self.size, 1)))
            row = next(self._rows)
        return row


def fresh_mask(size: int) -> np.ndarray:
    """One (size,) bool mask, all False, mapped alone (a head walk's tokens: kept as long as the walk)."""
    return _mapped_zeros(1, size)[0]


def _mapped_zeros(count: int, size: int) -> np.ndarray:
    """(count, size) bool, all False, in fresh pages of their own (a page is faulted in when first written)."""
    if not count * size:
        return np.zeros((count, size), dtype=bool)
    return np.frombuffer(mmap.mmap(-1, count * size), dtype=bool).reshape(count, size)

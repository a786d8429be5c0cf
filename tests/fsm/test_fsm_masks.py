"""Masks cut from slabs (fsm.masks): each fresh and all False, apart from every other mask taken, slabs doubling up to
SLAB_BYTES; a guide's masks stay apart when many states are visited."""

from __future__ import annotations

import json

try:
    import resource
except ImportError:  # not on Windows
    resource = None

import numpy as np
import pytest

import fsm
from fsm import masks
from fsm.masks import MaskSlabs


def test_masks_are_fresh_zero_and_apart():
    slabs = MaskSlabs(1000)
    taken = [slabs.take() for _ in range(40)]
    assert all(m.shape == (1000,) and m.dtype == bool and not m.any() for m in taken)
    for i, mask in enumerate(taken):
        mask[i] = True  # writing one touches no other
    assert [int(np.flatnonzero(m)[0]) for m in taken] == list(range(40))
    assert all(int(m.sum()) == 1 for m in taken)


def test_slabs_double_up_to_the_bound(monkeypatch):
    monkeypatch.setattr(masks, "SLAB_BYTES", 8 * 100)
    slabs = MaskSlabs(100)
    bases = [slabs.take().base for _ in range(1 + 2 + 4 + 8 + 8)]
    sizes = [_masks_in(b, 100) for b in _distinct(bases)]
    assert sizes == [1, 2, 4, 8, 8]


def test_a_mask_larger_than_a_slab_comes_alone(monkeypatch):
    monkeypatch.setattr(masks, "SLAB_BYTES", 10)
    slabs = MaskSlabs(100)
    assert [_masks_in(slabs.take().base, 100) for _ in range(3)] == [1, 1, 1]


@pytest.mark.skipif(resource is None, reason="page faults are counted where the resource module is")
@pytest.mark.parametrize("fresh", ["slab", "alone"])
def test_a_mask_is_faulted_in_only_where_written(fresh):
    for _ in range(3):  # numpy frees a large array: the C heap would now serve a mask from memory it clears whole
        np.ones(3 << 20, dtype=np.int8)
        slabs = MaskSlabs(151_936)
        take = slabs.take if fresh == "slab" else lambda: masks.fresh_mask(151_936)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        taken = [take() for _ in range(1 + 2 + 4)]
        for i, mask in enumerate(taken):
            mask[i * 4096] = True
        assert resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before < 16  # 7 pages written, not 7 * 38
        assert [int(np.flatnonzero(m)[0]) for m in taken] == [i * 4096 for i in range(7)]  # zero, and apart


def test_guide_masks_stay_apart(smol_tokenizer):
    schema = {"type": "object", "properties": {f"key{i}": {"type": "integer"} for i in range(12)}}
    guide = fsm.Guide.from_schema(schema, smol_tokenizer, property_order="any")
    text = json.dumps({f"key{i}": i for i in range(12)}, separators=(",", ":"))
    seen = []
    for token in smol_tokenizer.encode(text, add_special_tokens=False):
        seen.append((guide.mask().clone(), guide.mask()))
        guide.advance(token)
    assert all(bool(copy.equal(mask)) for copy, mask in seen)  # no later state wrote into an earlier mask


def _masks_in(base, size: int) -> int:
    """Masks of `size` bytes in the slab `base` (the buffer a mask is a view of)."""
    return memoryview(base).nbytes // size


def _distinct(arrays):
    out, ids = [], set()
    for a in arrays:
        if id(a) not in ids:
            ids.add(id(a))
            out.append(a)
    return out

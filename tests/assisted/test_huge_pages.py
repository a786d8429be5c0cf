"""assisted.models.huge_pages: the packed weights move into one buffer of huge pages, bitwise as they were."""

from __future__ import annotations

import pytest
import torch

from assisted.models.fused_layers import FusedDecoderLayer, packed_places
from assisted.models.huge_pages import HUGE_PAGE, huge_buffer, into_huge_pages
from assisted.models.int4_models import quantize_int4
from assisted.models.packed_linear import PackedLinear
from structspec_ops import int4
from tests.helpers_models import tiny_llama

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.skipif(not int4.built().ok, reason=f"int4 kernel unavailable: {int4.built().reason}")]


def _packed(model):
    layers = [m for m in model.modules() if isinstance(m, FusedDecoderLayer)]
    return [m.packed for m in model.modules() if isinstance(m, PackedLinear)] + \
        [t for layer in layers for weights in (layer.ins, layer.outs) for t in weights.packed]


def test_a_buffer_starts_on_a_huge_page():
    for nbytes in (1, HUGE_PAGE + 3, 3 * HUGE_PAGE):
        buffer = huge_buffer(nbytes)
        assert buffer.numel() == nbytes and buffer.data_ptr() % HUGE_PAGE == 0


def test_every_packed_weight_moves_into_one_buffer_and_the_forward_is_bitwise_the_same():
    model = quantize_int4(tiny_llama(300, seed=0, layers=2, hidden=256))  # fused layers, a Q6_K head: moved once
    assert len({t.untyped_storage().data_ptr() for t in _packed(model)}) == 1
    ids = torch.randint(0, 300, (1, 9), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        before = model(ids).logits
        copies = [t.clone() for t in _packed(model)]
        moved = into_huge_pages(packed_places(model))  # again: from one buffer into another
        after = model(ids).logits
    assert moved >= sum(t.nbytes for t in copies)
    assert all(torch.equal(a, b) for a, b in zip(copies, _packed(model)))
    assert torch.equal(before, after)
    layer = next(m for m in model.modules() if isinstance(m, FusedDecoderLayer))
    gate = layer.mlp.gate_proj.packed  # a module's bytes stay a view into its layer's merged weight
    assert gate.data_ptr() == layer.outs.packed[1].data_ptr()

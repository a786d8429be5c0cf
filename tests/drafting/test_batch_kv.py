"""BatchKV: rows of different lengths on one physical cache hold what each row's own cache would hold.

After any sequence of padded forwards, crops, refills and drops, row r's valid prefix equals the keys and values, in
every layer, of a single-row DynamicCache fed the same tokens, and its logits at every fed position equal that row's
(to float32 rounding: each held to a float64 copy of the model, `tests.helpers_rounding.assert_same_function`);
every stored value, holes included, is finite.
"""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from drafting.batch_kv import BatchKV, _widened, check_batch_model
from tests.helpers_models import tiny_gpt2, tiny_llama
from tests.helpers_rounding import assert_same_function, float64_copy

pytestmark = [pytest.mark.usefixtures("one_thread")]


def alone(model, ids: list[int]):
    """(the single-row cache of `ids` run alone without padding, logits (n, V) at every position)."""
    cache = DynamicCache()
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([ids]), cache=cache, use_cache=True)
    return cache, out.logits[0]


def assert_rows_match(model, kv: BatchKV, logits: torch.Tensor, cached: list[list[int]], feeds: list[list[int]]):
    """Row r's keys and values in every layer and its logits at every fed position equal the row run alone, each
    within float32 rounding of the float64 model's (the row alone in float32 sets the rounding scale)."""
    model64 = float64_copy(model)
    for r, (tokens, feed) in enumerate(zip(cached, feeds)):
        cache, expected = alone(model, tokens + feed)
        cache64, expected64 = alone(model64, tokens + feed)
        n = len(tokens + feed)
        assert kv.lengths[r] == n
        for mine, theirs, exact in zip(kv.cache.layers, cache.layers, cache64.layers, strict=True):
            assert_same_function({"keys": mine.keys[r, :, :n]}, exact.keys[0], theirs.keys[0])
            assert_same_function({"values": mine.values[r, :, :n]}, exact.values[0], theirs.values[0])
        fed = slice(len(tokens), None)
        assert_same_function({"logits": logits[r, : len(feed)]}, expected64[fed], expected[fed])


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_rows_hold_what_they_would_hold_alone(family):
    model = tiny_llama(64, seed=0, layers=3) if family == "llama" else tiny_gpt2(64, seed=0, layers=2)
    kv = BatchKV(model)
    prompts = [[3, 4, 5, 6, 7, 8, 9], [10, 11], [12]]
    with torch.inference_mode():
        for r, prompt in enumerate(prompts):
            kv.place(r, prompt[:-1])
        cached = [p[:-1] for p in prompts]
        feeds = [[p[-1], 20, 21, 22][: 4 - r] for r, p in enumerate(prompts)]  # drafts of different lengths
        logits = kv.forward(feeds)  # (3, 4, V)
        assert_rows_match(model, kv, logits, cached, feeds)
        cached = [c + f for c, f in zip(cached, feeds)]
        keep = [len(p) + 1 for p in prompts]  # row r keeps its prompt and the first draft token
        kv.crop_rows(keep)
        cached = [c[:k] for c, k in zip(cached, keep)]
        feeds = [[23, 24], [25], [26, 27, 28]]  # a second step over the holes the crop left
        logits = kv.forward(feeds)
        assert_rows_match(model, kv, logits, cached, feeds)
        cached = [c + f for c, f in zip(cached, feeds)]
        cached[1] = [30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41]  # a refill longer than every row: width grows
        kv.place(1, cached[1])
        kv.drop([0, 1])  # row 2 leaves with no newcomer
        cached, feeds = cached[:2], [[41], [39, 40]]
        logits = kv.forward(feeds)
    assert_rows_match(model, kv, logits, cached, feeds)
    assert all(torch.isfinite(layer.keys).all() and torch.isfinite(layer.values).all() for layer in kv.cache.layers)
    assert kv.width == max(kv.lengths)


def test_widening_views_a_buffer_with_room_and_copies_nothing_while_the_room_lasts():
    t = torch.arange(2 * 3 * 4 * 5, dtype=torch.float32).reshape(2, 3, 4, 5)  # (B, H, P, D), no room
    wide = _widened(t, 6)  # a new buffer of 12 columns
    assert wide.shape == (2, 3, 6, 5) and torch.equal(wide[:, :, :4], t) and not wide[:, :, 4:].any()
    wider = _widened(wide, 12)  # within the room: the same buffer, nothing copied
    assert wider.data_ptr() == wide.data_ptr() and torch.equal(wider[:, :, :6], wide)
    wider[:, :, 11] = 7.0
    again = _widened(wider[:, :, :8], 12)  # a crop keeps the buffer; widening shows what the crop left (a hole)
    assert again.data_ptr() == wide.data_ptr() and (again[:, :, 11] == 7.0).all()
    past = _widened(again, 13)  # past the room: a new buffer holding every column so far
    assert past.data_ptr() != wide.data_ptr() and torch.equal(past[:, :, :12], again)
    shifted = _widened(t[:, :, 1:], 5)  # a view that does not start its buffer is copied, not extended
    assert shifted.data_ptr() != t.data_ptr() and torch.equal(shifted[:, :, :3], t[:, :, 1:])


def test_models_whose_attention_ignores_a_4d_mask_are_refused():
    model = tiny_llama(64, seed=0)
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="attn_implementation"):
        check_batch_model(model)

"""drafting.kv_cache's growing cache layers: bitwise what transformers' concatenating `DynamicLayer` holds, through
steps, crops and keys set from outside, while a step copies only its own positions."""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from drafting.kv_cache import GrowingLayer, crop_to, forward, new_cache
from tests.helpers_models import tiny_llama


def _states(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, 2, n, 4, generator=generator) for _ in range(2))  # (B, H, n, D) each


def test_a_growing_layer_holds_what_concatenation_holds_through_steps_and_crops():
    growing, plain = GrowingLayer(), DynamicLayer()
    for seed, (n, crop) in enumerate([(5, 0), (1, 0), (3, 2), (1, 0), (7, 4), (2, 0)]):
        k, v = _states(n, seed)
        got, want = growing.update(k, v), plain.update(k, v)
        assert all(torch.equal(a, b) for a, b in zip(got, want)), seed
        if crop:
            growing.crop(-crop)
            plain.crop(-crop)
    assert torch.equal(growing.keys, plain.keys) and torch.equal(growing.values, plain.values)


def test_a_step_writes_into_the_room_it_has_and_grows_it_by_doubling():
    layer = GrowingLayer()
    layer.update(*_states(3, 0))
    room = layer._rooms[0]
    assert room.shape[-2] == 6 and layer.keys.data_ptr() == room.data_ptr()
    layer.update(*_states(3, 1))  # fills the room: no new buffer
    assert layer._rooms[0] is room and layer.keys.shape[-2] == 6
    layer.crop(-2)
    layer.update(*_states(2, 2))  # a crop leaves the room to write into again
    assert layer._rooms[0] is room and layer.keys.shape[-2] == 6
    layer.update(*_states(1, 3))  # full: a new buffer of twice the need
    assert layer._rooms[0] is not room and layer._rooms[0].shape[-2] == 14


def test_keys_set_from_outside_are_copied_into_a_new_buffer_not_written_over():
    layer = GrowingLayer()
    layer.update(*_states(4, 0))
    outside = torch.zeros(1, 2, 2, 4)
    layer.keys, layer.values = outside, outside.clone()
    k, v = _states(1, 1)
    keys, _ = layer.update(k, v)
    assert torch.equal(keys, torch.cat([outside, k], -2)) and torch.equal(outside, torch.zeros(1, 2, 2, 4))


def test_a_model_s_forwards_over_a_growing_cache_are_bitwise_those_over_transformers_cache():
    model = tiny_llama(300, seed=0, layers=2, hidden=64)
    ids = torch.randint(0, 300, (30,), generator=torch.Generator().manual_seed(1)).tolist()
    growing, plain = new_cache(), DynamicCache()
    with torch.inference_mode():
        for start, stop, keep in ((0, 12, 1), (12, 13, 1), (13, 18, 5), (18, 19, 1), (19, 30, 3)):
            assert torch.equal(forward(model, growing, ids[start:stop], keep),
                               forward(model, plain, ids[start:stop], keep)), start
            if stop == 18:
                crop_to(growing, 15)
                crop_to(plain, 15)
    assert all(isinstance(layer, GrowingLayer) for layer in growing.layers)
    assert all(torch.equal(a.keys, b.keys) for a, b in zip(growing.layers, plain.layers))


def test_buffers_made_in_inference_mode_are_not_written_outside_it():
    layer, plain = GrowingLayer(), DynamicLayer()
    with torch.inference_mode():
        for seed in (0, 1):
            states = _states(2, seed)
            layer.update(*states)
            plain.update(*states)
    states = _states(1, 2)
    keys, values = layer.update(*states)  # outside: new buffers, not an in-place write into inference tensors
    assert torch.equal(keys, plain.update(*states)[0]) and not layer._rooms[0].is_inference()

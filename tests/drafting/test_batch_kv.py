"""BatchKV: rows of different lengths on one physical cache hold what each row's own cache would hold.

After any sequence of padded forwards, crops, refills and drops, row r's valid prefix equals (to float rounding)
the keys and values of a single-row DynamicCache fed the same tokens, its logits equal that row's, and every
stored value, holes included, is finite.
"""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from drafting.batch_kv import BatchKV, check_batch_model
from tests.helpers_models import tiny_gpt2, tiny_llama

pytestmark = [pytest.mark.usefixtures("one_thread")]


def alone(model, ids: list[int]):
    """(keys of layer 0 (H, n, D), last logits (V,)) of `ids` run alone without padding."""
    cache = DynamicCache()
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([ids]), cache=cache, use_cache=True)
    return cache.layers[0].keys[0], out.logits[0, -1]


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_rows_hold_what_they_would_hold_alone(family):
    model = tiny_llama(64, seed=0) if family == "llama" else tiny_gpt2(64, seed=0)
    kv = BatchKV(model)
    prompts = [[3, 4, 5, 6, 7, 8, 9], [10, 11], [12]]
    with torch.inference_mode():
        for r, prompt in enumerate(prompts):
            kv.place(r, prompt[:-1])
        feeds = [[p[-1], 20, 21, 22][: 4 - r] for r, p in enumerate(prompts)]  # drafts of different lengths
        logits = kv.forward(feeds)  # (3, 4, V)
        for r, (prompt, feed) in enumerate(zip(prompts, feeds)):
            assert torch.allclose(logits[r, len(feed) - 1], alone(model, prompt + feed[1:])[1], atol=1e-5)
        cached = [p[:-1] + f for p, f in zip(prompts, feeds)]
        keep = [len(p) + 1 for p in prompts]  # row r keeps its prompt and the first draft token
        kv.crop_rows(keep)
        cached = [c[:k] for c, k in zip(cached, keep)]
        cached[1] = [30, 31, 32, 33, 34, 35, 36, 37, 38]  # a refill longer than every row: the width grows
        kv.place(1, cached[1])
        kv.drop([0, 1])  # row 2 leaves with no newcomer
        feeds = [[41], [39, 40]]
        logits = kv.forward(feeds)
    for r, (tokens, feed) in enumerate(zip(cached, feeds)):
        keys, last = alone(model, tokens + feed)
        assert kv.lengths[r] == len(tokens + feed)
        assert torch.allclose(kv.cache.layers[0].keys[r, :, : kv.lengths[r]], keys, atol=1e-5)
        assert torch.allclose(logits[r, len(feed) - 1], last, atol=1e-5)
    assert all(torch.isfinite(layer.keys).all() and torch.isfinite(layer.values).all() for layer in kv.cache.layers)
    assert kv.width == max(kv.lengths)


def test_models_whose_attention_ignores_a_4d_mask_are_refused():
    model = tiny_llama(64, seed=0)
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="attn_implementation"):
        check_batch_model(model)

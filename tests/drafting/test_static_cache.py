"""StaticKV: forwards on a static cache, eager or through bucketed captured steps, equal forwards on a dynamic one.

The captured path runs here through an eager stand-in for CUDA-graph capture: the same id buffers, padding to the
bucket, start scalar and logits slicing as on a GPU, without the graph. On a machine with CUDA the same random feeds
and crops also run through real captured graphs (`cuda_capture`), and `generate` on static + graphs equals dynamic.
"""

from __future__ import annotations

import random

import pytest
import torch

from drafting.kv_cache import crop_to, forward, new_cache
from drafting.static_cache import BUCKETS, StaticKV, cuda_capture, graphs_unsupported, static_unsupported
from tests.helpers_models import tiny_gpt2, tiny_llama
from tests.helpers_rounding import assert_same_function, float64_copy

pytestmark = [pytest.mark.usefixtures("one_thread")]
V = 64


class Recording:
    """An eager stand-in for `cuda_capture` that counts captures and replays."""

    def __init__(self):
        self.captured, self.replays = [], 0

    def __call__(self, step):
        self.captured.append(step)

        def replay():
            self.replays += 1
            return step()
        return replay


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def model(request):
    make = {"llama": tiny_llama, "gpt2": tiny_gpt2}[request.param]
    return make(V, seed=0, layers=2, init=0.5)


def feeds_and_crops(model, capture=None) -> StaticKV:
    """Random feeds of 1..12 tokens, each followed by a crop to a random committed length, as the loop does: every
    static forward's logits equal a dynamic cache's over the same tokens (each within float32 rounding of a float64
    dynamic cache's, `tests.helpers_rounding`)."""
    kv, cache, rng = StaticKV(model, 300, capture), new_cache(), random.Random(0)
    exact, exact_cache = float64_copy(model), new_cache()
    seq, cached = [rng.randrange(V) for _ in range(9)], 0
    with torch.inference_mode():
        for _ in range(30):
            ids = seq[cached:] + [rng.randrange(V) for _ in range(rng.randint(1, 11))]
            keep = rng.randint(1, len(ids))
            static, dynamic = kv.run(ids, keep), forward(model, cache, ids, keep)
            assert static.shape == dynamic.shape == (keep, V)
            assert_same_function({"static": static}, forward(exact, exact_cache, ids, keep).to(static.device), dynamic)
            seq = seq[:cached] + ids
            committed = rng.randint(len(seq) - len(ids), len(seq))
            seq, cached = seq[:committed], rng.randint(max(0, committed - 2), committed)
            kv.crop(cached)
            crop_to(cache, cached)
            crop_to(exact_cache, cached)
            assert kv.length == cache.get_seq_length() == cached
    return kv


@pytest.mark.parametrize("captured", [False, True], ids=["eager", "captured"])
def test_static_forwards_equal_dynamic_ones_through_feeds_and_crops(model, captured):
    feeds_and_crops(model, Recording() if captured else None)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: real graph capture")
@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_real_cuda_graphs_equal_dynamic_forwards_through_feeds_and_crops(family):
    """The stand-in above replaces capture in every other test: here the graphs are real."""
    model = {"llama": tiny_llama, "gpt2": tiny_gpt2}[family](V, seed=0, layers=2, init=0.5).to("cuda")
    replays = []

    def counted(step):
        replay = cuda_capture(step)
        return lambda: replays.append(1) or replay()
    kv = feeds_and_crops(model, counted)
    assert kv.steps and replays  # forwards of up to 32 tokens replayed captured graphs


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: real graph capture")
def test_generate_on_static_cache_and_real_graphs_equals_dynamic():
    from assisted import generate
    from tests.helpers_models import tiny_tokenizer

    target = tiny_llama(8, seed=0, layers=2, init=0.5, eos=0).to("cuda")
    assistant = tiny_llama(8, seed=1, layers=1, init=0.5, eos=0).to("cuda")
    kw = dict(tokenizer=tiny_tokenizer(), input_ids=[3, 4, 5, 6], regex="[abcd]{60}", max_new_tokens=30,
              num_assistant_tokens=4, num_assistant_tokens_schedule="constant")
    dynamic = generate(target, assistant, cache_implementation="dynamic", **kw)
    graphs = generate(target, assistant, cache_implementation="static", cuda_graphs=True, **kw)
    assert graphs.stats.cache == "static+graphs" and dynamic.stats.cache == "dynamic"
    assert graphs.token_ids == dynamic.token_ids and len(graphs.token_ids) == 30


def test_a_crop_moves_the_length_and_copies_nothing(model):
    kv = StaticKV(model, 64)
    with torch.inference_mode():
        kv.run(list(range(10)), 1)
        keys = kv.cache.layers[0].keys
        before = (keys.data_ptr(), keys.clone())
        kv.crop(4)
        kv.crop(7)  # never lengthens
    assert kv.length == 4
    assert kv.cache.layers[0].keys.data_ptr() == before[0] and torch.equal(kv.cache.layers[0].keys, before[1])


def test_a_forward_past_the_capacity_is_refused_before_it_runs(model):
    kv = StaticKV(model, 16)
    with torch.inference_mode():
        kv.run(list(range(12)), 1)
        with pytest.raises(ValueError, match=r"^static cache full: 12 \+ 5 positions exceed its capacity 16$"):
            kv.run(list(range(5)), 1)
    assert kv.length == 12


def test_captured_steps_pad_to_the_next_width_and_are_captured_once(model):
    capture = Recording()
    kv = StaticKV(model, 100, capture)
    with torch.inference_mode():
        kv.capture_all()
        assert len(capture.captured) == len(BUCKETS) and sorted(kv.steps) == list(BUCKETS)
        kv.run(list(range(40)), 1)  # wider than any bucket: eager, no replay
        assert capture.replays == 0
        for m in (1, 2, 3, 5, 9, 17, 32):
            kv.crop(40)
            kv.run(list(range(m)), 1)
        assert capture.replays == 7 and len(capture.captured) == len(BUCKETS)  # no capture during decoding
        kv.run([1, 2, 3], 1)  # at 72: 72 + 4 (its bucket) fits
        kv.run(list(range(22)), 1)  # 75 + 32 would not fit either: eager
        kv.run([1, 2, 3], 1)  # at 97 a 4-wide bucket would not: eager
    assert capture.replays == 8 and kv.length == 100


def test_sliding_window_models_cannot_use_a_static_cache():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, use_sliding_window=True, sliding_window=8, max_window_layers=0)
    reason = static_unsupported(Qwen2ForCausalLM(config))
    assert reason is not None and "sliding" in reason
    assert static_unsupported(tiny_llama(V, seed=0)) is None


def test_graphs_need_a_model_on_one_cuda_device(model):
    assert graphs_unsupported(model) == "its weights are not all on a CUDA device (cpu)"

"""Which caches generate() decodes on: the plan's defaults and refusals, and the static caches kept per model."""

from __future__ import annotations

import threading

import pytest
import torch

import assisted.caching as caching
from assisted import PrefixCache, generate
from assisted.caching import CAPACITY_STEP, plan_caches
from tests.helpers_models import smollm2_tokenizer, tiny_llama

pytestmark = [pytest.mark.usefixtures("one_thread")]
V = 49152
POINT = {"type": "object", "properties": {"x": {"type": "integer"}, "tag": {"enum": ["a", "bb"]}},
         "required": ["x", "tag"]}


@pytest.fixture(scope="module")
def tok():
    return smollm2_tokenizer()


@pytest.fixture(scope="module")
def pair():
    return tiny_llama(V, seed=0, layers=2, init=0.3), tiny_llama(V, seed=1, init=0.3)


def test_a_cpu_target_decodes_on_dynamic_caches_by_default_and_says_nothing(pair):
    plan = plan_caches(*pair, None, None, False, None)
    assert (plan.implementation, plan.cuda_graphs, plan.note, plan.engine) == ("dynamic", False, None, "dynamic")
    assert plan_caches(*pair, "static", None, False, None).engine == "static"  # graphs off where there is no GPU


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(cache_implementation="paged"), ValueError, "unknown cache_implementation 'paged'"),
        (dict(cuda_graphs=1), TypeError, "cuda_graphs must be a bool or None, got int 1"),
        (
            dict(cuda_graphs=True),
            ValueError,
            "cuda_graphs=True cannot be used here: model: its weights are not all on a CUDA",
        ),
        (dict(cache_implementation="dynamic", cuda_graphs=True), ValueError, "cuda_graphs=True needs static caches"),
        (
            dict(cache_implementation="static", tree=True),
            ValueError,
            "cache_implementation='static' cannot be used here: tree=True verifies with a tree mask",
        ),
        (
            dict(cache_implementation="static", prefix_cache=PrefixCache()),
            ValueError,
            "cache_implementation='static' cannot be used here: prefix_cache keeps dynamic caches",
        ),
    ],
)
def test_options_that_cannot_be_honoured_are_refused_before_any_model_call(tok, pair, kwargs, error, message):
    target, assistant = pair
    calls = []
    hook = target.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        with pytest.raises(error, match="^" + message.replace("(", r"\(")):
            generate(target, assistant, tokenizer=tok, prompt="hi", max_new_tokens=4, **kwargs)
    finally:
        hook.remove()
    assert calls == []


@pytest.mark.parametrize("constraint", [{}, {"schema": POINT}])
@pytest.mark.parametrize("do_sample", [False, True])
def test_static_caches_give_the_dynamic_caches_tokens(tok, pair, plain_reference, constraint, do_sample):
    kw = dict(tokenizer=tok, prompt="Point:", max_new_tokens=24, do_sample=do_sample, seed=3, schedule="heuristic",
              **constraint)
    plain = None if do_sample else plain_reference(pair[0], **kw).token_ids  # greedy: the plain loop's tokens
    for assistant in (None, pair[1], pair[0]):
        dynamic = generate(pair[0], assistant, cache_implementation="dynamic", **kw)
        static = generate(pair[0], assistant, cache_implementation="static", **kw)
        assert static.token_ids == dynamic.token_ids
        if not do_sample:
            assert dynamic.token_ids == plain
        assert (dynamic.stats.cache, static.stats.cache, static.stats.cache_note) == ("dynamic", "static", None)


def test_kept_static_caches_are_reused_grown_and_kept_per_role(tok):
    target = tiny_llama(V, seed=5)
    kw = dict(tokenizer=tok, prompt="hi", cache_implementation="static")
    generate(target, target, max_new_tokens=8, **kw)  # the model drafts for itself: two roles, two caches
    kept = caching._KEPT[target]
    first, helper = kept["target"].kv, kept["assistant"].kv
    assert first is not helper and first.capacity == helper.capacity == CAPACITY_STEP
    generate(target, target, max_new_tokens=8, **kw)
    assert kept["target"].kv is first  # reused: its captures are paid once
    generate(target, None, max_new_tokens=CAPACITY_STEP, **kw)
    assert kept["target"].kv is not first and kept["target"].kv.capacity == 2 * CAPACITY_STEP  # grown in steps


def test_calls_sharing_a_kept_cache_from_threads_equal_sequential_ones(tok, pair, plain_reference):
    kw = dict(tokenizer=tok, max_new_tokens=16, schema=POINT, cache_implementation="static", schedule="heuristic")
    prompts = ["a", "bb", "ccc", "dddd"]
    expected = [generate(*pair, prompt=p, **kw).token_ids for p in prompts]
    assert expected == [plain_reference(pair[0], prompt=p, **kw).token_ids for p in prompts]
    found = [None] * len(prompts)

    def run(i):
        found[i] = generate(*pair, prompt=prompts[i], **kw).token_ids

    with torch.inference_mode():
        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert found == expected


def test_a_cuda_target_defaults_to_captured_static_caches_and_says_why_where_it_cannot(pair, monkeypatch):
    """The plan's CUDA defaults, decided on the CPU: the device and the capture check are stood in for."""
    monkeypatch.setattr(caching, "output_device", lambda model: torch.device("cuda", 0))
    monkeypatch.setattr(caching, "graphs_unsupported", lambda model: None)
    assert plan_caches(*pair, None, None, False, None) == caching.CachePlan("static", True, None)
    assert plan_caches(*pair, None, False, False, None).engine == "static"
    assert plan_caches(*pair, None, None, True, None) == caching.CachePlan(
        "dynamic", False, "static cache off: tree=True verifies with a tree mask on a dynamic cache")
    monkeypatch.setattr(caching, "graphs_unsupported", lambda model: "its weights span 2 devices")
    assert plan_caches(*pair, None, None, False, None) == caching.CachePlan(
        "static", False, "CUDA graphs off: model: its weights span 2 devices")

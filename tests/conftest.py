"""Shared fixtures: real tokenizers, loaded once per session, never from the network."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(autouse=True)
def clean_remembered_state():
    """Every test starts with no costs or calibration remembered by `schedule="auto"`: one test's timings never
    steer the next one's draft lengths. (Without `assisted` imported there is nothing to clear.)"""
    assisted = sys.modules.get("assisted")
    if assisted is not None:
        assisted.reset_remembered_state()
    yield


@pytest.fixture(scope="session")
def smol_tokenizer():
    """SmolLM2-135M's byte-level BPE tokenizer (49,152 tokens)."""
    from tests.helpers_models import smollm2_tokenizer

    return smollm2_tokenizer()


@pytest.fixture(scope="session")
def sentencepiece_tokenizer(tmp_path_factory):
    """Mistral v1 SentencePiece tokenizer with byte fallback (32,000 tokens, `▁` spaces, <0xNN>)."""
    import mistral_common
    from transformers import LlamaTokenizer

    folder = tmp_path_factory.mktemp("sentencepiece")
    source = Path(mistral_common.__file__).parent / "data" / "tokenizer.model.v1"
    shutil.copy(source, folder / "tokenizer.model")
    return LlamaTokenizer.from_pretrained(folder)


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module of tiny-model tests: many small tensor ops run faster, and steadier on a busy
    machine, than on two."""
    from tests.helpers_models import threads

    with threads(1):
        yield


@pytest.fixture
def fresh_fsm_caches():
    """Drop every term, automaton and index the process keeps (the vocabulary stays): tests that count the terms
    or states a build creates then see the same counts whatever ran before them (terms are interned weakly, and
    kept alive only by these caches)."""
    import functools
    import gc
    import importlib
    import pkgutil

    import fsm
    from fsm.guide import INDEXES

    INDEXES.clear()
    for info in pkgutil.iter_modules(fsm.__path__):
        if info.name == "vocabulary":
            continue
        for value in vars(importlib.import_module(f"fsm.{info.name}")).values():
            if isinstance(value, functools._lru_cache_wrapper):
                value.cache_clear()
    gc.collect()


@pytest.fixture(params=["dynamic", "static", "static+graphs"])
def every_cache(request, monkeypatch):
    """Run a test once per KV-cache engine, by making it generate()'s default on the CPU: dynamic caches, static
    caches, and static caches whose steps are bucketed and replayed through an eager stand-in for CUDA-graph capture
    (the same padding, buffers and logits slicing as on a GPU). Calls that name their caches, draft trees and prefix
    caches keep what they ask for."""
    if request.param != "dynamic":
        import importlib

        caching, loop = importlib.import_module("assisted.caching"), importlib.import_module("assisted.generate")

        graphs, plan = request.param == "static+graphs", caching.plan_caches

        def static_default(model, assistant_model, cache_implementation, cuda_graphs, tree, prefix_cache):
            if cache_implementation is None and cuda_graphs is None and not tree and prefix_cache is None:
                cache_implementation, cuda_graphs = "static", graphs
            return plan(model, assistant_model, cache_implementation, cuda_graphs, tree, prefix_cache)

        monkeypatch.setattr(loop, "plan_caches", static_default)
        if graphs:
            monkeypatch.setattr(caching, "graphs_unsupported", lambda model: None)
            monkeypatch.setattr(caching, "_capture_for", lambda model: lambda step: step)
    return request.param

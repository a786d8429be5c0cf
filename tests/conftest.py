"""Shared fixtures: real tokenizers, loaded once per session, never from the network."""

from __future__ import annotations

import gc
import os
import shutil
import sys
import weakref
from pathlib import Path

import pytest
from hypothesis import settings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
_GC_THRESHOLD = gc.get_threshold()  # the process's own, restored after every test


def pytest_configure(config):
    """Tokenizer vocabulary indexes cached on disk (fsm.vocabulary_cache) go to a folder of this run, not the user's
    cache, and are removed with it. Forward costs stay in memory (`assisted.policy.costs.cost_dir`): a test's policy
    starts from what its own process measured, never from an earlier run's files."""
    os.environ.setdefault("STRUCTSPEC_COST_CACHE", "off")
    if "STRUCTSPEC_VOCAB_CACHE" not in os.environ:
        import tempfile

        config._vocab_cache = tempfile.mkdtemp(prefix="structspec-test-vocab-")
        os.environ["STRUCTSPEC_VOCAB_CACHE"] = config._vocab_cache


def pytest_unconfigure(config):
    folder = getattr(config, "_vocab_cache", None)
    if folder:
        shutil.rmtree(folder, ignore_errors=True)
        os.environ.pop("STRUCTSPEC_VOCAB_CACHE", None)

# Property tests draw the same examples on every run and machine: a verdict never depends on a random seed.
settings.register_profile("derandomized", derandomize=True, database=None, deadline=None)
settings.load_profile("derandomized")


@pytest.fixture(autouse=True)
def clean_remembered_state():
    """Every test starts with no costs or calibration remembered by `schedule="auto"`: one test's timings never
    steer the next one's draft lengths. (Without `assisted` imported there is nothing to clear.)"""
    assisted = sys.modules.get("assisted")
    if assisted is not None:
        assisted.reset_remembered_state()
    yield
    gc.unfreeze()  # what a test's load_pair froze (freeze_loaded_objects) is collected as usual afterwards
    gc.set_threshold(*_GC_THRESHOLD)  # and at the thresholds it raised


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
def empty_cache(tmp_path, monkeypatch):
    """A test's own empty cache folder for the named sources, offline: the real one is never touched."""
    monkeypatch.setenv("STRUCTSPEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path / "cache"


@pytest.fixture
def fresh_fsm_caches():
    """Drop every term, automaton and index the process keeps (the vocabulary stays): tests that count the terms
    or states a build creates then see the same counts whatever ran before them (`fsm.caches.clear_caches`)."""
    from fsm.caches import clear_caches

    clear_caches()


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


_PLAIN_RUNS = weakref.WeakKeyDictionary()  # model -> {case: (tokens, stop reason)}, filled by `plain_reference`


@pytest.fixture
def plain_reference():
    """`check(model, **generate_kwargs)`: generate() without an assistant, checked against the independent plain
    reference (`tests.helpers_reference.plain_decode`: same tokens, same stop reason) and returned.

    Identity tests compare their assisted runs with what this returns, so each of them rests on the plain loop,
    not on generate() alone. The plain loop runs once per model, prompt, constraint, budget and `coalesce` (and
    output-head weights), whichever cache engine or test asks again."""
    import json

    from assisted import generate
    from tests.helpers_reference import plain_decode

    def check(model, **kw):
        assert not kw.get("do_sample") and kw.get("prefix_cache") is None
        result = generate(model, **kw)
        tok = kw["tokenizer"]
        if kw.get("messages") is not None:
            chat = tok.apply_chat_template(kw["messages"], tokenize=False, add_generation_prompt=True)
            ids = tok(chat, add_special_tokens=False)["input_ids"]
        else:
            ids = kw["input_ids"] if kw.get("input_ids") is not None else tok(kw["prompt"])["input_ids"]
        ids = [int(i) for i in (ids.flatten().tolist() if hasattr(ids, "flatten") else ids)]
        schema = kw.get("schema")
        case = (tuple(ids), json.dumps(schema, sort_keys=True) if isinstance(schema, dict) else schema,
                kw.get("regex"), kw.get("max_new_tokens", 256), kw.get("coalesce", True),
                json.dumps(kw.get("guide_options"), sort_keys=True, default=repr),
                sum(float(p.detach().sum()) for p in model.get_output_embeddings().parameters()), id(tok))
        runs = _PLAIN_RUNS.setdefault(model, {})
        if case not in runs:
            runs[case] = plain_decode(model, tok, ids, case[3], schema=schema, regex=kw.get("regex"),
                                      coalesce=case[4], guide_options=kw.get("guide_options"))
        assert (result.token_ids, result.stop_reason) == runs[case], (
            "generate() without an assistant is not plain decoding"
        )
        return result

    return check

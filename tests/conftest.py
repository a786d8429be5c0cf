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

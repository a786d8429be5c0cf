"""Forget what the process keeps between guides: terms, automata, token indexes and the head walks shared by them
(never the vocabularies).

After `clear_caches()` the next guide is all first visits, and code that counts the terms or states a build creates
sees the same counts whatever ran before it (terms are interned weakly, kept alive only by these caches).
"""

from __future__ import annotations

import functools
import gc
import importlib
import pkgutil

KEPT = ("vocabulary", "vocabulary_cache", "token_trie")  # per tokenizer, not per schema


def clear_caches() -> None:
    """Clear every memoised function of the fsm package's modules but `KEPT`, the guides' token indexes and the
    vocabularies' head walks."""
    import fsm
    from fsm import head_cache, liveness
    from fsm.guide import INDEXES

    INDEXES.clear()
    head_cache.clear()
    liveness.forget_spellings()
    for info in pkgutil.iter_modules(fsm.__path__):
        if info.name not in KEPT:
            for value in vars(importlib.import_module(f"fsm.{info.name}")).values():
                if isinstance(value, functools._lru_cache_wrapper):
                    value.cache_clear()
    gc.collect()

"""llama.cpp through llama-cpp-python, as the benchmarks run it: one context per thread count, no prompt reuse
between calls, its JSON-schema grammar (optionally compact), and the forward costs behind a comparison."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path


def without_digit_escapes(schema):
    """`schema` with each pattern's \\d spelled [0-9] (the same language): llama-cpp-python's converter copies \\d
    into the grammar as a literal and the grammar then fails to parse."""
    if isinstance(schema, dict):
        return {k: v.replace("\\d", "[0-9]") if k == "pattern" and isinstance(v, str) else without_digit_escapes(v)
                for k, v in schema.items()}
    return [without_digit_escapes(v) for v in schema] if isinstance(schema, list) else schema


def compact_grammar(gbnf: str) -> str:
    """The GBNF with its whitespace rule emptied: the same language, written compactly."""
    return re.sub(r"(?m)^space ::= .*$", 'space ::= ""', gbnf)


class LlamaCpp:
    """llama-cpp-python contexts over one GGUF, one per thread count; each call starts from an empty cache."""

    def __init__(self, path: Path, threads, logits_all: bool = False):
        from llama_cpp import Llama
        self.llms = {t: Llama(model_path=str(path), n_ctx=2048, n_threads=t, n_threads_batch=t, n_batch=512,
                              logits_all=logits_all, verbose=False) for t in threads}

    def complete(self, threads: int, ids: list[int], max_new: int, schema: dict | None = None,
                 compact: bool = False) -> tuple[str, int]:
        from llama_cpp import LlamaGrammar
        from llama_cpp.llama_grammar import json_schema_to_gbnf
        llm = self.llms[threads]
        grammar = None
        if schema is not None:
            gbnf = json_schema_to_gbnf(json.dumps(without_digit_escapes(schema)))
            grammar = LlamaGrammar.from_string(compact_grammar(gbnf) if compact else gbnf, verbose=False)
        llm.reset()  # no prompt reuse between calls: ours prefills every prompt too
        out = llm.create_completion(prompt=ids, max_tokens=max_new, temperature=0.0, repeat_penalty=1.0,
                                    grammar=grammar)
        return out["choices"][0]["text"], out["usage"]["completion_tokens"]

    def forward_cost(self, threads: int, ids: list[int], k: int) -> float:
        """Seconds of one eval of ids[200:200 + k] after the 200 before it (cached once)."""
        llm = self.llms[threads]
        if llm.n_tokens < 200 or list(llm.input_ids[:200]) != ids[:200]:
            llm.reset()
            llm.eval(ids[:200])
        llm.n_tokens = 200  # eval drops every cached position from n_tokens on
        start = time.perf_counter()
        llm.eval(ids[200 : 200 + k])
        return time.perf_counter() - start

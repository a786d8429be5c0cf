"""Speed of the fsm layer: schema -> ready guide, and per-token mask()+advance() along valid JSON.

    python -m experiments.fsm_bench [--tokenizers smollm2-135m qwen2.5-coder-0.5b] [--repeats 5]

Compile time is measured cold (caches cleared) from the schema to a guide whose first mask is built;
the tokenizer's Vocabulary is built once beforehand and reported on its own. The walk times every
`mask()` + `advance()` along each instance's tokens, split into first visits of a state and revisits.
The DFA is lazy: "states" counts the DFA states discovered by the walks (token ends and the states
inside tokens).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from typing import Literal, Optional

from pydantic import BaseModel, Field

import fsm
from fsm import regex
from fsm.guide import INDEXES


class Character(BaseModel):
    name: str = Field(max_length=10)
    age: int
    armor: Literal["leather", "chainmail", "plate"]
    strength: int


class Address(BaseModel):
    street: str
    city: str
    postcode: Optional[str] = Field(default=None, pattern=r"^[0-9]{5}$")


class Employee(BaseModel):
    name: str
    age: int = Field(ge=16, le=99)
    email: Optional[str] = Field(default=None, json_schema_extra={"format": "email"})
    skills: list[str] = Field(max_length=5)
    address: Address
    manager: Optional[str] = None


CASES = {
    "character": (Character, [{"name": "John", "age": 20, "armor": "plate", "strength": 11},
                              {"name": "Élodie 😀", "age": 310, "armor": "leather", "strength": -2}]),
    "employee": (Employee, [{"name": "Ada Lovelace", "age": 36, "email": "ada@example.org", "skills": ["math", "poetry"],
                             "address": {"street": "12 St James's Square", "city": "London", "postcode": "12345"}},
                            {"name": "Li Wei", "age": 28, "skills": [], "address": {"street": "1 Rd", "city": "上海"}, "manager": "Ada"}]),
}


def clear_caches() -> None:
    """Forget compiled DFAs and indexes (terms then die with them: derivatives are memoized on terms)."""
    regex._parsed.cache_clear()
    INDEXES.clear()
    gc.collect()


def compile_seconds(schema, tokenizer) -> float:
    clear_caches()
    start = time.perf_counter()
    fsm.Guide.from_schema(schema, tokenizer).mask()
    return time.perf_counter() - start


def walk_times(guide: fsm.Guide, instance, tokenizer) -> tuple[list[float], list[float], int, int]:
    """(first-visit seconds, revisit seconds, forced tokens matched, tokens) along one instance."""
    text = json.dumps(instance, separators=(",", ":"), ensure_ascii=False)
    first, again, forced_hits = [], [], 0
    ids = tokenizer.encode(text, add_special_tokens=False)
    pending: list[int] = []
    for token in ids:
        if not pending:
            pending = guide.forced()
        forced_hits += bool(pending) and pending[0] == token
        pending = pending[1:] if pending and pending[0] == token else []
        seen = guide.state in guide.index._states
        start = time.perf_counter()
        guide.mask()
        guide.advance(token)
        (again if seen else first).append(time.perf_counter() - start)
    assert guide.is_final(), text
    return first, again, forced_hits, len(ids)


def _ms(values: list[float], q: float) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    return f"{1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]:.3f}"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizers", nargs="+", default=["smollm2-135m", "qwen2.5-coder-0.5b"])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    from experiments.models import load_tokenizer

    print("| tokenizer | schema | vocabulary build s | compile ms (median) | first visit ms p50 / p99 | revisit ms p50 / p99 | forced share | states |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.tokenizers:
        tokenizer = load_tokenizer(name)
        start = time.perf_counter()
        fsm.vocabulary_from_tokenizer(tokenizer).walk_layout
        vocab_s = time.perf_counter() - start
        for case, (schema, instances) in CASES.items():
            compile_ms = 1000 * statistics.median(compile_seconds(schema, tokenizer) for _ in range(args.repeats))
            first, again, hits, total = [], [], 0, 0
            for _ in range(args.repeats):
                clear_caches()
                for instance in instances:
                    guide = fsm.Guide.from_schema(schema, tokenizer)
                    f, a, h, n = walk_times(guide, instance, tokenizer)
                    first, again, hits, total = first + f, again + a, hits + h, total + n
            print(f"| {name} | {case} | {vocab_s:.2f} | {compile_ms:.0f} | {_ms(first, .5)} / {_ms(first, .99)} "
                  f"| {_ms(again, .5)} / {_ms(again, .99)} | {hits / total:.0%} | {guide.index.dfa.n_states} |")


if __name__ == "__main__":
    main()

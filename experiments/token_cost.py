"""Per-token cost of a guide on already-visited states (the hot path: mask lookup + advance).

    python -m experiments.token_cost [--repeats 200]

Walks a fixed random path through a schema guide once (first visits, untimed), then replays it
`repeats` times and prints the median nanoseconds per token for mask(), advance() and forced().
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import fsm
from experiments.models import load_tokenizer

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 40}, "age": {"type": "integer", "minimum": 0},
                                           "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 4}},
          "required": ["name", "age", "tags"]}


def fixed_path(guide: fsm.Guide, steps: int, seed: int = 0) -> list[int]:
    rng, eos, tokens = random.Random(seed), set(guide.eos_token_ids), []
    guide = guide.copy()
    while len(tokens) < steps and not guide.is_finished():
        allowed = guide.allowed()
        token = rng.choice([t for t in allowed if t not in eos] or allowed)
        guide.advance(token)
        tokens.append(token)
    return tokens


def replay_ns(guide: fsm.Guide, tokens: list[int], call: str) -> float:
    start_guide = guide.copy()
    start = time.perf_counter_ns()
    g = start_guide
    for token in tokens:
        if call == "mask":
            g.mask()
        elif call == "forced":
            g.forced()
        g.advance(token)
    return (time.perf_counter_ns() - start) / len(tokens)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args(argv)
    tokenizer = load_tokenizer("smollm2-135m")
    guide = fsm.Guide.from_schema(SCHEMA, tokenizer)
    tokens = fixed_path(guide, 60)
    for call in ("advance", "mask", "forced"):
        replay_ns(guide, tokens, call)  # first visits
        times = [replay_ns(guide, tokens, call) for _ in range(args.repeats)]
        label = "advance" if call == "advance" else f"{call} + advance"
        print(f"{label:16s}: median {statistics.median(times):7.0f} ns/token over {len(tokens)} tokens x {args.repeats}")


if __name__ == "__main__":
    main()

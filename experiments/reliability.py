"""Reliability sweep: hostile inputs to the guides, each case in its own forked process, against a budget.

    python -m experiments.reliability [--out DIR] [--only NAME ...] [--timeout S]

Per case: wall seconds, peak extra memory (ru_maxrss minus the RSS at fork) and the outcome: "ok",
"refused" (a clear GuideBudgetError / SchemaError), "error" (anything else: a bug), or "timeout"
(killed at --timeout). A case passes when its outcome is the expected one and it stays within its
seconds and megabytes. Writes results.csv to --out when given.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import random
import resource
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import fsm
from experiments.lib.report import write_rows
from experiments.models import load_tokenizer


@dataclass(frozen=True)
class Case:
    name: str
    run: Callable  # (tokenizer) -> str detail; raises on failure
    expect: str = "ok"  # or "refused"
    seconds: float = 60.0
    megabytes: float = 1024.0


def walk(guide: fsm.Guide, steps: int, seed: int = 0) -> list[int]:
    """A random walk over allowed tokens (EOS avoided while possible); returns the tokens."""
    rng, eos, tokens = random.Random(seed), set(guide.eos_token_ids), []
    while len(tokens) < steps and not guide.is_finished():
        allowed = guide.allowed()
        token = rng.choice([t for t in allowed if t not in eos] or allowed)
        guide.forced()
        guide.advance(token)
        tokens.append(token)
    return tokens


def schema_walk(schema, steps: int, **options):
    def run(tokenizer) -> str:
        guide = fsm.Guide.from_schema(schema, tokenizer, **options)
        tokens = walk(guide, steps)
        return f"{len(tokens)} tokens, {guide.index.dfa.n_states} DFA states"
    return run


def regex_walk(pattern: str, steps: int):
    def run(tokenizer) -> str:
        guide = fsm.Guide.from_regex(pattern, tokenizer)
        tokens = walk(guide, steps)
        return f"{len(tokens)} tokens, {guide.index.dfa.n_states} DFA states"
    return run


def nested(depth: int, leaf) -> dict:
    schema = leaf
    for i in range(depth):
        schema = (
            {"type": "object", "properties": {f"k{i}": schema}, "required": [f"k{i}"]}
            if i % 2
            else {"type": "array", "items": schema, "minItems": 1, "maxItems": 2}
        )
    return schema


def many_schemas(count: int):
    def run(tokenizer) -> str:
        from fsm.guide import INDEXES

        most = 0
        for i in range(count):
            schema = {
                "type": "object",
                "properties": {
                    f"f{i}": {"type": "integer", "minimum": i, "maximum": 10 * i + 9},
                    "s": {"type": "string", "maxLength": i % 50 + 1},
                },
                "required": [f"f{i}"],
            }
            walk(fsm.Guide.from_schema(schema, tokenizer), 12, seed=i)
            most = max(most, len(INDEXES))
            assert len(INDEXES) <= INDEXES.max_entries
        return f"{count} schemas, at most {most} cached indexes, {INDEXES.nbytes / 2**20:.0f} MiB cached"
    return run


def concurrent(threads: int, steps: int):
    def run(tokenizer) -> str:
        schema = {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 200},
                "n": {"type": "integer", "minimum": -(2**63)},
                "tags": {"type": "array", "items": {"enum": ["a", "bb", "ccc"]}},
            },
            "required": ["name", "n"],
        }
        term = fsm.compile_schema(schema)
        vocabulary = fsm.Guide.from_rx(term, tokenizer).index.vocabulary
        from fsm.index import TokenIndex
        from fsm.lazy_dfa import LazyDFA

        shared, paths, errors = TokenIndex(LazyDFA(term), vocabulary), [None] * threads, []

        def drive(i):
            try:
                guide = fsm.Guide(shared)
                tokens = walk(guide, steps, seed=i)
                paths[i] = (tokens, [a.tobytes() for a in _allowed_along(fsm.Guide(shared), tokens)])
            except Exception as error:  # noqa: BLE001 - reported as the case's failure
                errors.append(repr(error))

        previous = sys.getswitchinterval()
        sys.setswitchinterval(1e-6)
        try:
            pool = [threading.Thread(target=drive, args=(i,)) for i in range(threads)]
            for t in pool:
                t.start()
            for t in pool:
                t.join()
        finally:
            sys.setswitchinterval(previous)
        assert not errors, errors
        reference = TokenIndex(LazyDFA(term), vocabulary)
        for tokens, allowed in paths:
            assert [a.tobytes() for a in _allowed_along(fsm.Guide(reference), tokens)] == allowed, (
                "threads disagree with sequential"
            )
        return f"{threads} threads x {steps} tokens identical to sequential"
    return run


def _allowed_along(guide: fsm.Guide, tokens: list[int]):
    for token in tokens:
        yield guide.index.info(guide.state).token_ids
        guide.advance(token)


def hopeless(tokenizer) -> str:
    schema = {"type": "string", "pattern": "^[a-z]*$", "minLength": 50_000}
    fsm.Guide.from_schema(schema, tokenizer, budget=fsm.Budget(max_seconds=10)).mask()
    return "built"


PROPS = {
    f"p{i}": t
    for i, t in enumerate(
        [
            {"type": "string"},
            {"type": "integer"},
            {"type": "number"},
            {"type": "boolean"},
            {"type": "array", "items": {"type": "string"}},
            {"enum": ["x", "y"]},
            {"type": "null"},
            {"type": "string", "maxLength": 20},
        ]
    )
}

CASES = [
    Case("int64-bounds", schema_walk({"type": "integer", "minimum": -(2**63), "maximum": 2**63 - 1}, 30)),
    Case("integer-min-1e300", schema_walk({"type": "integer", "minimum": -1e300}, 30)),
    Case("number-range-1e300", schema_walk({"type": "number", "minimum": -1e300, "exclusiveMaximum": 1e300}, 30)),
    Case("string-maxLength-10000", schema_walk({"type": "string", "maxLength": 10_000}, 300)),
    Case("string-maxLength-100000", schema_walk({"type": "string", "maxLength": 100_000}, 100)),
    Case("string-minLength-100000", schema_walk({"type": "string", "minLength": 100_000}, 100)),
    Case("regex-a-repeated-1e6", regex_walk("a{1000000}", 100)),
    Case("regex-ab-or-cd-2e5-then-x", regex_walk("(ab|cd){200000}x", 100)),
    Case("regex-a-z-3-to-5e6", regex_walk("[a-z]{3,5000000}", 100)),
    Case("nested-40-deep", schema_walk(nested(40, {"type": "integer"}), 200)),
    Case(
        "object-any-order-open",
        schema_walk(
            {"type": "object", "properties": PROPS, "required": list(PROPS)},
            200,
            additional_properties=True,
            property_order="any",
        ),
    ),
    Case("pattern-minLength-50000", hopeless, expect="refused", seconds=30),
    Case("2000-distinct-schemas", many_schemas(2000), seconds=600, megabytes=1536),
    Case("8-threads-one-schema", concurrent(8, 80)),
]


def small_budget_refusal(tokenizer) -> str:
    schema = {"type": "string", "pattern": "^[a-z]*$", "minLength": 50_000}
    fsm.Guide.from_schema(schema, tokenizer, budget=fsm.Budget(max_terms=20_000)).mask()
    return "built"


SMOKE = [  # a few seconds in all: tests/experiments/test_reliability.py runs these in-process
    Case("int64-bounds", schema_walk({"type": "integer", "minimum": -(2**63), "maximum": 2**63 - 1}, 10)),
    Case("string-maxLength-100000", schema_walk({"type": "string", "maxLength": 100_000}, 5)),
    Case("regex-a-repeated-1e6", regex_walk("a{1000000}", 5)),
    Case("pattern-minLength-small-budget", small_budget_refusal, expect="refused"),
    Case("4-threads-one-schema", concurrent(4, 10)),
]


def outcome_of(case: Case, tokenizer) -> tuple[str, str]:
    """("ok" | "refused" | "error", detail) of running `case` in this process."""
    try:
        return "ok", case.run(tokenizer)
    except (fsm.GuideBudgetError, fsm.SchemaError, fsm.RegexError) as error:
        return "refused", f"{type(error).__name__}: {error}"
    except Exception as error:  # noqa: BLE001 - the sweep reports every failure
        return "error", f"{type(error).__name__}: {error}"


def _child(case: Case, tokenizer, queue) -> None:
    start_rss = _rss_mb()
    start = time.perf_counter()
    outcome, detail = outcome_of(case, tokenizer)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    queue.put((outcome, detail[:300], seconds, max(peak - start_rss, 0.0)))


def _rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def run_case(case: Case, tokenizer, timeout: float) -> dict:
    """Run `case` in a forked process; a case that outlives `timeout` is killed and reported."""
    queue = mp.get_context("fork").Queue()
    process = mp.get_context("fork").Process(target=_child, args=(case, tokenizer, queue))
    start = time.perf_counter()
    process.start()
    process.join(timeout)
    alive = process.is_alive()
    if alive:
        process.kill()
        process.join()
    if alive or queue.empty():
        detail = f"killed after {timeout} s" if alive else f"crashed (exit code {process.exitcode})"
        outcome, seconds, megabytes = "timeout" if alive else "error", time.perf_counter() - start, float("nan")
    else:
        outcome, detail, seconds, megabytes = queue.get()
    within = outcome == case.expect and seconds <= case.seconds and megabytes <= case.megabytes
    return {"case": case.name, "outcome": outcome, "expected": case.expect, "seconds": round(seconds, 2),
            "peak_extra_mb": round(megabytes, 1), "budget_seconds": case.seconds, "budget_mb": case.megabytes,
            "passed": within, "detail": detail}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="folder for results.csv")
    parser.add_argument("--only", nargs="*", help="case names to run (default: all)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds before a case is killed")
    args = parser.parse_args(argv)
    tokenizer = load_tokenizer("smollm2-135m")
    fsm.Guide.from_regex("a", tokenizer)  # the vocabulary is built once, before the forks
    rows = []
    for case in CASES:
        if args.only and case.name not in args.only:
            continue
        row = run_case(case, tokenizer, args.timeout)
        rows.append(row)
        print(f"{row['case']:26s} {row['outcome']:8s} {row['seconds']:8.2f} s {row['peak_extra_mb']:8.1f} MB "
              f"{'PASS' if row['passed'] else 'FAIL'}  {row['detail'][:110]}", flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        write_rows(args.out / "results.csv", rows, list(rows[0]))
    print(f"{sum(r['passed'] for r in rows)}/{len(rows)} cases within budget")
    return 0 if all(r["passed"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

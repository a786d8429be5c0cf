"""First walks of new schemas: our guides against llguidance and XGrammar, mask by mask, on the same instances.

    python -m experiments.mask_speed --tokenizer qwen2.5-coder-0.5b --per-subset 10 --out experiments/results/<name>

For each sampled JSONSchemaBench schema and its first valid instance (compact JSON, tokenized by the tokenizer), every
system compiles the schema and walks the instance: at each position a full next-token mask, then the instance's
token. Each system's tokenizer is set up once beforehand (timed apart) and warmed on one small schema, so every
schema of the sample is new to every system; then what is loaded is frozen out of garbage collection and young
objects are collected less often, as the CLI does (`assisted.models.loading.freeze_loaded_objects`); the systems
take turns per schema (the order rotated). Per (schema, system): compile seconds, walk seconds, the slowest single
position (mask and advance) and the positions over 3 ms.
A schema counts in the totals only where every system compiled it and accepted its whole instance.
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import time
from pathlib import Path

from experiments.coverage import DEFAULT_DATA, subset_of
from experiments.lib import cli, report

SLOW_MS = 3.0  # a position slower than this is one the issue counts
WARM_SCHEMA = {"type": "object", "properties": {"a": {"type": "string"}}}
FIELDS = ["subset", "schema", "tokens", "system", "status", "compile_s", "walk_s", "max_position_ms", "slow_positions"]


class Ours:
    """`fsm.Guide`: compile = schema -> guide; a position = `mask()` then `advance(token)`."""

    name = "ours"

    def __init__(self, tokenizer):
        import fsm
        self.fsm, self.tokenizer = fsm, tokenizer

    def compile(self, schema):
        return self.fsm.Guide.from_rx(self.fsm.compile_schema(schema), self.tokenizer)

    def step(self, guide, token: int) -> bool:
        guide.mask()
        try:
            guide.advance(token)
        except self.fsm.InvalidTokenError:
            return False
        return True

    def final(self, guide) -> bool:
        return guide.is_final()


class LLGuidance:
    """llguidance's `LLMatcher` with its JSON-schema grammar; a position = a bitmask fill, then `consume_token`."""

    name = "llguidance"

    def __init__(self, tokenizer):
        import llguidance
        import llguidance.hf
        import llguidance.numpy
        self.llg, self.fill = llguidance, llguidance.numpy.fill_next_token_bitmask
        self.tokenizer = llguidance.hf.from_tokenizer(tokenizer)
        self.bitmask = llguidance.numpy.allocate_token_bitmask(1, self.tokenizer.vocab_size)

    def compile(self, schema):
        matcher = self.llg.LLMatcher(self.tokenizer, self.llg.LLMatcher.grammar_from_json_schema(schema))
        if matcher.is_error():
            raise ValueError(matcher.get_error())
        return matcher

    def step(self, matcher, token: int) -> bool:
        self.fill(matcher, self.bitmask, 0)
        return matcher.consume_token(token)

    def final(self, matcher) -> bool:
        return matcher.is_accepting()


class XGrammar:
    """XGrammar's `GrammarMatcher` (any whitespace, no compile cache); a position = a bitmask fill, then
    `accept_token`."""

    name = "xgrammar"

    def __init__(self, tokenizer):
        import xgrammar
        self.xgr = xgrammar
        info = xgrammar.TokenizerInfo.from_huggingface(tokenizer)
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self.bitmask = xgrammar.allocate_token_bitmask(1, info.vocab_size)

    def compile(self, schema):
        return self.xgr.GrammarMatcher(self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=True))

    def step(self, matcher, token: int) -> bool:
        matcher.fill_next_token_bitmask(self.bitmask)
        return matcher.accept_token(token)

    def final(self, matcher) -> bool:
        return matcher.is_terminated() or matcher.accept_token(matcher.stop_token_ids[0])


SYSTEMS = {s.name: s for s in (Ours, LLGuidance, XGrammar)}


def sample(per_subset: int, seed: int, data: Path = DEFAULT_DATA) -> list[tuple[str, str, dict, object]]:
    """(subset, file name, schema, first valid instance) for `per_subset` files of each JSONSchemaBench subset."""
    by_subset: dict[str, list[Path]] = {}
    for path in sorted(data.glob("*.json")):
        by_subset.setdefault(subset_of(path.name), []).append(path)
    rng, out = random.Random(seed), []
    for subset, paths in sorted(by_subset.items()):
        rng.shuffle(paths)
        taken = 0
        for path in paths:
            doc = json.loads(path.read_text())
            valid = [t["data"] for t in doc.get("tests", []) if t.get("valid")]
            if valid and taken < per_subset:
                out.append((subset, path.name, doc["schema"], valid[0]))
                taken += 1
    return out


def walk(system, schema, ids: list[int]) -> dict:
    """One first walk: compile, then mask and advance at every position (seconds, slowest position)."""
    start = time.perf_counter()
    try:
        state = system.compile(schema)
    except Exception as error:  # each system refuses what it does not support in its own way
        return {"status": f"compile error: {type(error).__name__}", "compile_s": time.perf_counter() - start}
    compiled, positions = time.perf_counter(), []
    for k, token in enumerate(ids):
        began = time.perf_counter()
        accepted = system.step(state, token)
        positions.append(time.perf_counter() - began)
        if not accepted:
            return {"status": f"rejected token {k}", "compile_s": compiled - start}
    status = "ok" if system.final(state) else "not final"
    return {"status": status, "compile_s": compiled - start, "walk_s": time.perf_counter() - compiled,
            "max_position_ms": max(positions, default=0.0) * 1e3,
            "slow_positions": sum(p * 1e3 > SLOW_MS for p in positions)}


def run(tokenizer, systems: list, schemas) -> list[dict]:
    """One row per (schema, system), the systems rotated per schema."""
    rows = []
    for n, (subset, name, schema, instance) in enumerate(schemas):
        ids = tokenizer.encode(json.dumps(instance, separators=(",", ":"), ensure_ascii=False),
                               add_special_tokens=False)
        for system in systems[n % len(systems):] + systems[: n % len(systems)]:
            rows.append({"subset": subset, "schema": name, "tokens": len(ids), "system": system.name,
                         **walk(system, schema, ids)})
    return rows


def summary(rows: list[dict], names: list[str]) -> list[str]:
    """Totals over the schemas every system walked to the end, per system and against ours."""
    by_schema: dict[str, dict[str, dict]] = {}
    for r in rows:
        by_schema.setdefault(r["schema"], {})[r["system"]] = r
    walked = {n: [s for s, per in by_schema.items() if per.get(n, {}).get("status") == "ok"] for n in names}
    common = [s for s in by_schema if all(s in walked[n] for n in names)]
    each = ", ".join(f"{n} {len(walked[n])}" for n in names)
    lines = [f"{len(common)} of {len(by_schema)} schemas walked to the end by every system (each alone: {each}).", ""]
    table = []
    for n in names:
        firsts = [by_schema[s][n]["compile_s"] + by_schema[s][n]["walk_s"] for s in common]
        ours = [by_schema[s]["ours"]["compile_s"] + by_schema[s]["ours"]["walk_s"] for s in common]
        table.append([n, f"{sum(by_schema[s][n]['compile_s'] for s in common):.3f}",
                      f"{sum(by_schema[s][n]['walk_s'] for s in common):.3f}", f"{sum(firsts):.3f}",
                      f"{sum(ours) / sum(firsts):.2f}x" if firsts and sum(firsts) else "",
                      f"{statistics.median([o / f for o, f in zip(ours, firsts)]):.2f}x" if firsts else "",
                      f"{max((by_schema[s][n]['max_position_ms'] for s in common), default=0):.1f}",
                      sum(by_schema[s][n]["slow_positions"] for s in common)])
    return lines + report.table(["system", "compile s", "walk s", "first walks s", "ours / this (total)",
                                 "ours / this (median schema)", "slowest position ms",
                                 f"positions over {SLOW_MS:g} ms"], table)


def main(argv: list[str] | None = None) -> int:
    p = cli.parser("mask_speed", __doc__)
    p.add_argument("--tokenizer", default="qwen2.5-coder-0.5b", help="named source, hub id or folder")
    p.add_argument("--per-subset", type=int, default=10, help="schemas drawn from each JSONSchemaBench subset")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--systems", nargs="+", choices=list(SYSTEMS), default=list(SYSTEMS))
    cli.add_out(p, required=False)
    argv, args = cli.begin(p.parse_args, argv)
    from assisted.models.loading import load_tokenizer
    tokenizer = load_tokenizer(args.tokenizer)
    systems, setup = [], []
    for name in args.systems:
        start = time.perf_counter()
        try:
            system = SYSTEMS[name](tokenizer)
        except ImportError as error:
            print(f"error: {name} is not installed ({error}); pip install it or leave it out with --systems",
                  file=sys.stderr)
            return 1
        walk(system, WARM_SCHEMA, tokenizer.encode('{"a":"b"}', add_special_tokens=False))
        setup.append(f"{name} {time.perf_counter() - start:.2f} s")
        systems.append(system)
    from assisted.models.loading import freeze_loaded_objects
    freeze_loaded_objects()
    rows = run(tokenizer, systems, sample(args.per_subset, args.seed))
    body = summary(rows, [s.name for s in systems])
    print("\n".join(body))
    if args.out:
        versions = [f"{m} {report.package_version(m)}" for m in ("llguidance", "xgrammar") if m in args.systems]
        head = [*report.run_lines("experiments.mask_speed", argv, *versions),
                f"- tokenizer {args.tokenizer} ({len(tokenizer)} tokens); set-up and warm-up, once: {', '.join(setup)}"]
        report.write_run(Path(args.out), "First walks of new schemas: ours, llguidance, XGrammar", head, body, rows,
                         FIELDS)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

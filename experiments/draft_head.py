"""What a reduced draft head saves: one assistant step with the full LM head vs N merge-ranked rows.

    python -m experiments.draft_head --model qwen2.5-coder-0.5b --threads 1 --out results/draft-head/

Two tables:

1. cost: after a 64-token prefill, one drafting step (one token through the body, the head, the (1, V)
   logits row and an argmax with its host sync, as `AssistantDrafter.next` does) for each head, interleaved
   within every repeat; medians, and the ratio full / variant per repeat (`experiments.intervals.paired_ratio`,
   > 1: the variant is faster). Heads: "full" (the model's own forward, logits of the last position), "top-N"
   (`drafting.heads`, N merge-ranked ids), "mask-a" (mask-sparse rows: `a` allowed ids). For the int8 copy
   (`assisted.loading.int8_copy`, the README's assistant) and, with `--float32`, the float32 model.
2. coverage: on a text sample (this repository's .py and .md files, and experiments/prompts/speedup.json),
   the fraction of token positions whose token is outside the top N, alone and with every id seen earlier in
   the same document (the per-call prompt ids): where a reduced head would draft wrong (a token the target
   wants that the assistant cannot propose). Tokenizer only.
3. with `--generate TARGET`: end to end, greedy `assisted.generate` (heuristic schedule, packed target, int8
   assistant) over the structured tasks (`experiments.tasks.STRUCTURED_TASKS`, schema-constrained) and the
   first code prompts of speedup.json (unconstrained), per system interleaved within every repeat: "full"
   (the model's own forward), "mask-sparse" (the default under a constraint), "top-Nk" (`draft_vocab=N`).
   Outputs must be token-identical; seconds per token, median, and full / system paired over (task, repeat).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from drafting.cache import crop_to, forward, new_cache
from drafting.heads import Rows, full_rows, hidden_state, kept_rows, slice_rows
from drafting.ranking import top_ids
from experiments.intervals import paired_ratio
from experiments.machine import REPO, run_lines

PROMPT = "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n" * 4


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m experiments.draft_head", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="qwen2.5-coder-0.5b")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--ns", type=int, nargs="+", default=[8192, 16384, 32768, 65536])
    p.add_argument("--allowed", type=int, nargs="+", default=[16, 1024], help="mask-sparse row counts")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--tokens", type=int, default=4, help="drafting steps timed per repeat and head (mean)")
    p.add_argument("--float32", action="store_true", help="also time the float32 model")
    p.add_argument("--skip-cost", action="store_true")
    p.add_argument("--generate", default=None, metavar="TARGET", help="also run generate end to end with this target")
    p.add_argument("--draft-vocabs", type=int, nargs="+", default=[32768], help="draft_vocab values for --generate")
    p.add_argument("--code-prompts", type=int, default=1)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--generate-repeats", type=int, default=2)
    p.add_argument("--out", default=None, help="folder for timings.csv, coverage.csv and results.md")
    return p.parse_args(argv)


def step_full(model, cache, token: int) -> int:
    """One drafting step with the model's own head."""
    return int(forward(model, cache, [token], 1).float().argmax())


def step_rows(model, cache, token: int, rows: Rows, vocab_size: int) -> int:
    """One drafting step through the body and `rows` of the head."""
    return int(rows.logits(hidden_state(model, cache, [token]), vocab_size).argmax())


def time_heads(model, prefix: list[int], heads: dict, vocab_size: int, repeats: int, tokens: int) -> list[dict]:
    """Seconds per drafting step per head and repeat (the first round warms up and is dropped)."""
    cache = new_cache()
    forward(model, cache, prefix, 1)
    rows = []
    for repeat in range(repeats + 1):
        order = list(heads) if repeat % 2 else list(reversed(heads))  # alternate the order: no position bias
        for name in order:
            crop_to(cache, len(prefix))
            token, start = prefix[-1], time.perf_counter()
            for _ in range(tokens):
                token = step_full(model, cache, token) if heads[name] is None else \
                    step_rows(model, cache, token, heads[name], vocab_size)
            if repeat:
                rows.append({"head": name, "repeat": repeat, "seconds": (time.perf_counter() - start) / tokens})
    return rows


def cost_table(label: str, rows: list[dict]) -> list[str]:
    """Markdown rows: median ms per step, and full / head paired over repeats with a 90% interval."""
    names = list(dict.fromkeys(r["head"] for r in rows))
    by = {(r["head"], r["repeat"]): r["seconds"] for r in rows}
    repeats = sorted({r["repeat"] for r in rows})
    lines = []
    for name in names:
        median = statistics.median(by[name, k] for k in repeats)
        ratio, low, high = paired_ratio([(by["full", k], by[name, k]) for k in repeats])
        lines.append(f"| {label} | {name} | {median * 1e3:.1f} | {ratio:.2f}x ({low:.2f}-{high:.2f}) |")
    return lines


def measure_cost(args, model, label: str, tokenizer, vocab_size: int) -> tuple[list[dict], list[str]]:
    prefix = tokenizer(PROMPT).input_ids[:64]
    heads: dict = {"full": None}
    empty = torch.zeros(0, dtype=torch.long)
    for n in args.ns:
        heads[f"top-{n // 1024}k"] = kept_rows(model, top_ids(tokenizer, n, vocab_size), empty, vocab_size)
    for a in args.allowed:
        heads[f"mask-{a}"] = slice_rows(model, torch.arange(15, 15 + a))
    heads["full (rows)"] = full_rows(model)  # body + head applied separately: the reduced path's overhead
    with torch.inference_mode():
        timings = time_heads(model, prefix, heads, vocab_size, args.repeats, args.tokens)
    for row in timings:
        row["model"] = label
    return timings, cost_table(label, timings)


def documents() -> list[str]:
    """The coverage sample: the repository's .py and .md files (results folders excluded) and the prompts."""
    files = sorted(p for p in REPO.rglob("*") if p.suffix in (".py", ".md") and ".venv" not in p.parts
                   and "results" not in p.parts and p.is_file())
    prompts = json.loads((REPO / "experiments/prompts/speedup.json").read_text())
    return [p.read_text(errors="replace") for p in files] + [p["prompt"] for p in prompts]


def measure_coverage(tokenizer, vocab_size: int, ns: list[int]) -> tuple[list[dict], list[str]]:
    """Per N: positions outside the top N, and outside the top N plus the ids seen earlier in the document."""
    docs = [tokenizer(text).input_ids for text in documents()]
    total = sum(len(d) for d in docs)
    rows, lines = [], []
    for n in ns:
        kept = torch.zeros(vocab_size, dtype=torch.bool)
        kept[top_ids(tokenizer, n, vocab_size)] = True
        outside = outside_copied = 0
        for ids in docs:
            seen: set[int] = set()
            for token in ids:
                out = not bool(kept[token])
                outside += out
                outside_copied += out and token not in seen
                seen.add(token)
        rows.append({"n": n, "positions": total, "outside_top_n": outside, "outside_top_n_and_earlier": outside_copied})
        lines.append(f"| {n} | {total} | {outside / total:.4f} | {outside_copied / total:.4f} |")
    return rows, lines


def generate_systems(draft_vocabs: list[int]) -> dict[str, tuple[int | None, bool]]:
    """name -> (draft_vocab, mask-sparse rows)."""
    return {"full": (None, False), "mask-sparse": (None, True)} | {f"top-{n // 1024}k": (n, True) for n in draft_vocabs}


def generate_tasks(code_prompts: int) -> list[tuple[str, dict]]:
    """(name, generate kwargs): the structured tasks, then the first code prompts (unconstrained)."""
    from experiments.tasks import STRUCTURED_TASKS
    prompts = json.loads((REPO / "experiments/prompts/speedup.json").read_text())
    code = [p for p in prompts if p["class"] == "code"][:code_prompts]
    return [(t.name, {"messages": t.messages(True), "schema": t.schema}) for t in STRUCTURED_TASKS] + \
        [(p["name"], {"messages": [{"role": "user", "content": p["prompt"]}]}) for p in code]


def measure_generate(args) -> tuple[list[dict], list[str]]:
    """End-to-end seconds per token of each system; asserts token-identical outputs."""
    import assisted.draft_vocab as draft_vocab_module
    from assisted import generate
    from experiments.tasks import load_pair
    loaded = load_pair(args.generate, args.model, int8=True, packed=True)
    if loaded is None:
        raise SystemExit(1)
    model, tokenizer, helper = loaded
    systems, tasks, rows = generate_systems(args.draft_vocabs), generate_tasks(args.code_prompts), []
    for name, kwargs in tasks:  # warm-up: the guides compile, the slices are made
        for vocab in {v for v, _ in systems.values()}:
            generate(model, helper, tokenizer=tokenizer, max_new_tokens=4, draft_vocab=vocab, **kwargs)
    for repeat in range(1, args.generate_repeats + 1):
        for name, kwargs in tasks:
            outputs = {}
            for system in (list(systems) if repeat % 2 else list(reversed(systems))):
                vocab, sparse = systems[system]
                draft_vocab_module.MASK_SPARSE = sparse
                start = time.perf_counter()
                out = generate(model, helper, tokenizer=tokenizer, max_new_tokens=args.max_new_tokens,
                               schedule="heuristic", draft_vocab=vocab, **kwargs)
                seconds = time.perf_counter() - start
                outputs[system] = out.token_ids
                s = out.stats
                rows.append({"task": name, "system": system, "repeat": repeat, "seconds": seconds,
                             "new_tokens": s.new_tokens, "assistant_seconds": s.seconds.assistant,
                             "assistant_calls": s.assistant_forward_passes, "drafted": s.drafted,
                             "accepted": s.accepted})
            assert len({tuple(o) for o in outputs.values()}) == 1, f"{name}: outputs differ between systems"
            print(name, repeat, {r["system"]: round(r["seconds"], 2) for r in rows if r["task"] == name
                                 and r["repeat"] == repeat}, flush=True)
    draft_vocab_module.MASK_SPARSE = True
    return rows, generate_table(rows, list(systems))


def generate_table(rows: list[dict], systems: list[str]) -> list[str]:
    """Markdown: per system and task kind, median s/token, assistant ms per call, acceptance, full / system."""
    lines = ["", "## End to end: greedy generate, seconds per new token (identical tokens in every system)", "",
             "| system | tasks | s/token (median) | assistant ms/call | accepted/drafted | full / system (90%) |",
             "|---|---|---|---|---|---|"]
    units = sorted({(r["task"], r["repeat"]) for r in rows})
    by = {(r["system"], r["task"], r["repeat"]): r for r in rows}
    structured = {r["task"] for r in rows} - {r["task"] for r in rows if r["task"] in _code_names()}
    for group, members in (("structured", structured), ("code", set(_code_names()))):
        chosen = [u for u in units if u[0] in members]
        if not chosen:
            continue
        for system in systems:
            own = [by[system, *u] for u in chosen]
            per_token = statistics.median(r["seconds"] / r["new_tokens"] for r in own)
            per_call = sum(r["assistant_seconds"] for r in own) / max(1, sum(r["assistant_calls"] for r in own))
            accepted = sum(r["accepted"] for r in own) / max(1, sum(r["drafted"] for r in own))
            ratio, low, high = paired_ratio([(by["full", *u]["seconds"], by[system, *u]["seconds"]) for u in chosen])
            lines.append(f"| {system} | {group} | {per_token:.3f} | {per_call * 1e3:.1f} | {accepted:.2f} | "
                         f"{ratio:.2f}x ({low:.2f}-{high:.2f}) |")
    return lines


def _code_names() -> list[str]:
    return [p["name"] for p in json.loads((REPO / "experiments/prompts/speedup.json").read_text())]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out) if args.out else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    from assisted.loading import int8_copy, load_model, load_tokenizer
    from drafting.cache import logits_size
    tokenizer = load_tokenizer(args.model)
    vocab_size = len(tokenizer)
    report = ["## Coverage: positions whose token is outside the kept ids", "",
              "| N | positions | outside top N | outside top N and earlier ids of the document |", "|---|---|---|---|"]
    coverage, lines = measure_coverage(tokenizer, vocab_size, args.ns)
    report += lines
    print("\n".join(report), flush=True)
    timings = []
    if not args.skip_cost:
        model = load_model(args.model)
        vocab_size = logits_size(model)
        cost = ["", "## Cost of one drafting step (ms, median) and full / head (paired, 90% interval)", "",
                "| model | head | ms per step | full / head |", "|---|---|---|---|"]
        models = [("int8", int8_copy(model))] + ([("float32", model)] if args.float32 else [])
        for label, m in models:
            rows, lines = measure_cost(args, m, label, tokenizer, vocab_size)
            timings += rows
            cost += lines
            print("\n".join(lines), flush=True)
        report += cost
    generated = []
    if args.generate:
        generated, lines = measure_generate(args)
        report += lines
        print("\n".join(lines), flush=True)
    if out:
        (out / "results.md").write_text("\n".join(run_lines("experiments.draft_head", argv or sys.argv[1:]) + [""] + report)
                                        + "\n")
        _write(out / "coverage.csv", coverage)
        if timings:
            _write(out / "timings.csv", timings)
        if generated:
            _write(out / "generate.csv", generated)
    return 0


def _write(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader(), writer.writerows(rows)


if __name__ == "__main__":
    sys.exit(main())

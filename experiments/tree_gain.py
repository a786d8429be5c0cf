"""Draft trees vs chains: does the side leaf (`generate(tree=True)`) pay on this machine?

Both systems run `assisted.generate` with the same pair, schedule and seed; "tree" adds the assistant's
runner-up at its first unsure token. Interleaved per (prompt, temperature, repeat) with alternating order;
reports tokens per target forward, seconds per token, paired ratios (chain s/token over tree s/token, > 1: the
tree is faster) and, greedy, whether the outputs are identical.

    python -m experiments.tree_gain --out experiments/results/draft-trees-qwen-cpu-2026-11-26
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from assisted import generate  # noqa: E402
from drafting.kv_cache import crop_to, forward, new_cache  # noqa: E402
from drafting.tree import BRANCH_BELOW, Branch, tree_forward  # noqa: E402
from experiments.lib.intervals import paired_ratio  # noqa: E402
from experiments.lib.machine import run_lines  # noqa: E402
from experiments.lib.prompt_split import SPLIT_PROMPTS, load_prompts  # noqa: E402
from experiments.lib.tasks import chat_ids, load_pair_or_none, write_rows  # noqa: E402

SYSTEMS = ("chain", "tree")
FIELDS = ("class", "prompt", "temperature", "repeat", "system", "seconds", "new_tokens", "target_forwards",
          "tokens_per_forward", "seconds_per_token", "branches", "leaves_taken", "leaves_priced_out", "token_ids")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--assistant", default="qwen2.5-coder-0.5b")
    ap.add_argument("--per-class", type=int, default=2, help="prompts per class of experiments/prompts/speedup.json")
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.7])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=40)
    ap.add_argument("--schedule", default="auto")
    ap.add_argument("--seed", type=int, default=6000)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cost-reps", type=int, default=15, help="timed forwards per system for the forward-cost line")
    ap.add_argument("--costs-only", action="store_true", help="only time the forwards; append the line to README.md")
    ap.add_argument("--out", type=Path, required=True)
    return ap.parse_args(argv)


def run_one(system: str, model, assistant, tokenizer, ids: list[int], temperature: float, seed: int, args) -> dict:
    """One timed generation; the row's measurements."""
    start = time.perf_counter()
    out = generate(
        model,
        assistant,
        tokenizer=tokenizer,
        input_ids=ids,
        max_new_tokens=args.max_new_tokens,
        do_sample=temperature > 0,
        temperature=temperature or 1.0,
        seed=seed,
        num_assistant_tokens_schedule=args.schedule,
        tree=system == "tree",
    )
    seconds, s = time.perf_counter() - start, out.stats
    return {"seconds": seconds, "new_tokens": s.new_tokens, "target_forwards": s.target_forward_passes,
            "tokens_per_forward": s.new_tokens / max(s.target_forward_passes, 1),
            "seconds_per_token": seconds / max(s.new_tokens, 1), "branches": s.branches,
            "leaves_taken": s.leaves_taken, "leaves_priced_out": s.leaves_priced_out,
            "token_ids": " ".join(map(str, out.token_ids))}


def run(args, model, assistant, tokenizer, prompts: list[dict]) -> list[dict]:
    """Every (prompt, temperature, repeat) for both systems, alternating which goes first."""
    ids0 = chat_ids(tokenizer, prompts[0])
    for system in SYSTEMS:  # warm-up: packing, the cost tables of `auto`
        run_one(system, model, assistant, tokenizer, ids0, 0.0, 0, args)
    rows, cells = [], [(p, t, r) for r in range(args.repeats) for t in args.temperatures for p in prompts]
    for i, (p, t, r) in enumerate(cells):
        ids = chat_ids(tokenizer, p)
        for system in (SYSTEMS if i % 2 == 0 else SYSTEMS[::-1]):
            res = run_one(system, model, assistant, tokenizer, ids, t, args.seed + r, args)
            rows.append({"class": p["class"], "prompt": p["name"], "temperature": t, "repeat": r, "system": system,
                         **res})
        print(f"{i + 1}/{len(cells)} {p['name']} T={t}: " + ", ".join(
            f"{row['system']} {row['seconds_per_token']:.3f} s/tok {row['tokens_per_forward']:.2f} tok/fwd"
            for row in rows[-2:]), flush=True)
    return rows


def forward_costs(model, tokenizer, prompt: dict, reps: int, k: int = 5) -> dict[str, float]:
    """Median seconds of one target forward over a chain of k draft tokens (+ the last committed one) and over the
    same chain plus a leaf (the tree's mask and positions), interleaved, after a prefill of `prompt`."""
    ids = chat_ids(tokenizer, prompt)
    cache, times = new_cache(), {"chain": [], "tree": []}
    with torch.inference_mode():
        forward(model, cache, ids[:-1], 1)
        chain = ids[-1:] + list(range(1000, 1000 + k))
        for _ in range(reps):
            for system in SYSTEMS:
                start = time.perf_counter()
                if system == "chain":
                    forward(model, cache, chain, k + 1)
                else:
                    tree_forward(model, cache, len(ids), chain + [2000], Branch(1, 2000, None, True, 0.5))
                times[system].append(time.perf_counter() - start)
                crop_to(cache, len(ids) - 1)
    return {s: statistics.median(t) for s, t in times.items()}


def units(rows: list[dict]) -> dict[tuple, dict[str, dict]]:
    """(prompt, temperature, repeat) -> system -> row."""
    out: dict[tuple, dict[str, dict]] = {}
    for row in rows:
        out.setdefault((row["prompt"], row["temperature"], row["repeat"]), {})[row["system"]] = row
    return out


def _mean(group: list[dict], system: str, field: str) -> float:
    return statistics.fmean(u[system][field] for u in group)


def summary_lines(rows: list[dict]) -> list[str]:
    """The README's table: per temperature and overall."""
    lines = ["| units | n | chain tok/fwd | tree tok/fwd | chain s/tok | tree s/tok | leaves taken / branches | "
             "chain s/tok / tree s/tok [90% CI] |", "|---|---|---|---|---|---|---|---|"]
    temperatures = sorted({r["temperature"] for r in rows})
    for label, keep in [*((f"T = {t}", t) for t in temperatures), ("all", None)]:
        group = [u for k, u in units(rows).items() if keep is None or k[1] == keep]
        branches = sum(u["tree"]["branches"] for u in group)
        ratio, low, high = paired_ratio([(u["chain"]["seconds_per_token"], u["tree"]["seconds_per_token"])
                                         for u in group])
        lines.append(
            f"| {label} | {len(group)} | {_mean(group, 'chain', 'tokens_per_forward'):.2f} | "
            f"{_mean(group, 'tree', 'tokens_per_forward'):.2f} | {_mean(group, 'chain', 'seconds_per_token'):.3f} | "
            f"{_mean(group, 'tree', 'seconds_per_token'):.3f} | "
            f"{sum(u['tree']['leaves_taken'] for u in group)} / {branches} | "
            f"{ratio:.3f} [{low:.3f}, {high:.3f}] |"
        )
    greedy = [u for k, u in units(rows).items() if k[1] == 0]
    same = sum(u["chain"]["token_ids"] == u["tree"]["token_ids"] for u in greedy)
    return [*lines, "", f"- greedy (T = 0) outputs identical, chain vs tree: {same} of {len(greedy)}"]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    argv = list(argv if argv is not None else sys.argv[1:])
    loaded = load_pair_or_none(args.target, args.assistant, quantize_assistant="int8", pack=True)
    if loaded is None:
        return 1
    model, tokenizer, assistant = loaded
    prompts = load_prompts(SPLIT_PROMPTS, "tuning", args.per_class)  # tuned on the tuning half
    costs = forward_costs(model, tokenizer, prompts[0], args.cost_reps)
    cost_line = (f"- one target forward, median of {args.cost_reps} interleaved (`--costs-only`): chain of 5 drafts "
                 f"(6 rows) {costs['chain'] * 1e3:.1f} ms, the same plus a leaf (7 rows, tree mask) "
                 f"{costs['tree'] * 1e3:.1f} ms")
    if args.costs_only:
        args.out.mkdir(parents=True, exist_ok=True)
        with open(args.out / "README.md", "a") as f:
            f.write(cost_line + "\n")
        print(cost_line)
        return 0
    rows = run(args, model, assistant, tokenizer, prompts)
    args.out.mkdir(parents=True, exist_ok=True)
    write_rows(args.out / "results.csv", rows, FIELDS)
    readme = [f"# Draft trees vs chains {args.out.name}", "", *run_lines("experiments.tree_gain", argv),
              f"- target {args.target} fp32 packed, assistant {args.assistant} (int8 copy), schedule {args.schedule}, "
              f"{args.max_new_tokens} new tokens, {args.repeats} repeats, seeds from {args.seed}; branch below "
              f"confidence {BRANCH_BELOW}", "", *summary_lines(rows), cost_line]
    (args.out / "README.md").write_text("\n".join(readme) + "\n")
    print("\n".join(readme))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Ablation: `auto` with its defaults, against the same with one drafting technique turned off (or on).

    python -m experiments.ablation --assistant-int8 --packed-target --threads 1 --half tuning

Each arm is `assisted.generate` with the defaults and one argument changed (ARMS), or with another copy of the
assistant (SWAPPED_ASSISTANT: `--arms int8-assistant` against `--assistant-int4` defaults). Per (prompt, temperature,
repeat) cell the arms run interleaved, the order rotating per cell; each arm is paired with "defaults" per
cell (seconds per new token, geometric mean with a 90% interval): > 1 where the defaults are faster than the
arm. Decisions about defaults are made on the tuning half (`experiments.lib.prompt_split`). Writes results.csv and
README.md to --out.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from assisted import generate  # noqa: E402
from experiments.lib import shards  # noqa: E402
from experiments.lib.intervals import grouped, table  # noqa: E402
from experiments.lib.machine import run_lines  # noqa: E402
from experiments.lib.prompt_split import HALVES, SPLIT_PROMPTS, load_prompts  # noqa: E402
from experiments.lib.tasks import (  # noqa: E402
    add_assistant_quantization, assistant_label, assistant_quantization, chat_ids, load_pair_or_none, write_rows)

BASE = "defaults"
ARMS = {BASE: {}, "no-lookup": {"prompt_lookup": False}, "tree": {"tree": True},
        "int4-assistant": {}, "int8-assistant": {}}  # arm -> generate() arguments changed from the defaults
# arm -> the copy of --assistant it drafts with (the defaults draft with the copy the flags ask for)
SWAPPED_ASSISTANT = {"int4-assistant": "int4", "int8-assistant": "int8"}
DEFAULT_ARMS = ("no-lookup", "tree")  # what --arms runs unless told
FIELDS = ("class", "prompt", "temperature", "repeat", "system", "seconds", "new_tokens", "target_forwards")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m experiments.ablation", description=__doc__.split("\n")[0])
    p.add_argument("--target", default="qwen2.5-coder-1.5b")
    p.add_argument("--assistant", default="qwen2.5-coder-0.5b")
    add_assistant_quantization(p)
    p.add_argument("--packed-target", action="store_true")
    p.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(DEFAULT_ARMS))
    p.add_argument("--prompts", type=Path, default=SPLIT_PROMPTS)
    p.add_argument("--half", choices=[*HALVES, "all"], default="tuning")
    p.add_argument("--per-class", type=int, default=None)
    p.add_argument("--shard", type=int, nargs=2, metavar=("I", "N"), default=None,
                   help="only prompts I, I+N, ... (one shard per core)")
    p.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.7])
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--seed", type=int, default=1000)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--report-only", action="store_true", help="report every shard under --out together")
    return p.parse_args(argv)


def run_arm(arm: str, model, assistant, tokenizer, ids: list[int], temperature: float, seed: int,
            max_new_tokens: int) -> dict:
    """One generation of `arm`: seconds, new tokens and target forwards."""
    sample = temperature > 0
    start = time.perf_counter()
    out = generate(
        model,
        assistant,
        tokenizer=tokenizer,
        input_ids=ids,
        max_new_tokens=max_new_tokens,
        do_sample=sample,
        temperature=temperature if sample else 1.0,
        seed=seed,
        num_assistant_tokens_schedule="auto",
        **ARMS[arm],
    )
    return {"seconds": time.perf_counter() - start, "new_tokens": out.stats.new_tokens,
            "target_forwards": out.stats.target_forward_passes}


def run(args, model, assistant, tokenizer, prompts: list[dict]) -> list[dict]:
    """Every (prompt, temperature, repeat) cell, arms interleaved in rotating order; one row per generation."""
    from experiments.models import load_assistant
    arms = tuple(a for a in ARMS if a in {*args.arms, BASE})
    helpers = {arm: load_assistant(args.assistant, model, quantize=SWAPPED_ASSISTANT[arm])
               for arm in arms if arm in SWAPPED_ASSISTANT}
    for arm in arms:  # untimed: allocators, and the costs auto keeps per model pair
        run_arm(arm, model, helpers.get(arm, assistant), tokenizer, chat_ids(tokenizer, prompts[0]), 0.0, 0,
                args.max_new_tokens)
    rows = []
    cells = [(p, t, r) for r in range(args.repeats) for t in args.temperatures for p in prompts]
    for i, (p, t, r) in enumerate(cells):
        ids = chat_ids(tokenizer, p)
        for arm in arms[i % len(arms):] + arms[: i % len(arms)]:
            res = run_arm(arm, model, helpers.get(arm, assistant), tokenizer, ids, t, args.seed + r,
                          args.max_new_tokens)
            rows.append({"class": p["class"], "prompt": p["name"], "temperature": t, "repeat": r, "system": arm, **res})
            print(f"{p['name']:28} T={t} {arm:16} {res['seconds'] / max(res['new_tokens'], 1):.3f} s/token",
                  file=sys.stderr, flush=True)
    return rows


def report(rows: list[dict]) -> list[str]:
    """Markdown: each arm paired with the defaults, over all units, per class and per temperature."""
    from experiments.speedup import units
    arms = [a for a in ARMS if a != BASE and any(r["system"] == a for r in rows)]
    return table(*grouped(units(rows), arms, BASE))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.report_only:
        return report_shards(args.out)
    shards.check(args.shard)
    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = load_pair_or_none(args.target, args.assistant, quantize_assistant=assistant_quantization(args),
                               pack=args.packed_target)
    if loaded is None:
        return 1
    model, tokenizer, assistant = loaded
    prompts = shards.pick(load_prompts(args.prompts, None if args.half == "all" else args.half, args.per_class),
                          args.shard)
    rows = run(args, model, assistant, tokenizer, prompts)
    out = shards.folder(args.out, args.shard)
    out.mkdir(parents=True, exist_ok=True)
    write_rows(out / "results.csv", rows, FIELDS)
    lines = [f"# Ablation {out.name}", "", *run_lines("experiments.ablation", argv),
             f"- target {args.target}{' (packed)' if args.packed_target else ''}, assistant {assistant_label(args)}"
             f", {args.half} half, {len(prompts)} prompts, "
             f"T {args.temperatures}, {args.max_new_tokens} new tokens, {args.repeats} repeat(s)", "",
             "Each arm's seconds per token / the defaults' (> 1: the defaults are faster), paired per "
             "(prompt, temperature, repeat) unit, geometric mean with a 90% t-interval.", "", *report(rows), ""]
    (out / "README.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


def report_shards(out: Path) -> int:
    """Append the arms' ratios over every shard of a run to `out`/README.md (its shards' commands first)."""
    from experiments.speedup import read_rows
    paths = shards.results(out)
    rows = [r for path in paths for r in read_rows(path)]
    commands = [next(x for x in (p.parent / "README.md").read_text().splitlines() if x.startswith("- command:"))
                for p in paths]
    lines = [f"# Ablation {out.name}: {len(paths)} shard(s) together", "", *commands, "",
             "Each arm's seconds per token / the defaults' (> 1: the defaults are faster).", "", *report(rows), ""]
    (out / "README.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

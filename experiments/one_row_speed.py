"""One row through the engine against the single-row loop it replaced: the same run, interleaved, paired.

    python -m experiments.one_row_speed --base cd325a8 --repeats 6 \\
        --out experiments/results/one-row-speed-smollm2-cpu-<date>

Systems: `generate` from this tree and from `--base` (exported with `git archive`), each unit in a fresh subprocess
per system, the systems' order rotated per unit, on SmolLM2-135M-Instruct in float32, one thread, greedy: alone, and
drafted by an int4 copy of itself (`auto`, the default). A unit runs every prompt once after an untimed warm-up call
and reports the CPU seconds of its calls (less exposed to the other jobs of a shared machine than wall time). Python
function calls per step are counted by cProfile on a separate call with the "constant" schedule (k = 5), whose steps
are the same in both systems, so the count compares the loops and not the policy's timing-driven choices.
Reported: CPU seconds per unit, paired per unit (geometric mean, 90% interval: > 1 where this tree is faster), and
calls per step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
from io import BytesIO
from pathlib import Path

from experiments.lib.intervals import paired_ratio
from experiments.lib.machine import cpu_name, git, run_lines

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["Describe a fantasy hero as JSON.", "Write a haiku about the sea.", "List three prime numbers."]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 24},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 999},
                                           "weapon": {"enum": ["sword", "bow", "staff"]}},
          "required": ["name", "age", "weapon"]}

WORKER = r"""
import cProfile, json, pstats, sys, time, torch
torch.set_num_threads(1)
from assisted import generate, int4_copy
from experiments.models import load
setup, prompts, schema, budget = json.loads(sys.argv[1])
model, tok = load("smollm2-135m")
helper = int4_copy(model) if setup == "assistant" else None
def call(prompt, **kw):
    messages = [{"role": "user", "content": prompt}]
    constraint = {"schema": schema} if "JSON" in prompt else {}
    return generate(model, helper, tokenizer=tok, messages=messages, max_new_tokens=budget, **constraint, **kw)
call(prompts[0])  # untimed: caches, allocators, auto's costs
start = time.process_time()
tokens = sum(call(p).stats.new_tokens for p in prompts)
cpu = time.process_time() - start
profile = cProfile.Profile()
profile.enable()
out = call(prompts[0], num_assistant_tokens_schedule="constant")
profile.disable()
calls = pstats.Stats(profile).total_calls
print(json.dumps({"cpu": cpu, "tokens": tokens, "calls_per_step": calls / len(out.stats.steps),
                  "steps": len(out.stats.steps), "ids": out.token_ids}))
"""


def export(commit: str, folder: Path) -> Path:
    """The tree of `commit` in `folder` (once)."""
    if not (folder / "assisted").exists():
        folder.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit], check=True, capture_output=True).stdout
        tarfile.open(fileobj=BytesIO(archive)).extractall(folder, filter="data")
    return folder


def unit(root: Path, setup: str, budget: int) -> dict:
    env = dict(os.environ, PYTHONPATH=str(root), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    found = subprocess.run([sys.executable, "-c", WORKER, json.dumps([setup, PROMPTS, SCHEMA, budget])], cwd=root,
                           env=env, check=True, capture_output=True, text=True)
    return json.loads(found.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m experiments.one_row_speed", description=__doc__.split("\n")[0])
    p.add_argument("--base", required=True, help="the commit whose single-row loop is the baseline")
    p.add_argument("--repeats", type=int, default=6)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    roots = {"base": export(args.base, Path("/tmp") / f"one-row-speed-{args.base}"), "engine": ROOT}
    rows = []
    for repeat in range(args.repeats):
        for setup in ("alone", "assistant"):
            order = list(roots) if (repeat + (setup == "assistant")) % 2 == 0 else list(roots)[::-1]
            for system in order:
                row = {"repeat": repeat, "setup": setup, "system": system,
                       **unit(roots[system], setup, args.max_new_tokens)}
                rows.append(row)
                print(f"{repeat} {setup:9} {system:6} cpu {row['cpu']:.2f} s, {row['calls_per_step']:.0f} calls/step",
                      file=sys.stderr, flush=True)
    (args.out / "units.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    lines = [f"# One row through the engine: {args.out.name}", "", *run_lines("experiments.one_row_speed", argv),
             f"- base {args.base} ({git('log', '-1', '--format=%s', args.base)[:60]}), {cpu_name()}", "",
             "| setup | CPU s per unit, base | engine | engine speed over base (90% interval) | calls/step base | "
             "engine | same tokens |", "|---|---|---|---|---|---|---|"]
    for setup in ("alone", "assistant"):
        mine = {(r["repeat"], r["system"]): r for r in rows if r["setup"] == setup}
        pairs = [(mine[(k, "base")]["cpu"], mine[(k, "engine")]["cpu"]) for k in range(args.repeats)]
        ratio, low, high = paired_ratio(pairs)
        median = {s: statistics.median(r["cpu"] for (_, t), r in mine.items() if t == s) for s in roots}
        calls = {s: statistics.median(r["calls_per_step"] for (_, t), r in mine.items() if t == s) for s in roots}
        same = all(mine[(k, "base")]["ids"] == mine[(k, "engine")]["ids"] for k in range(args.repeats))
        more = calls["engine"] / calls["base"] - 1
        lines.append(f"| {setup} | {median['base']:.2f} | {median['engine']:.2f} | {ratio:.3f}x [{low:.3f}, "
                     f"{high:.3f}] | {calls['base']:.0f} | {calls['engine']:.0f} ({more:+.1%}) | {same} |")
    lines += ["", __doc__.split("\n\n", 2)[2].strip()]
    (args.out / "README.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

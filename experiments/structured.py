"""Structured-generation benchmark: five modes over the Character and extraction schemas.

    python -m experiments.structured --target smollm2-135m
    python -m experiments.structured --target qwen2.5-coder-1.5b --assistant qwen2.5-coder-0.5b

Modes (all greedy, `assisted.generate`): unconstrained (prompted to answer JSON), constrained (mask only),
constrained+forced (coalesced forced tokens), constrained+assistant, full (both); the assistant modes
run only with --assistant. Writes results.csv, structured.png and README.md to --out.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from experiments.tasks import (  # noqa: E402
    MODES, STRUCTURED_TASKS, add_assistant_quantization, assistant_label, assistant_quantization, extract_json,
    load_pair_or_none, run_mode, validate, write_rows)
from experiments.machine import machine_lines  # noqa: E402

FIELDS = ("task", "kind", "mode", "repeat", "seconds", "new_tokens", "target_forwards", "forced_share",
          "tokens_per_s", "valid")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m experiments.structured", description=__doc__.split("\n")[0])
    p.add_argument("--target", default="smollm2-135m")
    p.add_argument("--assistant", default=None)
    add_assistant_quantization(p)
    p.add_argument("--packed-target", action="store_true",
                   help="pre-pack the target's Linear weights for multi-token forwards (assisted.packing; CPU): "
                        "every system, the target alone included, runs on the same packed model")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--tasks", nargs="+", default=None, help="task names (default: all)")
    p.add_argument("--schedule", default="heuristic", choices=["heuristic", "constant", "auto"],
                   help="candidate-length policy of the assistant modes")
    p.add_argument("--out", type=Path, default=None)
    return p.parse_args(argv)


def run(model, tokenizer, assistant, tasks, repeats: int, max_new_tokens: int, progress: bool = True,
        schedule: str = "heuristic") -> list[dict]:
    """Every (task, repeat) cell runs all modes, order rotated per cell; one row per generation."""
    from tqdm.auto import tqdm
    modes = [m for m, (needs, *_) in MODES.items() if assistant is not None or not needs]
    cells = [(t, r) for r in range(repeats) for t in tasks]
    for t in tasks:
        run_mode("constrained", t, model, tokenizer, max_new_tokens=2)  # compile the index before timing
    for mode in modes:  # untimed: allocators; schedule="auto" learns the costs, as in any process that generates twice
        run_mode(mode, tasks[0], model, tokenizer, assistant, max_new_tokens=16, schedule=schedule)
    rows, bar = [], tqdm(total=len(cells) * len(modes), disable=not progress, desc="structured")
    for i, (task, r) in enumerate(cells):
        for mode in modes[i % len(modes):] + modes[: i % len(modes)]:
            x = run_mode(mode, task, model, tokenizer, assistant, max_new_tokens=max_new_tokens, schedule=schedule)
            rows.append({"task": task.name, "kind": task.kind, "mode": mode, "repeat": r, "seconds": x.seconds,
                         "new_tokens": x.new_tokens, "target_forwards": x.target_passes,
                         "forced_share": x.forced_appended / max(x.new_tokens, 1), "tokens_per_s": x.tokens_per_s,
                         "valid": validate(task, extract_json(x.text) if mode == "unconstrained" else x.text)})
            bar.update(1)
    bar.close()
    return rows


def summarize(rows: list[dict]) -> dict:
    """{(task, mode): medians, validity rate, speedup vs constrained}."""
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["task"], r["mode"]), []).append(r)
    out = {k: {f: statistics.median(x[f] for x in v) for f in ("seconds", "new_tokens", "target_forwards",
                                                                "forced_share", "tokens_per_s")}
           | {"valid": sum(x["valid"] for x in v) / len(v)} for k, v in groups.items()}
    for (task, mode), s in out.items():
        s["speedup"] = out[(task, "constrained")]["seconds"] / s["seconds"]
    return out


def plot(summary: dict, out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    tasks = list(dict.fromkeys(t for t, _ in summary))
    modes = [m for m in MODES if any(k[1] == m for k in summary)]
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(modes)
    for j, m in enumerate(modes):
        ax.bar([i + j * width for i in range(len(tasks))], [summary[(t, m)]["speedup"] for t in tasks], width, label=m)
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(tasks))], tasks)
    ax.set_ylabel("speedup vs plain constrained (wall time)"), ax.legend(fontsize=8)
    fig.tight_layout(), fig.savefig(out / "structured.png", dpi=110), plt.close(fig)


def write(rows, summary, args, out: Path, command: str) -> None:
    import transformers
    out.mkdir(parents=True, exist_ok=True)
    write_rows(out / "results.csv", rows, FIELDS)
    plot(summary, out)
    lines = [f"# Structured benchmark {out.name}", "", f"- command: `{command}`", f"- date: {datetime.date.today()}",
             *machine_lines(),
             f"- target {args.target}, assistant {assistant_label(args)} "
             f"(schedule {getattr(args, 'schedule', 'heuristic')}), "
             f"fp32 CPU, torch threads {torch.get_num_threads()}",
             f"- torch {torch.__version__}, transformers {transformers.__version__}; greedy; max_new_tokens "
             f"{args.max_new_tokens}; repeats {args.repeats} (medians); modes interleaved per cell", "",
             "| task | mode | valid | tokens | wall s | target fwd | forced share | tok/s | speedup vs constrained |",
             "|---" * 9 + "|"]
    for (task, mode), s in summary.items():
        lines.append(
            f"| {task} | {mode} | {s['valid']:.0%} | {s['new_tokens']:.0f} | {s['seconds']:.2f} | "
            f"{s['target_forwards']:.0f} | {s['forced_share']:.0%} | {s['tokens_per_s']:.2f} | {s['speedup']:.2f}x |"
        )
    lines += ["", "![speedups](structured.png)", ""]
    (out / "README.md").write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = load_pair_or_none(args.target, args.assistant, quantize_assistant=assistant_quantization(args),
                               pack=args.packed_target)
    if loaded is None:
        return 1
    model, tokenizer, assistant = loaded
    tasks = [t for t in STRUCTURED_TASKS if args.tasks is None or t.name in args.tasks]
    rows = run(model, tokenizer, assistant, tasks, args.repeats, args.max_new_tokens, schedule=args.schedule)
    name = args.target.replace("/", "_") + (f"+{args.assistant}" if args.assistant else "")
    out = args.out or Path("experiments/results") / f"structured-{name}-{datetime.date.today()}"
    write(
        rows,
        summarize(rows),
        args,
        out,
        "python -m experiments.structured " + " ".join(argv if argv is not None else sys.argv[1:]),
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

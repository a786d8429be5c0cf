"""Speedup experiment: target alone vs transformers' assisted generation vs ours, greedy and sampled.

    python -m experiments.speedup --target qwen2.5-coder-1.5b --assistant qwen2.5-coder-0.5b --half validation

Prompts: `experiments/prompts/split.json`, one half of it (`experiments.lib.tasks`: methods are tuned on the
"tuning" half, headline numbers come from the "validation" half).

Systems per (prompt, temperature, repeat) cell, interleaved (the order rotates per cell):
  target       model.generate, no assistant
  hf-default   model.generate(assistant_model=...) with the library's defaults
               (transformers 5.23: num_assistant_tokens=20, schedule "constant", confidence threshold 0.4)
  hf-heuristic the same with num_assistant_tokens=5, schedule "heuristic" (reset before every call)
  ours         assisted.generate(schedule="heuristic", num_assistant_tokens=5)
  ours-auto    assisted.generate(schedule="auto", num_assistant_tokens=5): confidence-cut drafts or plain decoding
All systems stop on the same EOS set and use no top-k/top-p/repetition penalty. Before the timed cells each
system runs once, untimed, on the first prompt (allocators, caches; ours-auto learns the pair's costs there,
as it would in any process that generates more than once). Writes results.csv, greedy.png, sampling.png and
README.md to --out. The README also pairs ours-auto with each system per (prompt, repeat) unit, with
intervals (`--report-only` pools the units of a run's shards).
"""

from __future__ import annotations

import datetime
import platform
import statistics
import sys
from pathlib import Path

import torch

from experiments.lib import cli, report, runner
from experiments.lib.intervals import grouped, paired_ratio, table
from experiments.lib.systems import Systems
from experiments.lib.tasks import HALVES, SPLIT_PROMPTS, chat_ids, load_prompts

SYSTEMS = ("target", "hf-default", "hf-heuristic", "ours", "ours-auto")
OURS = ("ours", "ours-auto")
RATIOS = [(o, hf) for o in OURS for hf in ("hf-default", "hf-heuristic")] + [("ours-auto", "target")]  # y per token / x
INTERVAL = "{:.2f} [{:.2f}, {:.2f}]"  # a paired ratio and its interval
FIELDS = ("class", "prompt", "temperature", "repeat", "system", "seconds", "new_tokens", "target_forwards",
          "tokens_per_forward", "acceptance_rate", "mean_k")


def parse_args(argv: list[str] | None = None):
    p = cli.parser("speedup", __doc__)
    cli.add_models(p)
    cli.add_run(p, threads=None, repeats=2, out_required=False, max_new_tokens=48,
                temperatures=[0.0, 0.3, 0.6, 0.9, 1.2])
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--prompts", type=Path, default=SPLIT_PROMPTS)
    p.add_argument("--half", choices=[*HALVES, "all"], default="validation",
                   help="which half of the prompt set (experiments.lib.tasks; 'all': every prompt of --prompts)")
    p.add_argument("--per-class", type=int, default=None, help="use only the first N prompts of each class")
    p.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS),
                   help="systems to run (the target alone and ours-auto always run: every ratio is paired with them)")
    p.add_argument("--num-assistant-tokens", type=int, default=5, help="ours: starting k")
    p.add_argument("--no-warmup", dest="warmup", action="store_false",
                   help="skip the untimed first generation of each system (ours-auto then warms up in the first cell)")
    p.add_argument("--shard", type=int, nargs=2, metavar=("I", "N"), default=None,
                   help="run only prompts I, I+N, I+2N, ... (0 <= I < N), e.g. one shard per core, each into "
                        "--out/shard-I; --report-only then reports all shards together")
    p.add_argument("--report-only", action="store_true",
                   help="rebuild README.md and the plots from --out/results.csv, or from --out/shard-*/results.csv "
                        "(same arguments as the run)")
    return p.parse_args(argv)


def default_out() -> Path:
    return Path("experiments/results") / f"speedup-{platform.node() or 'machine'}-{datetime.date.today()}"


def run_one(systems: Systems, system: str, ids: list[int], temperature: float, seed: int) -> dict:
    """One timed generation of `system`: seconds, new tokens, target forwards, acceptance and (ours) mean k."""
    seconds, out, error = runner.timed(lambda: systems.run(system, ids, None, temperature, seed))
    if error:
        raise RuntimeError(f"{system}: {error}")
    return {"seconds": seconds, "new_tokens": out.new_tokens, "target_forwards": out.target_forwards,
            "tokens_per_forward": out.new_tokens / max(out.target_forwards, 1), "acceptance_rate": out.acceptance,
            "mean_k": out.mean_k}


def run(args, model, assistant, tokenizer, prompts: list[dict], progress=True) -> list[dict]:
    """All cells, systems interleaved with a rotating order; one row per generation."""
    systems = Systems(model, tokenizer, assistant, max_new_tokens=args.max_new_tokens,
                      num_assistant_tokens=args.num_assistant_tokens)
    names = chosen_systems(args.systems)
    if args.warmup:
        for system in names:
            run_one(systems, system, chat_ids(tokenizer, prompts[0]), 0.0, 0)

    def cell(unit, system, repeat):
        prompt, t = unit
        return {"class": prompt["class"], "prompt": prompt["name"], "temperature": t,
                **run_one(systems, system, chat_ids(tokenizer, prompt), t, args.seed + repeat)}
    units = [(p, t) for t in args.temperatures for p in prompts]
    rows = runner.run(units, names, cell, args.repeats)
    return [{k: r[k] for k in FIELDS} for r in rows]


def chosen_systems(names) -> tuple[str, ...]:
    """`names` in SYSTEMS order, with the target alone and ours-auto added (every ratio pairs with them)."""
    return tuple(s for s in SYSTEMS if s in {*names, "target", "ours-auto"})


def systems_in(rows: list[dict]) -> tuple[str, ...]:
    """The systems a run's rows hold, in SYSTEMS order."""
    return chosen_systems({r["system"] for r in rows})


def summarize(rows: list[dict]) -> dict:
    """{(class, temperature, system): medians over prompts and repeats}, latency per new token included."""
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["class"], r["temperature"], r["system"]), []).append(r)
    return {key: {"seconds": statistics.median(x["seconds"] for x in v),
                  "per_token": statistics.median(_per_token(x) for x in v),
                  "tokens_per_forward": statistics.median(x["tokens_per_forward"] for x in v),
                  "acceptance_rate": statistics.median(x["acceptance_rate"] for x in v),
                  "mean_k": statistics.median(x["mean_k"] for x in v),
                  "speedups": [_speedup(rows, x) for x in v]} for key, v in groups.items()}


def _per_token(row: dict) -> float:
    """Seconds per new token: sampled systems write texts of different lengths, so latency is per token."""
    return row["seconds"] / max(row["new_tokens"], 1)


def _speedup(rows: list[dict], row: dict) -> float:
    """Speedup of `row` over the target alone in the same cell, per new token."""
    cell = ("prompt", "temperature", "repeat")
    base = next(r for r in rows if r["system"] == "target" and all(r[k] == row[k] for k in cell))
    return _per_token(base) / _per_token(row)


def plot(summary: dict, out: Path) -> None:
    """greedy.png (latency per class at the first temperature) and sampling.png (speedup against temperature)."""
    classes, temps = sorted({c for c, _, _ in summary}), sorted({t for _, t, _ in summary})
    systems = chosen_systems({s for _, _, s in summary})
    fig, ax = report.pyplot().subplots(figsize=(7, 4))
    report.bar_groups(ax, classes, systems, lambda c, s: 1000 * summary[(c, temps[0], s)]["per_token"])
    ax.set(ylabel="median latency per new token (ms)", title=f"greedy latency per prompt class (T={temps[0]})")
    ax.legend(), report.save_figure(fig, out / "greedy.png")
    fig, ax = report.pyplot().subplots(figsize=(7, 4))
    for s in systems[1:]:
        values = [[x for c in classes for x in summary[(c, t, s)]["speedups"]] for t in temps]
        med = [statistics.median(v) for v in values]
        ax.errorbar(temps, med, yerr=[[m - min(v) for m, v in zip(med, values)],
                                      [max(v) - m for m, v in zip(med, values)]], marker="o", capsize=3, label=s)
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set(xlabel="temperature", ylabel="speedup over target alone (median, min-max)")
    ax.legend(), report.save_figure(fig, out / "sampling.png")


def write(rows: list[dict], summary: dict, args, out: Path, command: str, kept: list[str] | None = None) -> None:
    """results.csv, the plots and README.md; `kept`: the README lines of the run's date, machine, commit and
    versions when a report is rebuilt (else this process's)."""
    import transformers
    out.mkdir(parents=True, exist_ok=True)
    report.write_rows(out / "results.csv", rows, FIELDS)
    plot(summary, out)
    run = [f"- date: {datetime.date.today()}", *report.machine_lines(),
           f"- device: {args.device}, dtype: {args.dtype}, torch threads: {torch.get_num_threads()}",
           f"- torch {torch.__version__}, transformers {transformers.__version__}, python {platform.python_version()}",
           f"- target {args.target}{f' ({args.quantize_target})' if args.quantize_target else ''}, "
           f"assistant {cli.assistant_label(args)}, max_new_tokens {args.max_new_tokens}, repeats {args.repeats}"]
    systems = systems_in(rows)
    lines = [f"# Speedup run {out.name}", "", f"- command: `{command}`", *(kept or run),
             "", "Medians over prompts and repeats; systems interleaved within each cell. The CPU was shared "
             "with other engineers' jobs, so timings are noisy.", "",
             *report.table(_columns(systems), [_cells(c, t, {s: summary[(c, t, s)] for s in systems})
                                               for c in sorted({c for c, _, _ in summary})
                                               for t in sorted({t for _, t, _ in summary})]),
             "", "Latency is per new token (sampled systems write texts of different lengths); x/y = y's seconds "
             "per token / x's (> 1: x faster). hf acceptance is estimated as "
             "(new tokens - target forwards) / assistant forwards. mean k: the draft cap our policy chose, averaged "
             "over steps (ours-auto: its window, at most 20, while drafting, each draft cut by its confidences; 0 for "
             "plain decoding).", "", *_against_table(rows, summary), "",
             "![greedy](greedy.png)", "![sampling](sampling.png)", ""]
    (out / "README.md").write_text("\n".join(lines))


def _ratios(systems: tuple[str, ...]) -> list[tuple[str, str]]:
    return [(o, x) for o, x in RATIOS if o in systems and x in systems]


def _columns(systems: tuple[str, ...]) -> list[str]:
    drafted, ours = systems[1:], [o for o in OURS if o in systems]
    return (["class", "T"] + [f"{s} ms/tok" for s in systems] + [f"{o}/{hf}" for o, hf in _ratios(systems)]
            + [f"tok/fwd {s}" for s in drafted] + [f"accept {s}" for s in drafted] + [f"mean k {o}" for o in ours])


def _cells(c: str, t: float, g: dict) -> list[str]:
    systems = tuple(g)
    return ([c, str(t)] + [f"{1000 * g[s]['per_token']:.0f}" for s in systems]
            + [f"{g[hf]['per_token'] / g[o]['per_token']:.2f}" for o, hf in _ratios(systems)]
            + [f"{g[s]['tokens_per_forward']:.2f}" for s in systems[1:]]
            + [f"{g[s]['acceptance_rate']:.2f}" for s in systems[1:]]
            + [f"{g[o]['mean_k']:.1f}" for o in OURS if o in systems])


def _against_table(rows: list[dict], summary: dict, system: str = "ours-auto") -> list[str]:
    """Markdown: `system` against each other system per cell, paired per (prompt, repeat) unit, with intervals."""
    others = [s for s in systems_in(rows) if s != system]
    drafting = [s for s in others if s != "target"] or others
    cells: dict = {}  # (class, T) -> (prompt, repeat) -> {system: seconds per token}
    for (c, t, prompt, repeat), unit in units(rows).items():
        cells.setdefault((c, t), {})[(prompt, repeat)] = unit
    lines = [f"{system} paired with each system: geometric mean over the cell's (prompt, repeat) units of the other's "
             f"seconds per token / {system}'s (> 1: {system} faster), with a 90% t-interval. 'best other' is the "
             "drafting system with the lowest median in the cell.", "",
             "| class | T | units | " + " | ".join(others) + " | best other |", "|---" * (len(others) + 4) + "|"]
    verdicts, pooled = [], {s: [] for s in [*others, "best other"]}
    for (c, t), cell in sorted(cells.items()):
        best = min(drafting, key=lambda s: summary[(c, t, s)]["per_token"])
        pairs = {s: [(u[s], u[system]) for u in cell.values()] for s in others}
        r, lo, hi = paired_ratio(pairs[best])
        verdicts.append(1 if lo > 1 else -1 if hi < 1 else 0)
        for s in others:
            pooled[s] += pairs[s]
        pooled["best other"] += pairs[best]
        lines.append(f"| {c} | {t} | {len(cell)} | " + " | ".join(INTERVAL.format(*paired_ratio(pairs[s]))
                                                                   for s in others)
                     + f" | {best} {INTERVAL.format(r, lo, hi)} |")
    overall = ", ".join(f"{s} {INTERVAL.format(*paired_ratio(v))}" for s, v in pooled.items())
    return lines + ["", f"Against the best other drafting system, {system}'s interval lies above 1 in "
                    f"{verdicts.count(1)} of {len(cells)} cells and below 1 in {verdicts.count(-1)}. Over all "
                    f"{len(pooled['best other'])} units: {overall}.", "",
                    f"Pooled: {system} paired with each system over all units, the units of a class (all "
                    "temperatures) and of a temperature (all classes).", "",
                    *table(*grouped(units(rows), SYSTEMS, system))]


def units(rows: list[dict]) -> dict:
    """{(class, T, prompt, repeat): {system: seconds per token}}: the runs that can be paired."""
    out: dict = {}
    for r in rows:
        out.setdefault((r["class"], r["temperature"], r["prompt"], r["repeat"]), {})[r["system"]] = _per_token(r)
    return out


def _run_lines(readme: Path) -> list[str] | None:
    """An earlier README's lines on its run (date, machine, commit, versions: its first list without the
    command), so a rebuilt report names the code that ran (None: no README)."""
    if not readme.exists():
        return None
    header = readme.read_text().split("\n\n")[1].splitlines()  # title, blank, then the run's list
    return [line for line in header if not line.startswith("- command:")]


def _command_of(readme: Path) -> str:
    """The command an earlier README names (its "- command:" line)."""
    line = next(x for x in readme.read_text().splitlines() if x.startswith("- command:"))
    return line.removeprefix("- command:").strip().strip("`")


def read_rows(path: Path) -> list[dict]:
    """The rows of a results.csv written by `write`, with their types back."""
    return report.read_rows(path, text=("class", "prompt", "system"))


def main(argv: list[str] | None = None) -> int:
    argv, args = cli.begin(parse_args, argv)
    out = args.out or default_out()
    if args.report_only:  # the run's results, or every shard's together
        paths = sorted(out.glob("shard-*/results.csv")) or [out / "results.csv"]
        rows = [r for path in paths for r in read_rows(path)]
        sharded = [path for path in paths if path.parent != out]
        command = "python -m experiments.speedup " + " ".join(a for a in argv if a != "--report-only")
        command = "`; `".join([*(_command_of(path.parent / "README.md") for path in sharded), command])
        kept = _run_lines(out / "README.md") or (_run_lines(sharded[0].parent / "README.md") if sharded else None)
        write(rows, summarize(rows), args, out, command, kept)
        print(f"rewrote {out}/README.md and plots from {len(paths)} results file(s)")
        return 0
    first, every = args.shard or (0, 1)  # shard I of N: prompts I, I+N, I+2N, ... into out/shard-I
    if not 0 <= first < every:
        raise ValueError(f"--shard {first} {every}: need 0 <= I < N")
    out = out / f"shard-{first}" if args.shard else out
    model, tokenizer, assistant = cli.load(args)
    prompts = load_prompts(args.prompts, None if args.half == "all" else args.half, args.per_class)[first::every]
    rows = run(args, model, assistant, tokenizer, prompts)
    write(rows, summarize(rows), args, out, "python -m experiments.speedup " + " ".join(argv))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

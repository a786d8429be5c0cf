"""Speedup experiment: target alone vs transformers' assisted generation vs ours, greedy and sampled.

    python -m experiments.speedup --target qwen2.5-coder-1.5b --assistant qwen2.5-coder-0.5b --half validation

Prompts: `experiments/prompts/split.json`, one half of it (`experiments.lib.prompt_split`: methods are tuned on the
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
intervals (`experiments.stats`; `python -m experiments.stats RUN...` pools the units of several runs).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from assisted import generate  # noqa: E402
from experiments.lib import shards  # noqa: E402
from experiments.lib.machine import machine_lines  # noqa: E402
from experiments.lib.intervals import grouped, paired_ratio, table  # noqa: E402
from experiments.lib.prompt_split import HALVES, SPLIT_PROMPTS, load_prompts  # noqa: E402
from experiments.lib.tasks import (add_assistant_quantization, assistant_label, assistant_quantization,  # noqa: E402
                                   chat_ids, count_forwards, load_pair_or_none, write_rows)

SYSTEMS = ("target", "hf-default", "hf-heuristic", "ours", "ours-auto")
OURS = {"ours": "heuristic", "ours-auto": "auto"}  # system -> schedule
RATIOS = [(o, hf) for o in OURS for hf in ("hf-default", "hf-heuristic")] + [("ours-auto", "target")]  # y per token / x
FIELDS = ("class", "prompt", "temperature", "repeat", "system", "seconds", "new_tokens", "target_forwards",
          "tokens_per_forward", "acceptance_rate", "mean_k")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m experiments.speedup", description=__doc__.split("\n")[0])
    p.add_argument("--target", default="qwen2.5-coder-1.5b")
    p.add_argument(
        "--assistant",
        default="qwen2.5-coder-0.5b",
        help='a model source, or "random": a tiny random model with the target\'s vocabulary (a bad assistant)',
    )
    add_assistant_quantization(p)
    p.add_argument("--packed-target", action="store_true",
                   help="pre-pack the target's Linear weights for multi-token forwards (assisted.models.packing; CPU): "
                        "every system, the target alone included, runs on the same packed model")
    p.add_argument("--quantize-target", choices=["int4", "int8"], default=None,
                   help="a row-invariant quantized target (`assisted.models.int4` / `int8`; CPU), for every system")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.3, 0.6, 0.9, 1.2])
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--prompts", type=Path, default=SPLIT_PROMPTS)
    p.add_argument("--half", choices=[*HALVES, "all"], default="validation",
                   help="which half of the prompt set (experiments.lib.prompt_split; 'all': every prompt of --prompts)")
    p.add_argument("--per-class", type=int, default=None, help="use only the first N prompts of each class")
    p.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS),
                   help="systems to run (the target alone and ours-auto always run: every ratio is paired with them)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--num-assistant-tokens", type=int, default=5, help="ours: starting k")
    p.add_argument("--seed", type=int, default=1000,
                   help="repeat r samples with seed + r, the same for every system (another seed: other texts)")
    p.add_argument("--no-warmup", dest="warmup", action="store_false",
                   help="skip the untimed first generation of each system (ours-auto then warms up in the first cell)")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--shard", type=int, nargs=2, metavar=("I", "N"), default=None,
                   help="run only prompts I, I+N, I+2N, ... (0 <= I < N), e.g. one shard per core, each into "
                        "--out/shard-I; --report-only then reports all shards together")
    p.add_argument("--report-only", action="store_true",
                   help="rebuild README.md and the plots from --out/results.csv, or from --out/shard-*/results.csv "
                        "(same arguments as the run)")
    return p.parse_args(argv)


def default_out() -> Path:
    return Path("experiments/results") / f"speedup-{platform.node() or 'machine'}-{datetime.date.today()}"


def _hf_assistant_config(assistant, system: str, defaults: dict) -> None:
    """Put the assistant's generation config in the state of `system` (transformers reads it from there)."""
    cfg = assistant.generation_config
    for key, value in defaults.items():
        setattr(cfg, key, value)
    if system == "hf-heuristic":
        cfg.num_assistant_tokens, cfg.num_assistant_tokens_schedule = 5, "heuristic"


def run_one(system: str, model, assistant, tokenizer, ids: list[int], temperature: float, seed: int,
            max_new_tokens: int, k: int = 5, defaults: dict | None = None) -> dict:
    """One generation of `system`; returns seconds, new tokens, target forwards, acceptance and (ours) mean k."""
    sample = temperature > 0
    counter = count_forwards(model)
    helper_counter = count_forwards(assistant) if assistant is not None else None
    try:
        start = time.perf_counter()
        mean_k = float("nan")
        if system in OURS:
            out = generate(model, assistant, tokenizer=tokenizer, input_ids=ids, max_new_tokens=max_new_tokens,
                           do_sample=sample, temperature=temperature if sample else 1.0, seed=seed,
                           num_assistant_tokens=k, num_assistant_tokens_schedule=OURS[system])
            new = out.stats.new_tokens
            d, a = out.stats.drafted_by_source["assistant"], out.stats.accepted_by_source["assistant"]
            acceptance = a / d if d else float("nan")
            mean_k = statistics.fmean(out.stats.k_trace) if out.stats.k_trace else float("nan")
        else:
            if system != "target":
                _hf_assistant_config(assistant, system, defaults or {})
            torch.manual_seed(seed)
            kwargs = dict(do_sample=sample, max_new_tokens=max_new_tokens, top_k=0, top_p=1.0,
                          repetition_penalty=1.0, eos_token_id=model.generation_config.eos_token_id,
                          pad_token_id=model.generation_config.pad_token_id)
            if sample:
                kwargs["temperature"] = temperature
            if system != "target":
                kwargs["assistant_model"] = assistant
            x = torch.tensor([ids], device=model.device)
            with torch.inference_mode():
                seq = model.generate(x, attention_mask=torch.ones_like(x), **kwargs)
            new = seq.shape[1] - len(ids)
            # every target forward commits one token of its own; the rest were accepted drafts.
            drafted = helper_counter.n if system != "target" else 0
            acceptance = (new - counter.n) / drafted if drafted else float("nan")
        seconds = time.perf_counter() - start
    finally:
        counter.remove()
        if helper_counter is not None:
            helper_counter.remove()
    return {"seconds": seconds, "new_tokens": new, "target_forwards": counter.n,
            "tokens_per_forward": new / max(counter.n, 1), "acceptance_rate": acceptance, "mean_k": mean_k}


def run(args, model, assistant, tokenizer, prompts: list[dict], progress=True) -> list[dict]:
    """All cells, systems interleaved with a rotating order; one row per generation."""
    from tqdm.auto import tqdm
    defaults = assistant_defaults(assistant)
    systems = chosen_systems(args.systems)
    cells = [(p, t, r) for r in range(args.repeats) for t in args.temperatures for p in prompts]
    rows, bar = [], tqdm(total=len(cells) * len(systems), disable=not progress, desc="speedup")
    if args.warmup:
        ids = chat_ids(tokenizer, prompts[0])
        for system in systems:
            run_one(system, model, assistant, tokenizer, ids, 0.0, 0, args.max_new_tokens, args.num_assistant_tokens,
                    defaults)
    for i, (p, t, r) in enumerate(cells):
        ids = chat_ids(tokenizer, p)
        order = systems[i % len(systems):] + systems[: i % len(systems)]
        for system in order:
            res = run_one(system, model, assistant, tokenizer, ids, t, args.seed + r, args.max_new_tokens,
                          args.num_assistant_tokens, defaults)
            rows.append(
                {"class": p["class"], "prompt": p["name"], "temperature": t, "repeat": r, "system": system, **res}
            )
            bar.update(1)
    bar.close()
    restore_assistant(assistant, defaults)
    return rows


def assistant_defaults(assistant) -> dict:
    """The assistant's drafting settings as loaded (transformers' defaults), which hf-default runs with."""
    return {k: getattr(assistant.generation_config, k) for k in
            ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")}


def restore_assistant(assistant, defaults: dict) -> None:
    """Put the assistant's drafting settings back as `assistant_defaults` found them."""
    _hf_assistant_config(assistant, "hf-default", defaults)


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
    base = next(
        r for r in rows if r["system"] == "target" and all(r[k] == row[k] for k in ("prompt", "temperature", "repeat"))
    )
    return _per_token(base) / _per_token(row)


def plot(summary: dict, out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    classes = sorted({c for c, _, _ in summary})
    temps = sorted({t for _, t, _ in summary})
    systems = chosen_systems({s for _, _, s in summary})
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(systems)
    for j, s in enumerate(systems):
        ax.bar([i + j * width for i in range(len(classes))],
               [1000 * summary[(c, temps[0], s)]["per_token"] for c in classes], width, label=s)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(classes))], classes)
    ax.set_ylabel("median latency per new token (ms)")
    ax.set_title(f"greedy latency per prompt class (T={temps[0]})"), ax.legend()
    fig.tight_layout(), fig.savefig(out / "greedy.png", dpi=110), plt.close(fig)
    fig, ax = plt.subplots(figsize=(7, 4))
    for s in systems[1:]:
        values = [[x for c in classes for x in summary[(c, t, s)]["speedups"]] for t in temps]
        med = [statistics.median(v) for v in values]
        ax.errorbar(
            temps,
            med,
            yerr=[[m - min(v) for m, v in zip(med, values)], [max(v) - m for m, v in zip(med, values)]],
            marker="o",
            capsize=3,
            label=s,
        )
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xlabel("temperature"), ax.set_ylabel("speedup over target alone (median, min-max)"), ax.legend()
    fig.tight_layout(), fig.savefig(out / "sampling.png", dpi=110), plt.close(fig)


def write(rows: list[dict], summary: dict, args, out: Path, command: str, kept: list[str] | None = None) -> None:
    """results.csv, the plots and README.md; `kept`: the README lines of the run's date, machine, commit and
    versions when a report is rebuilt (else this process's)."""
    import transformers
    out.mkdir(parents=True, exist_ok=True)
    write_rows(out / "results.csv", rows, FIELDS)
    plot(summary, out)
    run = [
        f"- date: {datetime.date.today()}",
        *machine_lines(),
        f"- device: {args.device}, dtype: {args.dtype}, torch threads: {torch.get_num_threads()}",
        f"- torch {torch.__version__}, transformers {transformers.__version__}, python {platform.python_version()}",
        f"- target {args.target}{f' ({args.quantize_target})' if args.quantize_target else ''}, "
        f"assistant {assistant_label(args)}, max_new_tokens {args.max_new_tokens}, "
        f"repeats {args.repeats}",
    ]
    lines = [f"# Speedup run {out.name}", "", f"- command: `{command}`", *(kept or run),
             "", "Medians over prompts and repeats; systems interleaved within each cell. The CPU was shared "
             "with other engineers' jobs, so timings are noisy.", "",
             _table_header(systems_in(rows))]
    for c in sorted({c for c, _, _ in summary}):
        for t in sorted({t for _, t, _ in summary}):
            lines.append(_table_row(c, t, {s: summary[(c, t, s)] for s in systems_in(rows)}))
    lines += ["", "Latency is per new token (sampled systems write texts of different lengths); x/y = y's seconds "
              "per token / x's (> 1: x faster). hf acceptance is estimated as "
              "(new tokens - target forwards) / assistant forwards. mean k: the draft cap our policy chose, averaged "
              "over steps (ours-auto: its window, at most 20, while drafting, each draft cut by its confidences; 0 for "
              "plain decoding).", "", *_against_table(rows, summary), "",
              "![greedy](greedy.png)", "![sampling](sampling.png)", ""]
    (out / "README.md").write_text("\n".join(lines))


def _ratios(systems: tuple[str, ...]) -> list[tuple[str, str]]:
    return [(o, x) for o, x in RATIOS if o in systems and x in systems]


def _table_header(systems: tuple[str, ...]) -> str:
    drafted, ours = systems[1:], [o for o in OURS if o in systems]
    cols = (["class", "T"] + [f"{s} ms/tok" for s in systems] + [f"{o}/{hf}" for o, hf in _ratios(systems)]
            + [f"tok/fwd {s}" for s in drafted] + [f"accept {s}" for s in drafted] + [f"mean k {o}" for o in ours])
    return "| " + " | ".join(cols) + " |\n" + "|---" * len(cols) + "|"


def _table_row(c: str, t: float, g: dict) -> str:
    systems = tuple(g)
    cells = ([c, str(t)] + [f"{1000 * g[s]['per_token']:.0f}" for s in systems]
             + [f"{g[hf]['per_token'] / g[o]['per_token']:.2f}" for o, hf in _ratios(systems)]
             + [f"{g[s]['tokens_per_forward']:.2f}" for s in systems[1:]]
             + [f"{g[s]['acceptance_rate']:.2f}" for s in systems[1:]]
             + [f"{g[o]['mean_k']:.1f}" for o in OURS if o in systems])
    return "| " + " | ".join(cells) + " |"


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
        spans = [paired_ratio(pairs[s]) for s in others]
        r, lo, hi = paired_ratio(pairs[best])
        verdicts.append(1 if lo > 1 else -1 if hi < 1 else 0)
        for s in others:
            pooled[s] += pairs[s]
        pooled["best other"] += pairs[best]
        lines.append(f"| {c} | {t} | {len(cell)} | " + " | ".join(f"{x:.2f} [{a:.2f}, {b:.2f}]" for x, a, b in spans)
                     + f" | {best} {r:.2f} [{lo:.2f}, {hi:.2f}] |")
    overall = ", ".join(f"{s} {r:.2f} [{lo:.2f}, {hi:.2f}]" for s, (r, lo, hi) in
                        ((s, paired_ratio(v)) for s, v in pooled.items()))
    return lines + [
        "",
        f"Against the best other drafting system, {system}'s interval lies above 1 in {verdicts.count(1)} "
        f"of {len(cells)} cells and below 1 in {verdicts.count(-1)}. Over all "
        f"{len(pooled['best other'])} units: {overall}.",
        "",
        *_pooled_table(rows, system),
    ]


def _pooled_table(rows: list[dict], system: str) -> list[str]:
    """Markdown: `system` paired with each other system, pooled per class, per temperature and overall."""
    return [f"Pooled: {system} paired with each system over all units, the units of a class (all temperatures) "
            "and of a temperature (all classes).", "", *table(*grouped(units(rows), SYSTEMS, system))]


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
    def typed(key: str, value: str):
        if key in ("class", "prompt", "system"):
            return value
        return int(value) if key in ("repeat", "new_tokens", "target_forwards") else float(value)
    with open(path, newline="") as f:
        return [{k: typed(k, v) for k, v in row.items()} for row in csv.DictReader(f)]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    argv = list(argv if argv is not None else sys.argv[1:])
    out = args.out or default_out()
    if args.report_only:
        paths = shards.results(out)
        rows = [r for path in paths for r in read_rows(path)]
        sharded = [path for path in paths if path.parent != out]
        command = "python -m experiments.speedup " + " ".join(a for a in argv if a != "--report-only")
        command = "`; `".join([*(_command_of(path.parent / "README.md") for path in sharded), command])
        kept = _run_lines(out / "README.md") or (_run_lines(sharded[0].parent / "README.md") if sharded else None)
        write(rows, summarize(rows), args, out, command, kept)
        print(f"rewrote {out}/README.md and plots from {len(paths)} results file(s)")
        return 0
    shards.check(args.shard)
    out = shards.folder(out, args.shard)
    loaded = load_pair_or_none(args.target, args.assistant, quantize_assistant=assistant_quantization(args),
                               pack=args.packed_target, dtype=args.dtype, device=args.device,
                               quantize_target=args.quantize_target)
    if loaded is None:
        return 1
    model, tokenizer, assistant = loaded
    half = None if args.half == "all" else args.half
    rows = run(
        args, model, assistant, tokenizer, shards.pick(load_prompts(args.prompts, half, args.per_class), args.shard)
    )
    write(rows, summarize(rows), args, out, "python -m experiments.speedup " + " ".join(argv))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

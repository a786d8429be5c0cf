"""The headline figures in one run: greedy and sampled speedups, plain text and schema-constrained.

    python -m experiments.figures --quantize-target int4 --assistant-int4 --threads 1 --per-class 2 \\
        --out experiments/results/figures-qwen-int4-epyc-<date>

Plain view (prompts of `experiments/prompts/split.json`, the --half half, `--per-class` of each class), the systems
of `experiments.lib.systems` at every temperature of `--temperatures` (0: greedy; else do_sample with that
temperature, no top-k/top-p): the target alone (the reference), transformers' assisted generation with its defaults
(20 tokens, "constant") and with its heuristic (5 tokens), and ours-auto (`assisted.generate`'s default `auto`).
Structured view (the held-out extraction tasks of `experiments.lib.tasks.HELD_OUT`, every object validated with
jsonschema): transformers + XGrammar's logits processor with compact JSON (the target alone: the reference), then
`--structured-systems` (default: ours plain constrained, forced tokens coalesced, and ours full: assistant, `auto`,
prompt lookup; also XGrammar's defaults, transformers' assisted generation with a processor, ...).
llama.cpp runs nowhere here (see `llama_cpp_note`); the figures say so.

One unit = one prompt (or task) and repeat, run at every temperature; units of the two views alternate and
the systems' order rotates per cell, so a run cut short still covers every temperature and both views.
Rows are appended to plain.csv / structured.csv as they finish; a rerun with the same --out skips the
cells already there; --report-only redraws greedy.png, sampling.png, structured.png and README.md.
One view alone (`--views plain` or `--views structured`) is how the speedup and XGrammar comparisons are rerun
(`docs/results.md`; their own scripts, `experiments.speedup` and `experiments.vs_xgrammar`, are in git at 408e960).
"""

from __future__ import annotations

import datetime
import json
import platform
import sys
from pathlib import Path

import torch

from experiments.lib import cli, runner
from experiments.lib.figures_report import PLAIN, STRUCTURED, STRUCTURED_ORDER, read_csv, report
from experiments.lib.report import STARTED_AT, machine_lines, write_rows
from experiments.lib.systems import XGRAMMAR_MISSING, Systems, xgrammar_version
from experiments.lib.tasks import HALVES, HELD_OUT, SPLIT_PROMPTS, chat_ids, load_prompts, validate

TEMPERATURES = [0.0, 0.3, 0.6, 0.9, 1.2, 1.5]
PLAIN_FIELDS = ("class", "prompt", "temperature", "repeat", "system", "seconds", "new_tokens", "target_forwards",
                "tokens_per_forward", "acceptance_rate", "mean_k")
STRUCTURED_FIELDS = ("task", "temperature", "repeat", "system", "seconds", "new_tokens", "valid", "error", "text")
VIEWS = ("plain", "structured")


def parse_args(argv: list[str] | None = None):
    p = cli.parser("figures", __doc__)
    cli.add_models(p)
    cli.add_run(p, threads=None, out_required=False, max_new_tokens=32, temperatures=TEMPERATURES)
    p.add_argument("--structured-max-new-tokens", type=int, default=96)
    p.add_argument("--half", choices=[*HALVES, "all"], default="validation")
    p.add_argument("--per-class", type=int, default=2, help="prompts of each class (plain view; 0: all)")
    p.add_argument("--tasks", nargs="+", choices=[t.name for t in HELD_OUT], default=["patient", "flight", "review"],
                   help="held-out extraction tasks (structured view)")
    p.add_argument("--structured-systems", nargs="+", choices=STRUCTURED_ORDER, default=list(STRUCTURED),
                   help="structured view: the systems besides its reference, transformers + XGrammar (compact)")
    p.add_argument("--views", nargs="+", choices=VIEWS, default=list(VIEWS))
    p.add_argument("--report-only", action="store_true", help="redraw the figures and README.md from --out's CSVs")
    args = p.parse_args(argv)
    kept = {*args.structured_systems, STRUCTURED[0], STRUCTURED[-1]}  # the reference and ours full always run
    args.structured_systems = [s for s in STRUCTURED_ORDER if s in kept]
    return args


def llama_cpp_note() -> str:
    """What the figures say about llama.cpp: this driver has no llama.cpp runner yet, installed or not."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return "llama.cpp: not installed in this run"
    return "llama.cpp: installed, but this driver has no llama.cpp runner yet: not run"


def setup_label(args) -> str:
    """The model pair and setup, as every figure names them."""
    form = args.quantize_target or ("float32, packed" if args.pack else "float32")
    return f"target {args.target} ({form}), assistant {cli.assistant_label(args)}"


def schedule(args, prompts: list[dict], tasks: list) -> list[tuple[str, object, int]]:
    """Units in run order: ("plain", prompt, repeat) and ("structured", task, repeat). Per repeat, the first prompt
    of every class with every task spread evenly among them, then the other prompts class by class: a run cut
    short has covered every class and every task first."""
    rank: dict[str, int] = {}
    ranked = []
    for p in prompts:
        rank[p["class"]] = rank.get(p["class"], -1) + 1
        ranked.append((rank[p["class"]], p))
    first = [p for n, p in ranked if n == 0]
    rest = [p for _, p in sorted((x for x in ranked if x[0] > 0), key=lambda x: x[0])]
    units = []
    for r in range(args.repeats):  # each view's units at evenly spaced places in (0, 1), merged (plain first on ties)
        spaced = [((k + 0.5) / len(first), ("plain", p, r)) for k, p in enumerate(first)]
        spaced += [((k + 0.5) / len(tasks), ("structured", t, r)) for k, t in enumerate(tasks)]
        units += [u for _, u in sorted(spaced, key=lambda x: x[0])] + [("plain", p, r) for p in rest]
    return units


class Appender:
    """Rows of one view appended to a CSV as they finish; the cells already there are skipped on a rerun."""

    def __init__(self, path: Path, fields, key):
        self.path, self.fields, self.key = path, fields, key
        self.rows = read_csv(path) if path.exists() else []
        self.done = {key(r) for r in self.rows}

    def add(self, row: dict) -> None:
        write_rows(self.path, [row], self.fields, append=True)
        self.rows.append(row)
        self.done.add(self.key(row))


def plain_run(systems: Systems, system: str, ids: list[int], temperature: float, seed: int) -> dict:
    """One timed generation of a plain system: seconds, new tokens, target forwards, acceptance and (ours) mean k."""
    seconds, out, error = runner.timed(lambda: systems.run(system, ids, None, temperature, seed))
    if error:
        raise RuntimeError(f"{system}: {error}")
    return {"seconds": seconds, "new_tokens": out.new_tokens, "target_forwards": out.target_forwards,
            "tokens_per_forward": out.new_tokens / max(out.target_forwards, 1), "acceptance_rate": out.acceptance,
            "mean_k": out.mean_k}


def structured_run(systems: Systems, system: str, task, temperature: float = 0.0, seed: int = 0) -> dict:
    """One timed object of a structured system: seconds, new tokens, validity, the error it raised (a system that
    fails is a result: transformers' assisted generation fails with XGrammar's processor) and the text."""
    ids = chat_ids(systems.tokenizer, task.messages())
    seconds, out, error = runner.timed(lambda: systems.run(system, ids, task, temperature, seed))
    text = "" if out is None else out.text
    return {"task": task.name, "seconds": seconds, "new_tokens": 0 if out is None else out.new_tokens,
            "valid": not error and validate(task, text), "error": error, "text": text}


def plain_cell(args, systems: Systems, prompt: dict, t: float, r: int, i: int, sink: Appender) -> None:
    ids = chat_ids(systems.tokenizer, prompt)
    for system in runner.rotated(PLAIN, i):
        if (prompt["name"], t, r, system) not in sink.done:
            sink.add({"class": prompt["class"], "prompt": prompt["name"], "temperature": t, "repeat": r,
                      "system": system, **plain_run(systems, system, ids, t, args.seed + r)})


def structured_cell(args, systems: Systems, task, t: float, r: int, i: int, sink: Appender) -> None:
    for system in runner.rotated(args.structured_systems, i):
        if (task.name, t, r, system) not in sink.done:
            sink.add({"temperature": t, "repeat": r, "system": system,
                      **structured_run(systems, system, task, t, args.seed + r)})


def warm_up(args, plain: Systems, prompts: list[dict], structured: Systems, tasks) -> None:
    """Untimed: every plain system once on the first prompt (ours-auto learns the pair's costs, as in any
    process that generates twice), every structured system briefly on every task (grammars compiled)."""
    if prompts:
        for system in PLAIN:
            plain_run(plain, system, chat_ids(plain.tokenizer, prompts[0]), 0.0, 0)
    budget, structured.max_new = structured.max_new, 8
    for task in tasks:
        for system in args.structured_systems:
            structured_run(structured, system, task)
    structured.max_new = budget


def run(args, pair, out: Path, progress: bool = True) -> tuple[list[dict], list[dict]]:
    """Every unit at every temperature, rows appended to out/plain.csv and out/structured.csv."""
    from tqdm.auto import tqdm
    half = None if args.half == "all" else args.half
    prompts = load_prompts(SPLIT_PROMPTS, half, args.per_class or None) if "plain" in args.views else []
    tasks = [t for t in HELD_OUT if t.name in args.tasks] if "structured" in args.views else []
    plain_systems = Systems(*pair, max_new_tokens=args.max_new_tokens)
    structured_systems = Systems(*pair, max_new_tokens=args.structured_max_new_tokens)
    plain = Appender(out / "plain.csv", PLAIN_FIELDS,
                     lambda r: (r["prompt"], r["temperature"], r["repeat"], r["system"]))
    structured = Appender(out / "structured.csv", STRUCTURED_FIELDS,
                          lambda r: (r["task"], r["temperature"], r["repeat"], r["system"]))
    cells = [(u, t) for u in schedule(args, prompts, tasks) for t in args.temperatures]
    if not all(_done(args, plain if v == "plain" else structured, v, item, t, r) for (v, item, r), t in cells):
        warm_up(args, plain_systems, prompts, structured_systems, tasks)
    for i, ((view, item, r), t) in enumerate(tqdm(cells, disable=not progress, desc="figures")):
        if view == "plain":
            plain_cell(args, plain_systems, item, t, r, i, plain)
        else:
            structured_cell(args, structured_systems, item, t, r, i, structured)
    return plain.rows, structured.rows


def _done(args, sink: Appender, view: str, item, t: float, r: int) -> bool:
    """Has every system of the cell a row already?"""
    name, systems = (item["name"], PLAIN) if view == "plain" else (item.name, args.structured_systems)
    return all((name, t, r, s) in sink.done for s in systems)


def describe(args, argv: list[str]) -> dict:
    """What the run is, for its README and the figures' footers (kept in out/run.json)."""
    import transformers
    return {"command": "python -m experiments.figures " + " ".join(argv), "date": datetime.date.today().isoformat(),
            "machine": machine_lines(), "setup": setup_label(args), "threads": torch.get_num_threads(),
            "versions": f"python {platform.python_version()}, torch {torch.__version__}, "
                        f"transformers {transformers.__version__}, xgrammar {xgrammar_version()}",
            "llama_cpp": llama_cpp_note(), "max_new_tokens": args.max_new_tokens,
            "structured_max_new_tokens": args.structured_max_new_tokens, "half": args.half,
            "per_class": args.per_class, "repeats": args.repeats}


def main(argv: list[str] | None = None, pair: tuple | None = None) -> int:
    """Command line; `pair` = (model, tokenizer, assistant) already loaded (tests) instead of --target/--assistant."""
    argv, args = cli.begin(parse_args, argv)
    out = args.out or Path("experiments/results") / f"figures-{platform.node() or 'machine'}-{datetime.date.today()}"
    if not args.report_only:
        if "structured" in args.views and xgrammar_version() is None:  # its reference: refused before models load
            print(f"{XGRAMMAR_MISSING}; or --views plain", file=sys.stderr)
            return 2
        pair = pair or cli.load(args)
        out.mkdir(parents=True, exist_ok=True)
        info_path = out / "run.json"
        info = json.loads(info_path.read_text()) if info_path.exists() else describe(args, argv)
        if info_path.exists():  # a resumed run keeps the first start's description and says when it went on
            info.setdefault("resumed", []).append(f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
                                                  f"commit {STARTED_AT}")
        info_path.write_text(json.dumps(info, indent=1) + "\n")
        run(args, pair, out)
    report(out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Our full system against transformers + XGrammar's logits processor, on held-out extraction tasks.

Systems (`experiments.lib.systems`; all greedy, same models, same run, order rotated per task): xgrammar (its
defaults: any whitespace), xgrammar-compact (compact JSON, what ours writes), xgrammar+assistant (XGrammar's processor
follows the order of calls: expected to fail under assisted generation; recorded as it happens), ours-processor,
ours-processor+assistant, constrained (forced tokens verified), constrained+forced, full-no-lookup and full (our
defaults: `auto`, prompt lookup). Tasks: `experiments.lib.tasks.HELD_OUT`.

    pip install --no-deps --target /tmp/xgr xgrammar==0.2.8 apache-tvm-ffi   # CPU only, no triton needed
    PYTHONPATH=/tmp/xgr python -m experiments.vs_xgrammar --target smollm2-135m --assistant smollm2-135m \\
        --int8-assistant --out experiments/results/vs-xgrammar-...
"""

from __future__ import annotations

import statistics
import sys

from experiments.lib import cli, report, runner
from experiments.lib.systems import XGRAMMAR_MISSING, Systems, xgrammar_version
from experiments.lib.tasks import HELD_OUT as TASKS, chat_ids, validate

SYSTEMS = ("xgrammar", "xgrammar-compact", "xgrammar+assistant", "ours-processor", "ours-processor+assistant",
           "constrained", "constrained+forced", "full-no-lookup", "full")
FIELDS = ("task", "repeat", "system", "seconds", "new_tokens", "valid", "error", "text")


def parse_args(argv: list[str] | None):
    p = cli.parser("vs_xgrammar", __doc__)
    cli.add_models(p, target="smollm2-135m", assistant="smollm2-135m")
    cli.add_run(p, threads=1, max_new_tokens=160)
    p.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS),
                   help="systems to run (full always runs: every ratio pairs with it)")
    return p.parse_args(argv)


def chosen(names) -> tuple[str, ...]:
    """`names` in SYSTEMS order, with `full` added."""
    return tuple(s for s in SYSTEMS if s in {*names, "full"})


def timed(systems: Systems, system: str, task, temperature: float = 0.0, seed: int = 0) -> dict:
    """One timed run of `system` on `task`: seconds, new tokens, validity, error and text."""
    seconds, out, error = runner.timed(lambda: systems.run(system, chat_ids(systems.tokenizer, task.messages()),
                                                           task, temperature, seed))
    text = "" if out is None else out.text
    return {"task": task.name, "seconds": seconds, "new_tokens": 0 if out is None else out.new_tokens,
            "valid": not error and validate(task, text), "error": error, "text": text}


def measure(systems: Systems, tasks, names=SYSTEMS, repeats: int = 1) -> list[dict]:
    """Every (repeat, task) runs every system, interleaved, after an untimed short warm-up per task."""
    names = chosen(names)
    budget, systems.max_new = systems.max_new, 8
    for task in tasks:  # grammars and indexes compiled, allocators warm
        for system in {"xgrammar", "xgrammar-compact", "ours-processor", "full"} & set(names):
            timed(systems, system, task)
    systems.max_new = budget
    return runner.run(tasks, names, lambda task, system, _: timed(systems, system, task), repeats,
                      log=lambda r: f"{r['task']:8} {r['system']:26} {r['seconds']:7.2f} s {r['new_tokens']:4d} tok "
                                    f"valid={r['valid']} {r['error']}")


def table(rows: list[dict]) -> list[str]:
    """Per system: median seconds (tokens) per task, valid outputs, the summed medians, and full's speedup paired
    per (task, repeat) unit (geometric mean of the system's seconds / full's, 90% interval)."""
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    ratios = runner.paired(rows, "full", ("task", "repeat"))
    lines = ["| system | " + " | ".join(f"{t} s (tok)" for t in tasks) + " | valid | total s | full is faster by |",
             "|---|" + "---|" * (len(tasks) + 3)]
    for system in chosen({r["system"] for r in rows}):
        mine = [[r for r in rows if r["task"] == t and r["system"] == system] for t in tasks]
        seconds = [statistics.median(r["seconds"] for r in runs) for runs in mine]
        shown = [f"{sec:.2f} ({statistics.median(r['new_tokens'] for r in runs):.0f})"
                 if not any(r["error"] for r in runs) else "error" for sec, runs in zip(seconds, mine)]
        ratio = ratios.get(system, (1.0, 1.0, 1.0))
        faster = "error" if "error" in shown else runner.span(ratio)
        valid = sum(r["valid"] for runs in mine for r in runs)
        lines.append(f"| {system} | " + " | ".join(shown) + f" | {valid}/{sum(map(len, mine))} | "
                     f"{sum(seconds):.2f} | {faster} |")
    errors = sorted({f"{r['system']}: {r['error']}" for r in rows if r["error"]})
    return lines + ([""] + [f"- error, {e}" for e in errors] if errors else [])


def main(argv: list[str] | None = None) -> int:
    argv, args = cli.begin(parse_args, argv)
    if (version := xgrammar_version()) is None:
        print(XGRAMMAR_MISSING, file=sys.stderr)
        return 2
    rows = measure(Systems(*cli.load(args), max_new_tokens=args.max_new_tokens), TASKS, args.systems, args.repeats)
    head = [*report.run_lines("experiments.vs_xgrammar", argv, f"xgrammar {version}"),
            f"- target {cli.target_label(args)}, assistant {cli.assistant_label(args)}, greedy, "
            f"max_new_tokens {args.max_new_tokens}",
            f"- four held-out extraction tasks written for this comparison (invoice, patient, flight, review), "
            f"{args.repeats} run(s) each, systems in rotated order per (task, run)"]
    body = [*table(rows), "",
            "\"full is faster by\": the geometric mean over (task, run) units of the system's seconds per object / "
            "full's, with a 90% t-interval (one unit: no interval). XGrammar's defaults allow any "
            "whitespace (the model writes indented JSON: more tokens); xgrammar-compact and ours write compact JSON.",
            "The CPU is shared with other jobs: single timings are noisy."]
    report.write_run(args.out, f"Our full system vs transformers + XGrammar: {args.out.name}", head, body, rows, FIELDS)
    print("\n".join(table(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Compile times against an earlier commit's fsm: every JSONSchemaBench schema, CPU seconds, alternating processes.

    python -m experiments.compile_times --baseline ae05ac6 --passes 2 --out experiments/results/<name>

The baseline's `fsm/` comes from git (`git archive`). A pass is one process that compiles every schema in turn
(`fsm.compile_schema(schema, policy=--policy)`, at most 30 s of CPU each) and books the thread's CPU seconds less the
cyclic collector's own (`gc.callbacks`; `time.process_time` reads low while the CPU timer that bounds a schema is
armed, `time.thread_time` does not); passes alternate baseline, this tree, baseline, ... A schema whose median over the
passes is over `--slower` times the baseline's and 0.1 s more is rechecked alone: a fresh process per (schema, side),
warmed on the first `WARM` schemas, alternating `--passes` times, since in one long process what ran before it (the
caches it left, a collection) moves a single schema's time. The README lists the schemas slower in the recheck.
"""

from __future__ import annotations

import argparse
import gc
import glob
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from experiments.lib import cli, report

DATA = report.REPO.parent / "shared" / "data" / "jsonschemabench"
LIMIT_S = 30  # CPU seconds a schema may take (then "timeout")
WARM = 30  # schemas compiled before a rechecked one (caches as a service would have them)
EXTRA_S = 0.1  # a slower schema is also this much slower


def main(argv: list[str] | None = None) -> None:
    p = cli.parser("compile_times", __doc__)
    p.add_argument("--baseline", help="the commit whose fsm/ is compared (e.g. ae05ac6)")
    p.add_argument("--policy", default="spec")
    p.add_argument("--passes", type=int, default=2, help="alternating passes (and rechecks) of each side")
    p.add_argument("--slower", type=float, default=2.0, help="a slower schema: over this ratio (and 0.1 s)")
    p.add_argument("--data", type=Path, default=DATA)
    p.add_argument("--measure", type=Path, help=argparse.SUPPRESS)  # one pass, in a child process
    p.add_argument("--only", nargs="*", default=None, help=argparse.SUPPRESS)
    cli.add_out(p, required=False)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(argv)
    if args.measure is not None:
        measure(args.measure, args.data, args.policy, args.only)
    elif args.baseline is None or args.out is None:
        p.error("--baseline and --out are required")
    else:
        compare(args, argv)


def measure(root: Path, data: Path, policy: str, only: list[str] | None) -> None:
    """One pass with the fsm under `root`: a JSON line per schema (name, status, CPU seconds less the GC's)."""
    sys.path.insert(0, str(root))
    import fsm
    assert Path(fsm.__file__).is_relative_to(root), fsm.__file__
    files = sorted(glob.glob(str(data / "*.json")))
    if only:  # the first WARM schemas, then the ones asked for (their lines only are read)
        files = files[:WARM] + [str(data / name) for name in only]
    collected = _gc_clock()
    signal.signal(signal.SIGVTALRM, _out_of_time)
    for path in files:
        schema = json.loads(Path(path).read_text())["schema"]
        status, start, gc_start = "ok", time.thread_time(), collected[0]
        signal.setitimer(signal.ITIMER_VIRTUAL, LIMIT_S)
        try:
            fsm.compile_schema(schema, policy=policy)
        except TimeoutError:
            status = "timeout"
        except Exception as error:  # noqa: BLE001 - a refusal is a result here
            status = type(error).__name__
        finally:
            signal.setitimer(signal.ITIMER_VIRTUAL, 0)
        cpu = time.thread_time() - start - (collected[0] - gc_start)
        print(json.dumps({"schema": Path(path).name, "status": status, "cpu_s": round(cpu, 4)}), flush=True)


def _out_of_time(*_):
    raise TimeoutError


def _gc_clock() -> list[float]:
    """[CPU seconds the cyclic collector has taken so far], kept current by a `gc.callbacks` entry."""
    total, started = [0.0], [0.0]

    def clock(phase, _info):
        if phase == "start":
            started[0] = time.thread_time()
        else:
            total[0] += time.thread_time() - started[0]

    gc.callbacks.append(clock)
    return total


def compare(args, argv: list[str]) -> None:
    with tempfile.TemporaryDirectory() as base:
        archive = subprocess.run(["git", "archive", args.baseline, "fsm"], cwd=report.REPO, capture_output=True,
                                 check=True).stdout
        subprocess.run(["tar", "-x", "-C", base], input=archive, check=True)
        sides = {"baseline": Path(base), "this": report.REPO}
        passes = {side: [] for side in sides}
        for _ in range(args.passes):
            for side, root in sides.items():
                passes[side].append(_pass(root, args))
        medians = {side: _medians(runs) for side, runs in passes.items()}
        flagged = _slower(medians, args.slower)
        rechecks = {side: [] for side in sides}
        for _ in range(args.passes if flagged else 0):
            for side, root in sides.items():  # a fresh process per schema
                rechecks[side].append({name: _pass(root, args, only=[name])[name] for name in flagged})
        rechecked = {side: _medians(runs) for side, runs in rechecks.items()}
    rows = [{"schema": name, "side": side, "pass": i, **found}
            for side, runs in passes.items() for i, run in enumerate(runs) for name, found in run.items()]
    body = _summary(medians, rechecked, flagged, args)
    report.write_run(args.out, f"Compile times against {args.baseline}'s fsm, policy={args.policy}",
                     report.run_lines("experiments.compile_times", argv), body, rows,
                     ["schema", "side", "pass", "status", "cpu_s"])
    print("\n".join(body))


def _pass(root: Path, args, only: list[str] | None = None) -> dict[str, dict]:
    command = [sys.executable, "-m", "experiments.compile_times", "--measure", str(root), "--data", str(args.data),
               "--policy", args.policy, *(["--only", *only] if only else [])]
    env = {**os.environ, "PYTHONPATH": str(report.REPO)}
    out = subprocess.run(command, cwd=report.REPO, env=env, capture_output=True, text=True, check=True).stdout
    found = {}
    for line in out.splitlines():
        row = json.loads(line)
        found[row.pop("schema")] = row
    return found if only is None else {name: found[name] for name in only}


def _medians(runs: list[dict]) -> dict[str, tuple[str, float]]:
    """name -> (status of the first run, median CPU seconds over the runs)."""
    names = runs[0] if runs else {}
    return {name: (runs[0][name]["status"], statistics.median(run[name]["cpu_s"] for run in runs)) for name in names}


def _slower(medians: dict, ratio: float) -> list[str]:
    old, new = medians["baseline"], medians["this"]
    return sorted(name for name in old if name in new and old[name][0] == new[name][0] == "ok"
                  and new[name][1] > ratio * old[name][1] and new[name][1] - old[name][1] > EXTRA_S)


def _summary(medians: dict, rechecked: dict, flagged: list[str], args) -> list[str]:
    old, new = medians["baseline"], medians["this"]
    both = [name for name in old if name in new and old[name][0] == new[name][0] == "ok"]
    ratios = [new[name][1] / max(old[name][1], 1e-4) for name in both]
    still = _slower(rechecked, args.slower) if flagged else []
    lines = [f"{len(both)} schemas compile on both sides (of {len(old)}); {args.passes} alternating passes a side.", "",
             "| | baseline | this tree |", "|---|---|---|",
             f"| compiled | {sum(s == 'ok' for s, _ in old.values())} | {sum(s == 'ok' for s, _ in new.values())} |",
             f"| CPU s over the schemas both compile (GC's own time out) | {sum(old[n][1] for n in both):.1f} | "
             f"{sum(new[n][1] for n in both):.1f} |",
             f"| median schema, this / baseline | | {statistics.median(ratios):.3f}x |", "",
             f"Slower by over {args.slower}x and {EXTRA_S} s in the passes: {len(flagged)}; "
             f"still slower when rechecked alone: **{len(still)}**.", ""]
    if flagged:
        lines += ["| schema | passes: baseline s | this s | alone: baseline s | this s |", "|---|---|---|---|---|"]
        lines += [f"| {name} | {old[name][1]:.3f} | {new[name][1]:.3f} | {rechecked['baseline'][name][1]:.3f} | "
                  f"{rechecked['this'][name][1]:.3f} |" for name in flagged]
    return lines


if __name__ == "__main__":
    main()

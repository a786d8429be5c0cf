"""`structspec batch` throughput: Ray workers against one process, on the same documents, greedy.

Each setup runs the same JSONL batch (extraction documents behind one shared instruction, a small JSON schema)
through the `structspec` command in a fresh process, into a fresh output file, the setups interleaved and their
order reversed on every other repeat (the machine is shared). Reported per setup: documents per minute end to
end (start-up and model loading included) and in the steady part (from the first line written to the last), and
whether every setup wrote the same text for every document.

    python -m experiments.ray_throughput --out experiments/results/ray-throughput-smollm2-135m-cpu-DATE
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from experiments.lib.machine import REPO, run_lines
from experiments.prefix_reuse import DOCUMENTS, INSTRUCTION, SCHEMA
from experiments.lib.tasks import write_rows

SETUPS = {  # name -> `structspec batch` arguments
    "ray 2 workers x 1 thread": ["--ray", "--workers", "2", "--threads-per-worker", "1"],
    "1 process x 2 threads": ["--threads", "2"],
    "1 process x 1 thread": ["--threads", "1"],
}
PEOPLE = [("Lena Vogel", 39, "Vienna", "pianist"), ("Omar Haddad", 46, "Amman", "civil engineer"),
          ("Julia Santos", 28, "Porto", "marine biologist"), ("Ravi Kumar", 53, "Chennai", "accountant"),
          ("Emma Wilson", 31, "Leeds", "veterinarian"), ("Pavel Novak", 44, "Prague", "tram driver"),
          ("Aiko Mori", 26, "Sapporo", "graphic designer"), ("Samuel Okafor", 37, "Lagos", "pharmacist")]
TEMPLATES = ["{name}, {age}, works as a {job} in {city}.",
             "In {city}, the {job} {name} celebrated turning {age} last week.",
             "{name} ({age}) has been a {job} in {city} for many years."]


def documents(count: int) -> list[dict]:
    """`count` documents (ids d00, d01, ...): prefix_reuse's twenty, then templated ones."""
    texts = list(DOCUMENTS) + [t.format(name=n, age=a, city=c, job=j) for t in TEMPLATES for n, a, c, j in PEOPLE]
    if count > len(texts):
        raise SystemExit(f"--documents: at most {len(texts)}")
    return [{"id": f"d{i:02d}", "messages": [{"role": "system", "content": INSTRUCTION},
                                             {"role": "user", "content": f"Document: {text}\nJSON:"}]}
            for i, text in enumerate(texts[:count])]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--documents", type=int, default=48)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--setups", nargs="+", default=list(SETUPS), choices=list(SETUPS))
    parser.add_argument("--out", type=Path, required=True)
    return parser.parse_args(argv)


def run_once(args, setup: str, output: Path) -> dict:
    """One `structspec batch` run; the time each output line appears is read off the file as it grows."""
    command = [sys.executable, "-m", "assisted.cli", "batch", "--model", args.model, "--schema",
               str(args.out / "schema.json"), "--input", str(args.out / "docs.jsonl"), "--output", str(output),
               "--max-new-tokens", str(args.max_new_tokens), "--temperature", "0", "--no-progress", *SETUPS[setup]]
    start, seen = time.perf_counter(), []
    process = subprocess.Popen(command, cwd=REPO, env=os.environ | {"HF_HUB_OFFLINE": "1"},
                               stderr=subprocess.PIPE, text=True)
    while process.poll() is None:
        lines = output.read_text().count("\n") if output.exists() else 0
        seen += [time.perf_counter() - start] * (lines - len(seen))
        time.sleep(0.05)
    wall = time.perf_counter() - start
    stderr = process.stderr.read()
    if process.returncode != 0:
        raise SystemExit(f"{setup}: exit status {process.returncode}\n{stderr[-2000:]}")
    lines = output.read_text().count("\n")
    seen += [wall] * (lines - len(seen))
    steady = (lines - 1) / (seen[-1] - seen[0]) * 60 if lines > 1 and seen[-1] > seen[0] else float("nan")
    return {"setup": setup, "documents": lines, "wall_s": round(wall, 2), "first_line_s": round(seen[0], 2),
            "last_line_s": round(seen[-1], 2), "docs_per_min": round(lines / wall * 60, 2),
            "steady_docs_per_min": round(steady, 2)}


def texts(path: Path) -> dict:
    return {row["id"]: row.get("text") for row in map(json.loads, path.read_text().splitlines())}


def measure(args) -> tuple[list[dict], dict]:
    rows, outputs = [], {}
    for repeat in range(args.repeats):
        order = args.setups if repeat % 2 == 0 else list(reversed(args.setups))
        for setup in order:
            output = args.out / "outputs" / f"{setup.replace(' ', '-')}-{repeat}.jsonl"
            output.unlink(missing_ok=True)
            row = {"repeat": repeat, **run_once(args, setup, output)}
            rows.append(row)
            outputs[(setup, repeat)] = texts(output)
            print(json.dumps(row), file=sys.stderr)
    return rows, outputs


def summary(rows: list[dict], outputs: dict, count: int) -> list[str]:
    lines = ["| setup | runs | docs/min end to end (each run) | median | docs/min steady (each run) | median | "
             "first line after s (median) |", "|---|---|---|---|---|---|---|"]
    for setup in dict.fromkeys(r["setup"] for r in rows):
        mine = [r for r in rows if r["setup"] == setup]
        ends, steadies = [r["docs_per_min"] for r in mine], [r["steady_docs_per_min"] for r in mine]
        lines.append(f"| {setup} | {len(mine)} | {', '.join(map(str, ends))} | {statistics.median(ends):.1f} | "
                     f"{', '.join(map(str, steadies))} | {statistics.median(steadies):.1f} | "
                     f"{statistics.median(r['first_line_s'] for r in mine):.1f} |")
    reference = next(iter(outputs.values()))
    same = [key for key, texts_ in outputs.items() if texts_ == reference]
    identical = sum(all(o.get(i) == reference[i] for o in outputs.values()) for i in reference)
    lines += ["", f"- identical outputs: {'yes' if len(same) == len(outputs) else 'no'} ({identical} of {count} "
                  f"documents with the same text in all {len(outputs)} runs)"]
    return lines


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    (args.out / "outputs").mkdir(parents=True, exist_ok=True)
    (args.out / "schema.json").write_text(json.dumps(SCHEMA, indent=1) + "\n")
    (args.out / "docs.jsonl").write_text("".join(json.dumps(d) + "\n" for d in documents(args.documents)))
    header = run_lines("experiments.ray_throughput", argv, f"ray {_ray_version()}")
    rows, outputs = measure(args)
    write_rows(args.out / "runs.csv", rows, list(rows[0]))
    readme = [f"# structspec batch throughput {args.out.name}", "", *header,
              f"- model {args.model} (no assistant), greedy, schema-constrained, chat messages behind one shared "
              f"instruction (prefix cache on, the default), max_new_tokens {args.max_new_tokens}, "
              f"{args.documents} documents (`docs.jsonl`, `schema.json`), {args.repeats} repeats",
              "", *summary(rows, outputs, args.documents), "", *NOTES]
    (args.out / "README.md").write_text("\n".join(readme) + "\n")
    print("\n".join(summary(rows, outputs, args.documents)))
    return 0


NOTES = [
    "Every run is a fresh `python -m assisted.cli batch ...` process writing a fresh output file (`outputs/`);",
    "end to end counts from the command's start (Ray's local start-up and each worker's model loading included) to",
    "its exit; steady counts from the first output line to the last. The setups are interleaved and their order",
    "reversed on every other repeat; the 2 CPUs are shared with other jobs, so single runs are noisy: compare",
    "setups within this run only.",
]


def _ray_version() -> str:
    try:
        import ray
    except ImportError:
        return "not installed"
    return ray.__version__


if __name__ == "__main__":
    sys.exit(main())

"""What loading a pair costs: seconds and peak resident memory of `load_pair` in a fresh process.

    python -m experiments.load_cost --modes float first warm --out DIR

Each run is a new Python process (so "peak" is that process's whole life: imports, tokenizers, both models) that
calls `assisted.models.loading.load_pair` and reports its own seconds and peak resident memory (`ru_maxrss`), then
the peak again after one forward of each model (the packed weights are all in memory by then). Modes:
``float`` the float path (``STRUCTSPEC_FROM_BLOCKS=0``: float32 weights, then quantized), ``first`` built from the
GGUF's blocks with an empty packed cache (a temporary folder), ``warm`` the same with the cache ``first`` filled.
The GGUF files' bytes are the yardstick (the issue's goal: warm <= 5 s, peak <= 1.5x the files, first <= 30 s).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from experiments.lib import cli
from experiments.lib.report import run_lines, table, write_run

CHILD = """
import json, sys, time, torch
start = time.perf_counter()
from assisted.models.loading import describe_load, last_load, load_pair, peak_memory
options = json.loads(sys.argv[1])
model, tokenizer, assistant = load_pair(options.pop("target"), options.pop("assistant"), **options)
loaded = last_load()
ids = torch.tensor([tokenizer("def f(x):").input_ids])
with torch.no_grad():
    for m in {id(model): model, id(assistant): assistant}.values():
        if m is not None:
            m(ids)
print("RESULT " + json.dumps({"load_seconds": loaded["seconds"], "peak_after_load": loaded["peak_bytes"],
                              "peak_after_forward": peak_memory(), "process_seconds": time.perf_counter() - start,
                              "target": loaded["target"], "assistant": loaded["assistant"]}))
"""


def gguf_bytes(*sources: str) -> int:
    """The bytes of the sources' GGUF files (a named source's own file, or a .gguf path)."""
    from assisted.models.sources import SOURCES, gguf_file
    return sum((gguf_file(s) if s in SOURCES else Path(s)).stat().st_size for s in sources if s)


def run(mode: str, options: dict, packed: str) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", STRUCTSPEC_PACKED_CACHE=packed)
    if mode == "float":
        env["STRUCTSPEC_FROM_BLOCKS"] = "0"
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(options)], env=env, capture_output=True,
                          text=True)
    wall = time.perf_counter() - started
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        raise RuntimeError(f"{mode}: the child failed:\n{done.stderr[-3000:]}")
    return {"mode": mode, "wall_seconds": wall, **json.loads(lines[-1].removeprefix("RESULT "))}


def main(argv: list[str] | None = None) -> None:
    parser = cli.parser("load_cost", __doc__)
    parser.add_argument("--target", default="qwen2.5-coder-1.5b")
    parser.add_argument("--assistant", default="qwen2.5-coder-0.5b")
    parser.add_argument("--quantize-target", default="int4")
    parser.add_argument("--quantize-assistant", default="int4")
    parser.add_argument("--modes", nargs="+", default=["first", "warm"], choices=["float", "first", "warm"])
    parser.add_argument("--repeats", type=int, default=1, help="runs of each mode")
    cli.add_out(parser, required=False)
    args = parser.parse_args(argv)
    options = {"target": args.target, "assistant": args.assistant, "quantize_target": args.quantize_target,
               "quantize_assistant": args.quantize_assistant}
    files = gguf_bytes(args.target, args.assistant)
    rows = []
    with tempfile.TemporaryDirectory(prefix="packed-") as packed:
        for mode in args.modes:
            for _ in range(args.repeats):
                if mode == "first":
                    for old in Path(packed).glob("*"):
                        old.unlink()
                row = run(mode, options, packed)
                row["peak_over_files"] = row["peak_after_load"] / files
                rows.append(row)
                print(f"{mode}: load {row['load_seconds']:.1f} s (process {row['wall_seconds']:.1f} s), peak "
                      f"{row['peak_after_load'] / 1e9:.2f} GB = {row['peak_over_files']:.2f}x the GGUF files "
                      f"({files / 1e9:.2f} GB), after a forward {row['peak_after_forward'] / 1e9:.2f} GB; "
                      f"target {row['target']}, assistant {row['assistant']}", flush=True)
    if args.out:
        body = table(["mode", "load s", "process s", "peak GB", "x files", "peak after a forward GB"],
                     [[r["mode"], f"{r['load_seconds']:.1f}", f"{r['wall_seconds']:.1f}",
                       f"{r['peak_after_load'] / 1e9:.2f}", f"{r['peak_over_files']:.2f}",
                       f"{r['peak_after_forward'] / 1e9:.2f}"] for r in rows])
        write_run(args.out, "Load cost", run_lines("experiments.load_cost", sys.argv[1:] if argv is None else argv)
                  + [f"- GGUF files: {files / 1e9:.2f} GB"], body, rows)


if __name__ == "__main__":
    main()

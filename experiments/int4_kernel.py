"""The 4-bit target against the int8 target on a CPU: a decode step, a 5-position verify, a prompt's prefill.

    python -m experiments.int4_kernel --model qwen2.5-coder-1.5b --threads 1 --repeats 7 \\
        --out experiments/results/int4-kernel-qwen-<machine>-<date>

Both targets are loaded from --model in one process (`load_pair(quantize_target="int4")`: a GGUF's own 4-bit groups
where the source has them, the rest int8; and `quantize_target="int8"`), then timed in two parts, interleaved (each
repeat runs both targets, which one first alternating), medians and the int4 / int8 ratio in one run:
- linears: every Linear of the target, one after the other, at 1, 5 and --prefill rows (the kernels alone; a pass
  reads every weight once, so from DRAM, as a forward does);
- forwards: the whole target: one new token after --context cached ones (a decode step), 5 new tokens after them
  (a verify), and --prefill tokens from an empty cache (a prompt's prefill);
- layouts: the int4 target's 4-bit Linears in Q4_K's two-level form (float d, dmin per 256 inputs, 6-bit sc, m per
  32: 4.75 bits a weight) against the same groups with a float32 scale and offset each (6.5 bits), same outputs.
It also counts the bytes each target's Linear weights take (what a decode step reads).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from pathlib import Path

import torch

from assisted.models.int4 import Int4Linear, linear_kernels
from assisted.models.int8 import Int8Linear
from assisted.models.loading import load_pair
from drafting.kv_cache import crop_to, forward, new_cache
from experiments.lib.machine import run_lines
from kernels import int4

TARGETS = ("int4", "int8")
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}  # cpu: this process's CPU seconds (all threads)
PAIRS = {"linears": TARGETS, "forwards": TARGETS, "layouts": ("two-level", "per-group")}  # part -> (first, second)
FIELDS = ("part", "shape", "target", "repeat", "seconds")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m experiments.int4_kernel", description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b", help="named source, GGUF file or float folder")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=7, help="timed repeats (one more warms up)")
    parser.add_argument("--context", type=int, default=200, help="cached tokens before a step or a verify")
    parser.add_argument("--prefill", type=int, default=117, help="prompt tokens of a prefill (and rows of the "
                                                                 "linears' largest call)")
    parser.add_argument("--parts", nargs="+", choices=tuple(PAIRS), default=list(PAIRS))
    parser.add_argument("--clock", choices=tuple(CLOCKS), default="wall",
                        help="wall seconds, or the process's CPU seconds (steadier on a shared machine at one thread; "
                             "the sum over threads at more)")
    parser.add_argument("--out", type=Path, help="folder for results.csv and README.md")
    return parser.parse_args(argv)


def linears(model) -> list[torch.nn.Module]:
    return [m for m in model.modules() if isinstance(m, (Int4Linear, Int8Linear))]


def weight_bytes(model) -> int:
    """Bytes of every quantized Linear's weights (int8: one byte a weight and a float scale per output)."""
    total = 0
    for m in linears(model):
        total += m.packed.numel() if isinstance(m, Int4Linear) else m.out_features * (m.in_features + 4)
    return total


def time_linears(layers: list[torch.nn.Module], rows: int, clock=time.perf_counter) -> float:
    """Seconds of one pass over every Linear at `rows` rows (inputs made before the clock starts)."""
    inputs = {m.in_features: torch.randn(rows, m.in_features) for m in layers}
    start = clock()
    for m in layers:
        m(inputs[m.in_features])
    return clock() - start


def time_forwards(model, ids: list[int], context: int, prefill: int, clock=time.perf_counter) -> dict[str, float]:
    """Seconds of a step (1 new token after `context`), a verify (5 new tokens) and a prefill of `prefill` tokens."""
    cache, out = new_cache(), {}
    forward(model, cache, ids[:context], 1)
    for name, k in (("step", 1), ("verify 5", 5)):
        start = clock()
        forward(model, cache, ids[context : context + k], k)
        out[name] = clock() - start
        crop_to(cache, context)
    start = clock()
    forward(model, new_cache(), ids[:prefill], 1)
    out[f"prefill {prefill}"] = clock() - start
    return out


def per_group(layer: Int4Linear) -> Int4Linear:
    """The same weights with each group's own float32 scale and offset (one group a super-block: sc = m = 1), the
    form without Q4_K's two levels: 6.5 bits a weight against 4.75, the same products (bitwise the same output)."""
    groups = layer.groups()
    scale, offset = groups.scale_offset()
    ones = torch.ones_like(groups.sc)
    return Int4Linear(int4.Groups(groups.codes, scale, -offset, ones, ones), layer.bias)


def contenders(models: dict, parts) -> dict[str, dict[str, list]]:
    """part -> {name: what it times}: Linear lists for "linears" and "layouts", whole models for "forwards"."""
    out = {}
    if "linears" in parts:
        out["linears"] = {t: linears(models[t]) for t in TARGETS}
    if "layouts" in parts:
        two_level = [m for m in linears(models["int4"]) if isinstance(m, Int4Linear)]
        out["layouts"] = {"two-level": two_level, "per-group": [per_group(m) for m in two_level]}
        x = torch.randn(3, two_level[0].in_features)
        assert torch.equal(out["layouts"]["per-group"][0](x), two_level[0](x)), "the two layouts must agree"
    if "forwards" in parts:
        out["forwards"] = {t: models[t] for t in TARGETS}
    return out


def measure(models: dict, args) -> list[dict]:
    vocab = next(iter(models.values())).config.vocab_size
    ids = [(1000 + 7 * i) % vocab for i in range(max(args.context + 5, args.prefill))]
    row_counts = (1, 5, args.prefill)
    timed_parts, clock = contenders(models, args.parts), CLOCKS[args.clock]
    rows = []
    with torch.inference_mode():
        for repeat in range(args.repeats + 1):  # repeat 0 warms up and is dropped
            timed = []
            for part, systems in timed_parts.items():
                order = list(systems) if repeat % 2 else list(systems)[::-1]
                if part == "forwards":
                    for name in order:
                        timed += [(part, shape, name, s) for shape, s in
                                  time_forwards(systems[name], ids, args.context, args.prefill, clock).items()]
                    continue
                for n in row_counts:
                    timed += [(part, f"{n} rows", name, time_linears(systems[name], n, clock)) for name in order]
            if repeat:
                rows += [dict(zip(FIELDS, (part, shape, name, repeat, s))) for part, shape, name, s in timed]
            print(f"repeat {repeat}: " + ", ".join(f"{part} {name} {shape} {1e3 * s:.0f} ms"
                                                   for part, shape, name, s in timed), file=sys.stderr, flush=True)
    return rows


def table(rows: list[dict]) -> list[str]:
    """Per (part, shape): median ms of the part's two contenders, their ratio of medians and its range over
    repeats."""
    lines = ["| part | shape | first | ms | second | ms | first / second | per-repeat range |", "|---" * 8 + "|"]
    for part, shape in dict.fromkeys((r["part"], r["shape"]) for r in rows):
        mine = [r for r in rows if (r["part"], r["shape"]) == (part, shape)]
        first, second = PAIRS[part]
        by = {name: {r["repeat"]: r["seconds"] for r in mine if r["target"] == name} for name in (first, second)}
        med = {name: statistics.median(by[name].values()) for name in by}
        ratios = [by[first][k] / by[second][k] for k in by[first]]
        lines.append(f"| {part} | {shape} | {first} | {1e3 * med[first]:.1f} | {second} | {1e3 * med[second]:.1f} | "
                     f"{med[first] / med[second]:.2f} | {min(ratios):.2f}-{max(ratios):.2f} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    models = {t: load_pair(args.model, quantize_target=t)[0] for t in TARGETS}
    rows = measure(models, args)
    readme = [f"# int4 against int8 target: {args.out.name if args.out else args.model}", "",
              *run_lines("experiments.int4_kernel", argv), f"- model {args.model}; context {args.context}, "
              f"prefill {args.prefill}, {args.repeats} repeats, targets interleaved, {args.clock} clock", ""]
    for t in TARGETS:
        megabytes = weight_bytes(models[t]) / 1e6
        readme.append(f"- {t} target: {linear_kernels(models[t])}; Linear weights {megabytes:.0f} MB")
    readme += ["", *table(rows), ""]
    print("\n".join(readme))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        with open(args.out / "results.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=FIELDS)
            writer.writeheader()
            writer.writerows(rows)
        (args.out / "README.md").write_text("\n".join(readme) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

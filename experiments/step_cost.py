"""One decode step of the int4 target and its assistant against the bytes they read and the read loop's bandwidth.

    python -m experiments.step_cost --threads 1 2 --repeats 15 --profile --out experiments/results/...

Loads the recommended CPU pair (int4 target keeping the GGUF's Q4_K and Q6_K groups, int4 copy of the assistant),
prefills --prefix tokens and then times one-row decode steps (one position, logits included), every model variant
interleaved step by step at each thread count:
  target          as loaded: Q4_K on the int4 kernel, Q6_K on the exact 6-bit kernel
  target-q6-int8  the same target with its Q6_K tensors as fbgemm int8 (how they ran before the 6-bit kernel)
  assistant       the assistant's int4 copy
Each step is set against its floor: the weight bytes one step reads / the read loop's bandwidth at that thread count
(`experiments.kernel_paths.read_bandwidth`). `--profile` adds where one step's time goes (torch.profiler over 10
steps; the profiler inflates small ops, so read the shares, not the sums).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import torch

from experiments.kernel_paths import read_bandwidth
from experiments.lib import cli, report
from experiments.lib.intervals import paired_ratio
from experiments.lib.timing import Prefixed


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes one decode step reads of `model`'s Linear weights (packed 4-bit and 6-bit, int8, float)."""
    from assisted.models.int4_linear import Int4Linear
    from assisted.models.int8 import Int8Linear
    from assisted.models.q6k_linear import Q6KLinear
    total = 0
    for module in model.modules():
        if isinstance(module, (Int4Linear, Q6KLinear)):
            total += module.packed.numel()
        elif isinstance(module, Int8Linear):
            total += module.in_features * module.out_features + 4 * module.out_features
        elif isinstance(module, torch.nn.Linear):
            total += module.weight.numel() * module.weight.element_size()
    return total


def q6_as_int8(model: torch.nn.Module) -> dict[str, tuple[torch.nn.Module, torch.nn.Module]]:
    """Full name -> (parent, int8 module) for every Q6KLinear: its file weights through fbgemm, as before."""
    from assisted.models.int8 import Int8Linear
    from assisted.models.q6k_linear import Q6KLinear
    swaps = {}
    for name, module in model.named_modules():
        if isinstance(module, Q6KLinear):
            linear = torch.nn.Linear(module.in_features, module.out_features, bias=module.bias is not None)
            linear.weight.data = module.dequantized()
            if module.bias is not None:
                linear.bias.data = module.bias.clone()
            swaps[name] = Int8Linear(linear)
    return swaps


def swapped(model: torch.nn.Module, modules: dict[str, torch.nn.Module]) -> dict[str, torch.nn.Module]:
    """Put `modules` in place by full name; returns the ones they replaced."""
    old = {}
    for name, module in modules.items():
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        old[name] = getattr(parent, child)
        setattr(parent, child, module)
    return old


def profile(timer: Prefixed, token: int, steps: int = 10, top: int = 8) -> list[list]:
    """The `top` ops by self CPU time over `steps` one-row steps: [op, calls a step, ms a step, share]."""
    from torch.profiler import ProfilerActivity, profile as run_profiler
    with run_profiler(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            timer.seconds([token])
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    calls = sum(e.count for e in events) / steps
    rows = [[e.key, round(e.count / steps, 1), round(e.self_cpu_time_total / steps / 1e3, 2),
             f"{e.self_cpu_time_total / total:.0%}"] for e in sorted(events, key=lambda e: -e.self_cpu_time_total)]
    return rows[:top] + [["(all ops)", round(calls), round(total / steps / 1e3, 2), "100%"]]


def main(argv: list[str] | None = None) -> int:
    p = cli.parser("step_cost", __doc__)
    cli.add_models(p)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="torch CPU threads, each in turn")
    p.add_argument("--repeats", type=int, default=15, help="timed steps of each variant at each thread count")
    p.add_argument("--out", type=Path)
    p.add_argument("--prefix", type=int, default=120, help="cached tokens before the timed step")
    p.add_argument("--profile", action="store_true")
    args = p.parse_args(argv)
    args.quantize_target, args.assistant_int4 = "int4", True
    loaded = cli.load(args)
    if loaded is None:
        return 1
    model, tokenizer, assistant = loaded
    prefix = tokenizer("def quicksort(items):\n" * 40)["input_ids"][: args.prefix]
    timers = {"target": Prefixed(model, prefix), "assistant": Prefixed(assistant, prefix)}
    int8_q6 = q6_as_int8(model)
    bytes_of = {"target": weight_bytes(model), "assistant": weight_bytes(assistant)}
    exact_q6 = swapped(model, int8_q6)
    bytes_of["target-q6-int8"] = weight_bytes(model)
    swapped(model, exact_q6)
    variants = ["target", "target-q6-int8", "assistant"]
    rows, profiles = [], []
    for threads in args.threads:
        bandwidth = read_bandwidth(threads)
        torch.set_num_threads(threads)
        seconds = {v: [] for v in variants}
        for r in range(args.repeats + 1):  # the first round warms up and is not kept
            for variant in variants[r % 3:] + variants[: r % 3]:
                if variant == "target-q6-int8":
                    swapped(model, int8_q6)
                spent = timers["assistant" if variant == "assistant" else "target"].seconds([prefix[-1]])
                if variant == "target-q6-int8":
                    swapped(model, exact_q6)
                if r:
                    seconds[variant].append(spent)
        for variant in variants:
            median = statistics.median(seconds[variant])
            floor = bytes_of[variant] / bandwidth
            rows.append({"threads": threads, "variant": variant, "ms": median * 1e3, "bytes": bytes_of[variant],
                         "read_gb_s": bandwidth / 1e9, "floor_ms": floor * 1e3, "x_floor": median / floor})
        pairs = list(zip(seconds["target-q6-int8"], seconds["target"]))
        rows[-3]["gain_vs_q6_int8"] = "{:.3f} [{:.3f}, {:.3f}]".format(*paired_ratio(pairs))
        rows[-1]["vs_target"] = statistics.median(seconds["assistant"]) / statistics.median(seconds["target"])
        if args.profile:
            for variant in variants:
                if variant == "target-q6-int8":
                    swapped(model, int8_q6)
                timer = timers["assistant" if variant == "assistant" else "target"]
                profiles += [f"### {variant}, {threads} thread(s)", "", *report.table(
                    ["op", "calls a step", "ms a step (profiled)", "share"], profile(timer, prefix[-1])), ""]
                if variant == "target-q6-int8":
                    swapped(model, exact_q6)
        for row in rows[-3:]:
            print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
    if args.out:
        steps = report.table(["threads", "variant", "step ms", "weight MB", "read loop GB/s", "floor ms",
                              "step / floor", "notes"],
                             [[r["threads"], r["variant"], f"{r['ms']:.1f}", f"{r['bytes'] / 1e6:.0f}",
                               f"{r['read_gb_s']:.1f}", f"{r['floor_ms']:.1f}", f"{r['x_floor']:.2f}",
                               (f"exact Q6_K vs int8 Q6_K: {r['gain_vs_q6_int8']}x" if "gain_vs_q6_int8" in r else
                                f"{r['vs_target']:.2f} of the target's step" if "vs_target" in r else "")]
                              for r in rows])
        head = report.run_lines("experiments.step_cost", argv if argv is not None else sys.argv[1:])
        body = ["## One-row decode step (median)", "", *steps, "", *(["## Where a step goes", ""] + profiles
                                                                      if profiles else [])]
        report.write_run(args.out, "One decode step against its bytes", head, body, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One decode step of the int4 target and its assistant against the bytes they read and the read loop's bandwidth.

    python -m experiments.step_cost --threads 1 2 --repeats 15 --profile --out experiments/results/...

Loads the recommended CPU pair (int4 target keeping the GGUF's Q4_K and Q6_K groups, int4 copy of the assistant),
prefills --prefix tokens and then times one-row decode steps (one position, logits included), every model variant
interleaved step by step at each thread count:
  target             as loaded: fused decoder layers, Q4_K on the int4 kernel, Q6_K on the exact 6-bit kernel
  target-unfused     the same Linears, each layer op by op (transformers' modules)
  target-before      op by op, Q6_K tensors on fbgemm int8 (how the step ran before the fused layers and Q6_K)
  assistant          the assistant's int4 copy, fused; assistant-unfused: op by op
Each step is set against its floor: the weight bytes one step reads / the read loop's bandwidth at that thread count
(`experiments.kernel_paths.read_bandwidth`). `--profile` adds where one step's time goes (torch.profiler over 10
steps; the profiler inflates small ops, so read the shares, not the sums).
"""

from __future__ import annotations

import statistics
import sys

import torch

from experiments.kernel_paths import read_bandwidth
from experiments.lib import cli, report
from experiments.lib.intervals import paired_ratio
from experiments.lib.runner import rotated
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


def q6_as_int8(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """Full name -> an `Int8Linear` for every Q6KLinear: its file weights through fbgemm, as they ran before."""
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


def unfused(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """Full name -> the layer each fused decoder layer replaced (the same Linears, run op by op)."""
    from assisted.models.fused_layers import FusedDecoderLayer
    return {name: m.unfused() for name, m in model.named_modules() if isinstance(m, FusedDecoderLayer)}


def swapped(model: torch.nn.Module, modules: dict[str, torch.nn.Module]) -> dict[str, torch.nn.Module]:
    """Put `modules` in place by full name; returns the ones they replaced."""
    old = {}
    for name, module in modules.items():
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        old[name] = getattr(parent, child)
        setattr(parent, child, module)
    return old


class Variant:
    """A model as loaded, or with some of its modules swapped for the step being timed."""

    def __init__(self, timer: Prefixed, model: torch.nn.Module, *swaps: dict[str, torch.nn.Module]):
        self.timer, self.model, self.swaps = timer, model, swaps

    def apply(self, call):
        """`call(timer)`'s result with the swaps in place, undone after."""
        undo = [swapped(self.model, s) for s in self.swaps]  # unfused layers first, then their Q6_K Linears
        try:
            return call(self.timer)
        finally:
            for old in reversed(undo):
                swapped(self.model, old)


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


def variants(model, assistant, prefix: list[int]) -> dict[str, Variant]:
    """What is timed: this code's step, and the same models with the pieces this code replaced put back."""
    target, helper = Prefixed(model, prefix), Prefixed(assistant, prefix)
    return {"target": Variant(target, model), "target-unfused": Variant(target, model, unfused(model)),
            "target-before": Variant(target, model, unfused(model), q6_as_int8(model)),
            "assistant": Variant(helper, assistant),
            "assistant-unfused": Variant(helper, assistant, unfused(assistant))}


PAIRS = (("target", "target-before"), ("target", "target-unfused"), ("assistant", "assistant-unfused"))


def measure(found: dict[str, Variant], token: int, repeats: int) -> dict[str, list[float]]:
    """Seconds of `repeats` steps of each variant, interleaved in an order rotated per round (one round of warm-up)."""
    seconds = {name: [] for name in found}
    for r in range(repeats + 1):
        for name in rotated(list(found), r):
            spent = found[name].apply(lambda timer: timer.seconds([token]))
            if r:
                seconds[name].append(spent)
    return seconds


def rows_of(found: dict[str, Variant], seconds: dict[str, list[float]], threads: int,
            bandwidth: float) -> list[dict]:
    rows = []
    for name, variant in found.items():
        weight = variant.apply(lambda _: weight_bytes(variant.model))
        median = statistics.median(seconds[name])
        rows.append({"threads": threads, "variant": name, "ms": median * 1e3, "bytes": weight,
                     "read_gb_s": bandwidth / 1e9, "floor_ms": weight / bandwidth * 1e3,
                     "x_floor": median * bandwidth / weight})
    for ours, other in PAIRS:
        ratio = paired_ratio(list(zip(seconds[other], seconds[ours])))
        rows[list(found).index(ours)][f"vs_{other}"] = "{:.3f} [{:.3f}, {:.3f}]".format(*ratio)
    rows[list(found).index("assistant")]["of_target"] = (statistics.median(seconds["assistant"]) /
                                                         statistics.median(seconds["target"]))
    return rows


def main(argv: list[str] | None = None) -> int:
    p = cli.parser("step_cost", __doc__)
    cli.add_models(p)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="torch CPU threads, each in turn")
    p.add_argument("--repeats", type=int, default=15, help="timed steps of each variant at each thread count")
    cli.add_out(p, required=False)
    p.add_argument("--prefix", type=int, default=120, help="cached tokens before the timed step")
    p.add_argument("--profile", action="store_true")
    args = p.parse_args(argv)
    args.quantize_target, args.assistant_int4 = "int4", True
    model, tokenizer, assistant = cli.load(args)
    prefix = tokenizer("def quicksort(items):\n" * 40)["input_ids"][: args.prefix]
    found = variants(model, assistant, prefix)
    rows, profiles = [], []
    for threads in args.threads:
        bandwidth = read_bandwidth(threads)
        torch.set_num_threads(threads)
        rows += rows_of(found, measure(found, prefix[-1], args.repeats), threads, bandwidth)
        for row in rows[-len(found):]:
            print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
        if args.profile:
            for name in ("target", "target-before", "assistant", "assistant-unfused"):
                table = found[name].apply(lambda timer: profile(timer, prefix[-1]))
                profiles += [f"### {name}, {threads} thread(s)", "",
                             *report.table(["op", "calls a step", "ms a step (profiled)", "share"], table), ""]
    if args.out:
        write(args, argv, model, rows, profiles)
    return 0


def write(args, argv, model, rows: list[dict], profiles: list[str]) -> None:
    from assisted.models.int4_models import linear_kernels

    def notes(r: dict) -> str:
        found = [f"{r[k]}x vs {k[3:]}" for k in r if k.startswith("vs_")]
        found += [f"{r['of_target']:.2f} of the target's step"] if "of_target" in r else []
        return "; ".join(found)

    steps = report.table(["threads", "variant", "step ms", "weight MB", "read loop GB/s", "floor ms", "step / floor",
                          "paired speed-up [90% CI]"],
                         [[r["threads"], r["variant"], f"{r['ms']:.1f}", f"{r['bytes'] / 1e6:.0f}",
                           f"{r['read_gb_s']:.1f}", f"{r['floor_ms']:.1f}", f"{r['x_floor']:.2f}", notes(r)]
                          for r in rows])
    head = [*report.run_lines("experiments.step_cost", argv if argv is not None else sys.argv[1:]),
            f"- target {cli.target_label(args)}: {linear_kernels(model)}; assistant {cli.assistant_label(args)}",
            "- variants: target = fused layers and exact Q6_K (this code); target-unfused = the same Linears op by "
            "op; target-before = op by op with Q6_K on fbgemm int8 (the code before); the assistant likewise"]
    body = ["## One-row decode step (median)", "", *steps, "", *(["## Where a step goes", ""] + profiles
                                                                  if profiles else [])]
    report.write_run(args.out, "One decode step against its bytes", head, body, rows)


if __name__ == "__main__":
    sys.exit(main())

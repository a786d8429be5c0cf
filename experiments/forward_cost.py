"""What one target forward costs as a function of the tokens it verifies: the curve every policy lives on.

    python -m experiments.forward_cost --model qwen2.5-coder-1.5b --threads 1 --out forward_cost.csv

After a 64-token prefill, times a forward over n more tokens (logits for all n, as verification needs) for
each n, interleaved, `--repeats` times; prints the median seconds and the ratio to n = 1. On a GPU the
curve is flat for small n, so drafts are nearly free to verify; on a CPU it is not, and that decides
whether model drafting can pay. `--prepacked` also times the same model with its Linear weights
pre-packed for oneDNN (`assisted.models.packing`: used from the row count where it wins on this machine, timed per
weight shape).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from drafting.kv_cache import cache_argument  # noqa: E402
from assisted.models.packing import pack_linear_weights  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m experiments.forward_cost", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="qwen2.5-coder-1.5b")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--ns", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--prepacked", action="store_true", help="also time oneDNN pre-packed Linear weights (CPU)")
    p.add_argument("--out", default=None, help="CSV of every timing")
    return p.parse_args(argv)


def time_forward(model, prefix: torch.Tensor, n: int) -> float:
    """Seconds of one forward over n tokens after `prefix` (1, p) is cached."""
    from transformers import DynamicCache
    cache = DynamicCache()
    model(input_ids=prefix, use_cache=True, logits_to_keep=1, **{cache_argument(type(model)): cache})
    x = prefix[:, :n]
    start = time.perf_counter()
    model(input_ids=x, use_cache=True, logits_to_keep=n, **{cache_argument(type(model)): cache})
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.out:  # before the model loads: a bad path fails now, not after minutes of timing
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    if args.threads:
        torch.set_num_threads(args.threads)
    from experiments.models import NotPreparedError, load
    try:
        model, tokenizer = load(args.model, dtype=args.dtype, device=args.device)
    except (NotPreparedError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    prefix = tokenizer("def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n" * 4,
                       return_tensors="pt").input_ids[:, :64].to(model.device)
    packed = pack_linear_weights(model) if args.prepacked else None
    if packed:
        print("packed from rows, per weight shape:", {f"{o}x{i}": r for (o, i), r in packed.min_rows.items()})
    layouts = {"dense": packed.dense if packed else contextlib.nullcontext}
    layouts |= {"prepacked": contextlib.nullcontext} if packed else {}
    rows = []
    with torch.inference_mode():
        for repeat in range(args.repeats + 1):  # the first round warms up and is dropped
            for layout, context in layouts.items():
                with context():
                    for n in args.ns:
                        seconds = time_forward(model, prefix, n)
                        if repeat:
                            rows.append({"layout": layout, "n": n, "repeat": repeat, "seconds": seconds})
    print(f"{args.model} {args.device} {args.dtype} threads={torch.get_num_threads()}: median seconds (x n = 1)")
    for layout in layouts:
        med = {
            n: statistics.median(r["seconds"] for r in rows if r["layout"] == layout and r["n"] == n) for n in args.ns
        }
        print(f"{layout:>10}: " + "  ".join(f"n={n} {s:.3f} ({s / med[args.ns[0]]:.2f}x)" for n, s in med.items()))
    if args.out:
        with open(args.out, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=["layout", "n", "repeat", "seconds"])
            writer.writeheader(), writer.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())

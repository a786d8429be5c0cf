"""What row-invariant attention costs in a whole int8 forward: the C++ op against the Python loop it replaces.

    python -m experiments.attention_cost --model smollm2-135m --threads 1 2 --repeats 7 [--out DIR]

The model is made int8 (`assisted.models.int8.quantize_int8`); its attention is then switched per unit between
``"row_invariant"`` (the op, `kernels.attention`), ``"row_invariant_loop"`` (one sdpa call per query row, the
fallback) and stock ``"sdpa"`` (not row-invariant: the floor a single sdpa call sets). Per unit: a 117-token
prefill, a 1-position step and a 5-position verify after it (the cache cropped back between them). Units are
interleaved (thread counts, attentions in a rotating order) and repeated; the first round warms up and is dropped.
Printed: median milliseconds, and per thread count the median of the paired ratios (same round) op / loop and
op / sdpa. Before timing, one check per attention: is the 5-position verify bitwise the 5 single steps?
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from assisted.models.int8 import quantize_int8  # noqa: E402
from drafting.kv_cache import crop_to, forward, new_cache  # noqa: E402
from kernels.attention import ATTENTION, LOOP_ATTENTION, implementation  # noqa: E402

ATTENTIONS = {"op": ATTENTION, "loop": LOOP_ATTENTION, "sdpa": "sdpa"}
PROMPT = 117  # tokens: the held-out invoice prompt's length in issue 53
TEXT = ("Extract the invoice as JSON with the fields number, date, seller, buyer, lines (description, quantity, "
        "unit price) and total. Invoice 2024-117, issued 3 March 2024 by Nordwind Tools GmbH, Hafenstrasse 12, "
        "Hamburg, to Lindqvist Carpentry AB, Storgatan 5, Uppsala: 12 chisels at 8.50 EUR, 4 planes at 42.00 EUR, "
        "30 boxes of screws at 3.20 EUR, one workbench at 310.00 EUR; shipping 25.00 EUR; payable within 30 days. ")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m experiments.attention_cost", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m", help="a prepared model name (experiments.models)")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--attentions", nargs="+", default=list(ATTENTIONS), choices=list(ATTENTIONS))
    p.add_argument("--out", default=None, help="folder for timings.csv and README.md")
    return p.parse_args(argv)


def timed(model, cache, ids: list[int], keep: int) -> float:
    """Seconds of one forward over `ids` after what `cache` holds (logits for the last `keep` positions)."""
    start = time.perf_counter()
    forward(model, cache, ids, keep)
    return time.perf_counter() - start


def one_unit(model, ids: list[int]) -> dict[str, float]:
    """The three forwards of a unit: prefill, then a step and a verify after it, the cache cropped back between."""
    cache = new_cache()
    prefill = timed(model, cache, ids[:PROMPT], 1)
    step = timed(model, cache, ids[PROMPT : PROMPT + 1], 1)
    crop_to(cache, PROMPT)
    verify = timed(model, cache, ids[PROMPT : PROMPT + 5], 5)
    return {"prefill 117": prefill, "step 1": step, "verify 5": verify}


def verify_is_steps(model, ids: list[int]) -> bool:
    """Whether a 5-position verify after the prompt gives bitwise the logits of 5 one-position steps."""
    cache = new_cache()
    forward(model, cache, ids[:PROMPT], 1)
    together = forward(model, cache, ids[PROMPT : PROMPT + 5], 5)
    crop_to(cache, PROMPT)
    alone = torch.cat([forward(model, cache, [t], 1) for t in ids[PROMPT : PROMPT + 5]])
    return torch.equal(together, alone)


def measure(model, ids: list[int], args) -> list[dict]:
    rows = []
    for repeat in range(args.repeats + 1):  # round 0 warms up
        for threads in args.threads:
            torch.set_num_threads(threads)
            names = args.attentions[repeat % len(args.attentions):] + args.attentions[: repeat % len(args.attentions)]
            for name in names:
                model.set_attn_implementation(ATTENTIONS[name])
                for forward_kind, seconds in one_unit(model, ids).items():
                    if repeat:
                        rows.append(dict(repeat=repeat, threads=threads, attention=name, forward=forward_kind,
                                         seconds=seconds))
    return rows


def report(rows: list[dict], args) -> list[str]:
    """Median ms per (threads, forward, attention), and the median paired ratios op / loop, op / sdpa."""
    lines = []
    for threads in args.threads:
        lines += ["", f"threads={threads}", "", "| forward | " + " | ".join(f"{a} ms" for a in args.attentions)
                  + " | op / loop | op / sdpa |", "|---" * (len(args.attentions) + 3) + "|"]
        for kind in ("prefill 117", "step 1", "verify 5"):
            seconds = {a: {r["repeat"]: r["seconds"] for r in rows if (r["threads"], r["forward"], r["attention"])
                           == (threads, kind, a)} for a in args.attentions}
            cells = [f"{statistics.median(seconds[a].values()) * 1e3:.1f}" for a in args.attentions]
            ratios = [_paired(seconds, "op", other) for other in ("loop", "sdpa")]
            lines.append(f"| {kind} | " + " | ".join(cells + ratios) + " |")
    return lines


def _paired(seconds: dict, a: str, b: str) -> str:
    if a not in seconds or b not in seconds:
        return "-"
    return f"{statistics.median(seconds[a][r] / seconds[b][r] for r in seconds[a]):.2f}x"


def _load() -> str:
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


def bitwise(model, ids: list[int], names: list[str]) -> dict[str, bool]:
    """Per attention: is the 5-position verify bitwise the 5 single steps?"""
    same = {}
    for name in names:
        model.set_attn_implementation(ATTENTIONS[name])
        same[name] = verify_is_steps(model, ids)
    return same


def write_run(out: Path, rows: list[dict], head: list[str], lines: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "timings.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader(), writer.writerows(rows)
    (out / "README.md").write_text("\n".join(head + lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from experiments.lib.machine import run_lines
    from experiments.models import NotPreparedError, load

    try:
        model, tokenizer = load(args.model)
    except (NotPreparedError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    quantize_int8(model)
    ids = tokenizer(TEXT * 4).input_ids[: PROMPT + 5]
    head = [f"- attention op: {implementation()}; load average (1, 5, 15 min) before: {_load()}"]
    with torch.inference_mode():
        same = bitwise(model, ids, args.attentions)
        head.append("- verify 5 bitwise = 5 steps: " + ", ".join(f"{a} {s}" for a, s in same.items()))
        print("\n".join(head))
        rows = measure(model, ids, args)
    lines = report(rows, args) + ["", f"Load average (1, 5, 15 min) after the run: {_load()}."]
    print("\n".join(lines))
    if args.out:
        command = run_lines("experiments.attention_cost", argv or sys.argv[1:])
        write_run(Path(args.out), rows, [f"# Attention cost: {args.model} int8", "", *command, *head], lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())

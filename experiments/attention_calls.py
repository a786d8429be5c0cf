"""The attention calls of one forward alone, at a model's shapes: the C++ op against the loop and stock sdpa.

    python -m experiments.attention_calls --model qwen2.5-coder-1.5b --threads 1 2 --repeats 25 [--out DIR]

Reads only the model's config (no weights load, so the 1.5B's shapes cost nothing to measure) and times, on random
float32 tensors, one forward's worth of attention calls (one per layer) for a 117-token prefill, a 1-position
step and a 5-position verify after it, each call with its causal bool mask as transformers builds it:
``kernels.attention.row_invariant_attention`` (the op), ``loop_attention`` (one sdpa call per query row) and
torch's ``scaled_dot_product_attention`` over the whole block (not row-invariant). Interleaved and repeated as in
`experiments.attention_cost`, whose table this prints; whole int8 forwards are that module's.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from experiments.attention_cost import PROMPT, report, write_run  # noqa: E402
from kernels.attention import implementation, loop_attention, row_invariant_attention  # noqa: E402

FORWARDS = {"prefill 117": (PROMPT, PROMPT), "step 1": (1, PROMPT + 1), "verify 5": (5, PROMPT + 5)}  # (n, L)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m experiments.attention_calls", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m", help="a prepared model name (its config is read)")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--repeats", type=int, default=25)
    p.add_argument("--out", default=None, help="folder for timings.csv and README.md")
    args = p.parse_args(argv)
    args.attentions = ["op", "loop", "sdpa"]
    return args


def shapes(config) -> dict[str, int]:
    """Heads, key/value heads, head dim and layers of a transformers config."""
    heads = config.num_attention_heads
    return dict(heads=heads, kv_heads=getattr(config, "num_key_value_heads", None) or heads,
                dim=getattr(config, "head_dim", None) or config.hidden_size // heads, layers=config.num_hidden_layers)


def calls(shape: dict[str, int], n: int, length: int) -> dict[str, Callable]:
    """One call per attention on random (1, H, n, D) queries over (1, H_kv, L, D) keys, causal bool mask."""
    query = torch.randn(1, n, shape["heads"], shape["dim"]).transpose(1, 2)  # the layout the models pass
    key, value = (torch.randn(1, shape["kv_heads"], length, shape["dim"]) for _ in range(2))
    mask = torch.ones(n, length, dtype=torch.bool).tril(length - n)[None, None]  # (1, 1, n, L)
    groups = shape["heads"] // shape["kv_heads"]
    full_key, full_value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    return {"op": lambda: row_invariant_attention(None, query, key, value, mask),
            "loop": lambda: loop_attention(None, query, key, value, mask),
            "sdpa": lambda: F.scaled_dot_product_attention(query, full_key, full_value, attn_mask=mask)}


def measure(shape: dict[str, int], args) -> list[dict]:
    """Seconds of `layers` calls per (round, threads, attention, forward); round 0 warms up and is dropped."""
    units = {kind: calls(shape, n, length) for kind, (n, length) in FORWARDS.items()}
    rows = []
    for repeat in range(args.repeats + 1):
        for threads in args.threads:
            torch.set_num_threads(threads)
            turn = repeat % len(args.attentions)
            for name in args.attentions[turn:] + args.attentions[:turn]:
                for kind, call in units.items():
                    start = time.perf_counter()
                    for _ in range(shape["layers"]):
                        call[name]()
                    if repeat:
                        rows.append(dict(repeat=repeat, threads=threads, attention=name, forward=kind,
                                         seconds=time.perf_counter() - start))
    return rows


def main(argv: list[str] | None = None) -> int:
    from transformers import AutoConfig

    from experiments.lib.machine import run_lines
    from experiments.models import model_dir

    args = parse_args(argv)
    folder = model_dir(args.model)
    if not folder.exists():
        print(f"error: {args.model} is not prepared ({folder}); python -m experiments.models prepare {args.model}",
              file=sys.stderr)
        return 1
    shape = shapes(AutoConfig.from_pretrained(folder))
    head = [f"- shapes: {shape}; attention op: {implementation()}"]
    print("\n".join(head))
    with torch.inference_mode():
        rows = measure(shape, args)
    lines = report(rows, args)
    print("\n".join(lines))
    if args.out:
        command = run_lines("experiments.attention_calls", argv or sys.argv[1:])
        write_run(Path(args.out), rows, [f"# Attention calls alone: {args.model}'s shapes", "", *command, *head],
                  lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())

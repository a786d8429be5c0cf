"""A GPU cost table from first principles, for replays where no GPU was measured: an estimate, not a measurement.

    python -m experiments.gpu_estimate --out experiments/results/<run>/estimate.csv

Decoding one step on a GPU is bound by memory bandwidth: every weight the forward uses is read once, whatever
the number of tokens n, plus each layer's KV cache; the arithmetic (2 FLOP per weight per token) only matters
once n reaches the chip's FLOP-per-byte ridge (about 300 tokens on an H100 in bf16). So
    seconds(n) = launch + max(bytes read / bandwidth, 2 * weights * n / peak FLOP/s)
with the datasheet's bandwidth and dense bf16 rate (H100 SXM: 3.35 TB/s, 989 TFLOP/s) and `launch` the fixed
per-forward cost of issuing the kernels (0 under CUDA graphs; `experiments.gpu_check` measures the eager
forward, where it dominates). The input embedding is a lookup (only n rows read); an untied output head is
read whole. Written in the `experiments.forward_cost` CSV layout (plus model, dtype, context columns), the table
feeds `experiments.policy_replay --timings`.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

from experiments.lib.gpu_models import ARCHITECTURES

H100 = {"bandwidth": 3.35e12, "flops": 989e12}  # bytes/s and dense bf16 FLOP/s, NVIDIA's H100 SXM datasheet
VOCAB = 151936  # the Qwen pair's logits width (SmolLM2: 49152)


def weights_read(name: str, vocab: int) -> int:
    """Parameters one forward reads: the decoder layers, the final norm and the output head (not the embedding)."""
    a = ARCHITECTURES[name]
    h, inter, layers = a["hidden_size"], a["intermediate_size"], a["num_hidden_layers"]
    head_dim = h // a["num_attention_heads"]
    kv = a["num_key_value_heads"] * head_dim
    attention = h * h + 2 * h * kv + h * h + (h + 2 * kv if a["model_type"] == "qwen2" else 0)  # q, k, v, o (+ biases)
    mlp = 3 * h * inter
    return layers * (attention + mlp + 2 * h) + h + vocab * h


def kv_bytes(name: str, context: int, dtype_bytes: int) -> int:
    """Bytes of K and V cached for `context` tokens over all layers."""
    a = ARCHITECTURES[name]
    head_dim = a["hidden_size"] // a["num_attention_heads"]
    return 2 * a["num_hidden_layers"] * a["num_key_value_heads"] * head_dim * context * dtype_bytes


def seconds(name: str, n: int, context: int, *, vocab: int = VOCAB, dtype_bytes: int = 2, launch: float = 0.0,
            gpu: dict = H100) -> float:
    """Estimated seconds of one forward over n new tokens after `context` cached ones."""
    weights = weights_read(name, vocab)
    moved = weights * dtype_bytes + kv_bytes(name, context + n, dtype_bytes)
    return launch + max(moved / gpu["bandwidth"], 2 * weights * n / gpu["flops"])


def table(models: list[str], contexts: list[int], n_max: int, launch: float) -> list[dict]:
    return [{"model": m, "dtype": "bfloat16", "context": c, "layout": "estimate", "n": n, "repeat": 1,
             "seconds": seconds(m, n, c, launch=launch)}
            for m in models for c in contexts for n in range(1, n_max + 1)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.gpu_estimate", description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True, help="CSV to write")
    p.add_argument("--models", nargs="+", default=["qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"])
    p.add_argument("--contexts", type=int, nargs="+", default=[200, 1000])
    p.add_argument("--n-max", type=int, default=32)
    p.add_argument("--launch-s", type=float, default=0.0, help="fixed seconds per forward (0: CUDA graphs)")
    args = p.parse_args(argv)
    rows = table(args.models, args.contexts, args.n_max, args.launch_s)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    for m in args.models:
        ms = [1e3 * seconds(m, n, args.contexts[0], launch=args.launch_s) for n in (1, 8, 32)]
        print(f"{m}: {weights_read(m, VOCAB) / 1e9:.2f}B weights read; ms at n = 1, 8, 32: "
              + ", ".join(f"{x:.3f}" for x in ms))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Can a quantized target be verified losslessly? Row independence and forward cost of CPU int8 schemes.

Speculative verification scores k + 1 positions in one forward and is lossless only if each position's logits are
those plain decoding computes for it: a function of its own prefix, not of the other rows fed beside it. Dynamic
quantization with one activation scale per tensor (`torch.ao.quantization.quantize_dynamic`) breaks that: the scale
depends on every row in the forward. The row-invariant int8 of `assisted.models.int8` (per-row activation ranges,
per-query-row attention) keeps it. This measures, per scheme, the largest
logit difference between one forward over 10 positions and the same positions scored one at a time (float32 rounding
is ~1e-5), and the cost of a forward over k = 1, 2, 5, 9 new tokens after 150 cached ones (interleaved repeats).

    python -m experiments.quantized_rows --model smollm2-135m --out experiments/results/quantized-rows-...
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

from assisted.models.int8 import int8_copy
from assisted.models.loading import load_model
from drafting.kv_cache import crop_to, forward, new_cache

KS = (1, 2, 5, 9)


class WeightOnlyInt8(torch.nn.Module):
    """A Linear with int8 weights (one scale per output row) and float activations: rows stay independent."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        weight = linear.weight.detach().float()
        scale = weight.abs().amax(dim=1).clamp_min(1e-8) / 127
        self.register_buffer("weight_int8", torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8))
        self.register_buffer("scale", scale)
        self.bias, self.out_features = linear.bias, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch._weight_int8pack_mm(x.reshape(-1, x.shape[-1]).contiguous(), self.weight_int8, self.scale)
        y = y.reshape(*x.shape[:-1], -1)
        return y if self.bias is None else y + self.bias


def weight_only_int8(model):
    out = copy.deepcopy(model)
    for module in list(out.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, torch.nn.Linear):
                setattr(module, name, WeightOnlyInt8(child))
    return out


def torchao(config_name: str):
    def make(model):
        import torchao.quantization as q
        out = copy.deepcopy(model)
        q.quantize_(out, getattr(q, config_name)())
        return out
    return make


def per_tensor_int8(model):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization announces its successor (torchao)
        return torch.ao.quantization.quantize_dynamic(copy.deepcopy(model), {torch.nn.Linear}, dtype=torch.qint8)


SCHEMES = {"float32": lambda m: m, "torch.ao dynamic int8 (one range per call)": per_tensor_int8,
           "row-invariant int8 (assisted.models.int8)": int8_copy,
           "int8 weight-only (torch._weight_int8pack_mm)": weight_only_int8,
           "torchao Int8WeightOnlyConfig": torchao("Int8WeightOnlyConfig"),
           "torchao Int8DynamicActivationInt8WeightConfig": torchao("Int8DynamicActivationInt8WeightConfig")}


def row_difference(model, ids: list[int]) -> float:
    """Max |logits of positions 30..39 from one forward - the same positions scored one forward each|."""
    x = torch.tensor([ids[:40]])
    with torch.inference_mode():
        together = model(x).logits[0, 30:40]
        alone = torch.stack([model(x[:, : i + 1]).logits[0, -1] for i in range(30, 40)])
    return float((together - alone).abs().max())


def costs(models: dict, ids: list[int], repeats: int) -> dict:
    caches, times = {}, {(name, k): [] for name in models for k in KS}
    with torch.inference_mode():
        for name, model in models.items():
            caches[name] = new_cache()
            forward(model, caches[name], ids[:150], 1)
        for repeat in range(repeats + 1):  # repeat 0 warms up
            for name, model in models.items():
                for k in KS:
                    start = time.perf_counter()
                    forward(model, caches[name], ids[150 : 150 + k], k)
                    if repeat:
                        times[(name, k)].append(time.perf_counter() - start)
                    crop_to(caches[name], 150)
    return {name: {k: statistics.median(times[(name, k)]) for k in KS} for name in models}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.quantized_rows", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")
    base = load_model(args.model)
    models = {}
    for name, make in SCHEMES.items():
        try:
            models[name] = make(base)
        except Exception as error:  # noqa: BLE001 (torchao is optional)
            print(f"{name}: not run ({type(error).__name__}: {error})", file=sys.stderr)
    ids = list(range(1000, 1200))
    rows = {name: {"row_difference": row_difference(m, ids)} for name, m in models.items()}
    for name, by_k in costs(models, ids, args.repeats).items():
        rows[name] |= {f"ms_k{k}": 1e3 * s for k, s in by_k.items()}
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"command": "python -m experiments.quantized_rows " + " ".join(argv or sys.argv[1:]),
            "date": str(datetime.date.today()), "machine": platform.processor() or platform.machine(),
            "torch": torch.__version__, "threads": args.threads, "model": args.model}
    (args.out / "rows.json").write_text(json.dumps({"meta": meta, "schemes": rows}, indent=1))
    lines = ["| scheme | max logit difference, batched vs one by one | " + " | ".join(f"ms k={k}" for k in KS) + " |",
             "|---" * (len(KS) + 2) + "|"]
    lines += [f"| {name} | {r['row_difference']:.3g} | " + " | ".join(f"{r[f'ms_k{k}']:.1f}" for k in KS) + " |"
              for name, r in rows.items()]
    (args.out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

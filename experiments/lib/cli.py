"""The benchmarks' one command line: the arguments every study shares, and loading the models they name.

Flags keep every spelling a cited command used: `--pack` / `--packed-target`, `--assistant-int4` /
`--int4-assistant`, `--assistant-int8` / `--int8-assistant`.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def parser(module: str, doc: str | None) -> argparse.ArgumentParser:
    """An argument parser named `python -m experiments.<module>`, described by the first line of `doc`."""
    return argparse.ArgumentParser(prog=f"python -m experiments.{module}", description=(doc or "").split("\n")[0])


def add_models(p: argparse.ArgumentParser, *, target: str = "qwen2.5-coder-1.5b",
               assistant: str | None = "qwen2.5-coder-0.5b") -> None:
    """--target, --assistant ("random": a tiny random model of the target's vocabulary), the assistant's quantized
    copy, --pack and --quantize-target."""
    p.add_argument("--target", default=target)
    p.add_argument("--assistant", default=assistant,
                   help='a model source, or "random": a tiny random model with the target\'s vocabulary')
    group = p.add_mutually_exclusive_group()
    group.add_argument("--assistant-int4", "--int4-assistant", dest="assistant_int4", action="store_true",
                       help="draft with a group-wise int4 copy of the assistant (CPU; `assisted.models.int4_models`)")
    group.add_argument("--assistant-int8", "--int8-assistant", dest="assistant_int8", action="store_true",
                       help="draft with a dynamically quantized int8 copy of the assistant (CPU)")
    p.add_argument("--pack", "--packed-target", dest="pack", action="store_true",
                   help="pack the target's Linear weights (assisted.models.packing; CPU), for every system")
    p.add_argument("--quantize-target", choices=["int4", "int8"], default=None,
                   help="a row-invariant quantized target (`assisted.models.int4_models` / `int8`; CPU), for every "
                        "system")


def add_run(p: argparse.ArgumentParser, *, threads: int | None = 1, repeats: int | None = 1, out_required: bool = True,
            max_new_tokens: int | None = 160, seed: bool = True, temperatures: list[float] | None = None) -> None:
    """--threads and --out, and each of --repeats, --max-new-tokens, --seed and --temperatures unless its default
    is None (or `seed` False)."""
    p.add_argument("--threads", type=int, default=threads, help="torch CPU threads (None: torch's)")
    add_out(p, required=out_required)
    if repeats is not None:
        p.add_argument("--repeats", type=int, default=repeats, help="interleaved runs of every unit and system")
    if max_new_tokens is not None:
        p.add_argument("--max-new-tokens", type=int, default=max_new_tokens)
    if seed:
        p.add_argument("--seed", type=int, default=1000,
                       help="repeat r samples with seed + r, the same for every system")
    if temperatures is not None:
        p.add_argument("--temperatures", type=float, nargs="+", default=temperatures)


def add_out(p: argparse.ArgumentParser, *, required: bool = True, help: str | None = None) -> None:
    """--out: the run folder (`experiments.lib.report.write_run`)."""
    p.add_argument("--out", type=Path, required=required, default=None, help=help)


def add_pool(p: argparse.ArgumentParser, *, timeout: float, rebuilds: str) -> None:
    """--timeout (CPU seconds per stage of one task), --workers and --report-only, for the studies that run each
    task in a forked child (`experiments.lib.coverage_pool.run_pool`); `rebuilds`: what --report-only rebuilds."""
    p.add_argument("--timeout", type=float, default=timeout,
                   help="CPU seconds per task and stage (compile, walk); 10x that in wall time at most")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--report-only", action="store_true", help=f"rebuild {rebuilds} from --out")


def assistant_quantization(args) -> str | None:
    """"int4", "int8" or None, from `add_models`'s flags."""
    if getattr(args, "assistant_int4", False):
        return "int4"
    return "int8" if getattr(args, "assistant_int8", False) else None


def assistant_label(args) -> str:
    """The assistant as a results README names it."""
    quantize = assistant_quantization(args)
    return f"{args.assistant}{f' ({quantize} copy)' if quantize else ''}"


def target_label(args) -> str:
    """The target as a results README names it."""
    return (f"{args.target}{' (packed)' if getattr(args, 'pack', False) else ''}"
            f"{f' ({args.quantize_target})' if getattr(args, 'quantize_target', None) else ''}")


def set_threads(args) -> None:
    """torch's CPU threads from --threads (None: leave torch's)."""
    import torch
    if getattr(args, "threads", None):
        torch.set_num_threads(args.threads)


def begin(parse_args, argv: list[str] | None) -> tuple[list[str], argparse.Namespace]:
    """(argv, args) of a study's run: its command line (`sys.argv`'s tail where `argv` is None; the README names
    it), parsed by `parse_args`, torch's CPU threads set from --threads."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    set_threads(args)
    return argv, args


def load(args, assistant: str | None | bool = True) -> tuple:
    """(target, tokenizer, assistant or None) as `add_models`'s flags ask; exits with status 1, after printing why,
    when a model is not prepared or cannot be loaded. `assistant=False`: no assistant; a string: that source instead
    of --assistant."""
    from assisted.models.loading import QUANTIZED_COPIES, describe_load, load_pair, set_eos
    from assisted.models.sources import NotPreparedError
    from experiments.models import random_like
    source = args.assistant if assistant is True else (assistant or None)
    quantize = assistant_quantization(args)
    options = dict(pack=getattr(args, "pack", False), quantize_target=getattr(args, "quantize_target", None),
                   dtype=getattr(args, "dtype", "float32"), device=getattr(args, "device", "cpu"))
    try:
        loaded = load_pair(args.target, None if source == "random" else source,
                           quantize_assistant=None if source == "random" else quantize, **options)
    except (NotPreparedError, OSError, ValueError, RuntimeError) as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(1) from None
    print(f"models {describe_load()}", file=sys.stderr)
    if source != "random":
        return loaded
    model, tokenizer, _ = loaded
    helper = random_like(model)
    helper = QUANTIZED_COPIES[quantize](helper) if quantize else helper
    set_eos(tokenizer, model, helper)
    return model, tokenizer, helper

"""Which copy of the assistant drafts best: what a drafting step costs and how often the target takes a draft.

    python -m experiments.assistant_copies --packed-target --threads 1 --half tuning --out experiments/results/<run>

The copies of --assistant: as loaded (float32), int8 (`assisted.models.int8.int8_copy`, row-invariant: one
activation range per row; the committed runs used the earlier per-tensor copy) and int4 (`assisted.models.int4`:
Q4_K's form, groups of 32 in super-blocks of 256, on the project's 4-bit kernel; the committed runs used torch's
int4 kernel in groups of 32, 64 and 128, since deleted). Per prompt the target writes its own texts once (greedy,
and sampled at each --temperatures; written with the int4 copy's help, which is lossless), and each copy is
judged on them position by position as `experiments.policy_replay` does (`trace_of`): argmax agreement when
greedy, sum min(p, q) when sampling. A drafting step (one token through the copy after the prompt, and its
logits) is timed --repeats times per prompt, the copies' order rotating per prompt. With --draft-vocab K... each copy
also runs with a draft vocabulary of K tokens (`assisted.models.draft_vocab.restrict_vocabulary`, ids' order: the
copy named e.g. "int8/dv32768"); its acceptance is judged unconstrained, so it never uses its full head. No
end-to-end timing here: `python -m experiments.ablation --arms int8-assistant` does that, paired.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from experiments.lib.machine import run_lines  # noqa: E402
from experiments.lib.prompt_split import HALVES, SPLIT_PROMPTS, load_prompts  # noqa: E402
from experiments.lib.tasks import write_rows  # noqa: E402

COPIES = ("float32", "int8", "int4")
FIELDS = ("class", "prompt", "temperature", "copy", "positions", "acceptance", "step_seconds")


def make_copies(assistant, names: tuple[str, ...], draft_vocabs: tuple[int, ...] = (), tokenizer=None) -> dict:
    """{name: model} for the copies in `names` (see COPIES) of a float assistant, and for each size K in
    `draft_vocabs` each one again with a draft vocabulary of K tokens ("<name>/dv<K>"; float32's shares its weights)."""
    from assisted.models.draft_vocab import restrict_vocabulary
    from assisted.models.int4 import int4_copy
    from assisted.models.loading import int8_copy
    makers = {"float32": _sharing_copy, "int8": int8_copy, "int4": int4_copy}
    copies = {name: assistant if name == "float32" else makers[name](assistant) for name in names}
    for size in draft_vocabs:
        for name in names:
            copies[f"{name}/dv{size}"] = restrict_vocabulary(makers[name](assistant), size, tokenizer=tokenizer)
    return copies


def _sharing_copy(model):
    """A shallow copy of `model` whose own top-level modules can be replaced (its head) without touching `model`."""
    import copy as copying
    clone = copying.copy(model)
    clone._modules = dict(model._modules)
    return clone


@torch.inference_mode()  # as generate() runs its forwards (int8 kernels refuse autograd)
def step_seconds(model, ids: list[int], repeats: int) -> list[float]:
    """Seconds of `repeats` drafting steps of `model`: one token after the prompt `ids`, with its logits."""
    from drafting.kv_cache import crop_to, forward, new_cache
    cache = new_cache()
    forward(model, cache, ids[:-1], 1)
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        forward(model, cache, ids[-1:], 1).argmax()
        seconds.append(time.perf_counter() - start)
        crop_to(cache, len(ids) - 1)
    return seconds


@torch.inference_mode()  # as generate() runs its forwards (int8 kernels refuse autograd)
def judge(model, copies: dict, tokenizer, prompts: list[dict], temperatures: list[float], max_new_tokens: int,
          repeats: int) -> list[dict]:
    """One row per (prompt, temperature, copy): mean acceptance over the target's text, and a median step."""
    from assisted import generate
    from drafting.kv_cache import forward, new_cache
    from experiments.policy_replay import trace_of
    from experiments.lib.tasks import chat_ids
    names, rows = list(copies), []
    for i, p in enumerate(prompts):
        ids = chat_ids(tokenizer, p)
        order = names[i % len(names):] + names[: i % len(names)]
        steps = {name: statistics.median(step_seconds(copies[name], ids, repeats)) for name in order}
        for t in temperatures:
            text = list(generate(model, copies[names[-1]], tokenizer=tokenizer, input_ids=ids, do_sample=t > 0,
                                 temperature=t if t > 0 else 1.0, seed=3000, max_new_tokens=max_new_tokens).token_ids)
            target_cache = new_cache()
            forward(model, target_cache, ids[:-1], 1)
            for name in names:
                helper_cache = new_cache()
                forward(copies[name], helper_cache, ids[:-1], 1)
                acceptance, _ = trace_of(model, copies[name], (target_cache, helper_cache), ids, text, t)
                rows.append({"class": p["class"], "prompt": p["name"], "temperature": t, "copy": name,
                             "positions": len(acceptance), "acceptance": statistics.fmean(acceptance),
                             "step_seconds": steps[name]})
            print(f"{p['name']:28} T={t} " + " ".join(f"{r['copy']} {r['acceptance']:.2f}" for r in rows[-len(names):]),
                  file=sys.stderr, flush=True)
    return rows


def report(rows: list[dict]) -> list[str]:
    """Markdown: per copy, the median drafting step and the acceptance per temperature and class (position-weighted)."""
    copies = list(dict.fromkeys(r["copy"] for r in rows))
    temps = sorted({r["temperature"] for r in rows})
    classes = sorted({r["class"] for r in rows})

    def acceptance(copy, keep) -> float:
        chosen = [r for r in rows if r["copy"] == copy and keep(r)]
        return sum(r["acceptance"] * r["positions"] for r in chosen) / max(sum(r["positions"] for r in chosen), 1)

    head = ["copy", "ms per step (median)", *(f"acceptance T = {t}" for t in temps), *classes]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for c in copies:
        ms = 1e3 * statistics.median(r["step_seconds"] for r in rows if r["copy"] == c)
        cells = [f"{acceptance(c, lambda r, t=t: r['temperature'] == t):.3f}" for t in temps]
        cells += [f"{acceptance(c, lambda r, k=k: r['class'] == k):.3f}" for k in classes]
        lines.append(f"| {c} | {ms:.1f} | " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="python -m experiments.assistant_copies", description=__doc__.split("\n")[0])
    p.add_argument("--target", default="qwen2.5-coder-1.5b")
    p.add_argument("--assistant", default="qwen2.5-coder-0.5b")
    p.add_argument("--packed-target", action="store_true")
    p.add_argument("--copies", nargs="+", choices=COPIES, default=list(COPIES))
    p.add_argument("--prompts", type=Path, default=SPLIT_PROMPTS)
    p.add_argument("--half", choices=[*HALVES, "all"], default="tuning")
    p.add_argument("--per-class", type=int, default=None)
    p.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.7])
    p.add_argument("--max-new-tokens", type=int, default=40)
    p.add_argument("--repeats", type=int, default=5, help="timed drafting steps per prompt and copy")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--draft-vocab", type=int, nargs="*", default=[], help="draft vocabulary sizes")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from experiments.lib.tasks import load_pair_or_none
    loaded = load_pair_or_none(args.target, args.assistant, pack=args.packed_target, draft_vocab_size=None)
    if loaded is None:
        return 1
    model, tokenizer, assistant = loaded
    prompts = load_prompts(args.prompts, None if args.half == "all" else args.half, args.per_class)
    copies = make_copies(assistant, tuple(c for c in COPIES if c in args.copies), tuple(args.draft_vocab), tokenizer)
    with torch.inference_mode():
        rows = judge(model, copies, tokenizer, prompts, args.temperatures, args.max_new_tokens, args.repeats)
    args.out.mkdir(parents=True, exist_ok=True)
    write_rows(args.out / "results.csv", rows, FIELDS)
    lines = [f"# Copies of the assistant: {args.out.name}", "", *run_lines("experiments.assistant_copies", argv),
             f"- target {args.target}{' (packed)' if args.packed_target else ''}, assistant {args.assistant}, "
             f"{args.half} half, {len(prompts)} prompts, T {args.temperatures}, {args.max_new_tokens} new tokens", "",
             "Acceptance: the chance the target takes the copy's draft at a position of the target's own text "
             "(greedy: argmax agreement; sampled: sum min(p, q)), mean over positions. A step: one token through "
             "the copy after the prompt, with its logits.", "", *report(rows), ""]
    (args.out / "README.md").write_text("\n".join(lines))
    print("\n".join(report(rows)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""One prepared device check: cost curves, the loop's overhead, greedy identity and masks, in minutes.

    python -m experiments.gpu_check --out $OUT/gpu-check --tokenizers .gpu/tokenizers --commit <hash>
    python -m experiments.gpu_check --device cpu --smoke --out /tmp/gpu-check      # the same code, tiny models

The models are the published architectures of the project's pair (Qwen2.5-Coder 1.5B target, 0.5B assistant)
and of SmolLM2-135M with random weights (`experiments.lib.gpu_models`): weights cannot travel to a lent GPU.
Sections, each written to --out as soon as it ends (a section that fails is reported and the next one runs;
one that would start past --budget-s is skipped):
  costs     seconds of a target forward over n = 1..32 new tokens after 200 and 1,000 cached ones (bf16 and
            fp16), of one assistant token, and of SmolLM2's; `costs.csv` is a forward-cost table (model, dtype,
            context, layout, n, repeat, seconds) that `experiments.policy_replay --timings` (at ae05ac6) replays.
  generate  per-token latency of the target alone (transformers), our loop without an assistant, and with three
            assistants (the target itself: every draft accepted; its first 4 layers; the random 0.5B: none
            accepted) against transformers' assisted generation with the same models; our loop's own
            overhead per step (wall time minus the timed forwards and guide calls).
  identity  greedy outputs of self-drafting (8 drafts verified per forward) against plain decoding, in bf16 and
            fp32 and at two head scales: share token-identical, and where a text first differs, the top-2 logit
            margin there (batched verification rounds differently from one-token steps).
  masks     a JSON Schema guide over the Qwen tokenizer (152k ids): building it, first visits of its states
            against a GPU step, and a step's (k+1, V) masks stacked on the host and copied vs kept on the device.
The `graphs` section (a forward on a static cache, eager and replayed from a CUDA graph) is in git at 408e960: the
engine now replays a CUDA graph by default on a CUDA target, so `generate` times ours on it.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from assisted import generate  # noqa: E402
from drafting.kv_cache import forward, new_cache  # noqa: E402
from experiments.lib import cli  # noqa: E402
from experiments.lib.gpu_models import build, random_prompt  # noqa: E402
from experiments.lib.report import pyplot, save_figure, table, write_rows  # noqa: E402
from experiments.lib.systems import transformers_tokens  # noqa: E402
from experiments.lib.timing import Prefixed  # noqa: E402
from experiments.models import truncated  # noqa: E402

TARGET, ASSISTANT, SMOL = "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "smollm2-135m"
INVOICE = {"type": "object", "properties": {
    "customer": {"type": "string", "maxLength": 16}, "quantity": {"type": "integer", "minimum": 1, "maximum": 999},
    "status": {"enum": ["draft", "sent", "paid", "overdue"]}, "paid": {"type": "boolean"},
    "lines": {"type": "array", "maxItems": 3, "items": {"type": "object", "properties": {
        "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
        "cents": {"type": "integer", "minimum": 0, "maximum": 99999}}, "required": ["sku", "cents"]}}},
    "required": ["customer", "quantity", "status", "paid", "lines"]}


def ours(model, assistant, tokenizer, ids: list[int], new: int, schedule: str = "auto", **options):
    """`assisted.generate` on prompt `ids` with `new` tokens at most."""
    return generate(model, assistant, tokenizer=tokenizer, input_ids=ids, max_new_tokens=new,
                    num_assistant_tokens_schedule=schedule, **options)


def medians(rows: list[dict], label) -> dict:
    """{label(row): {n: median seconds}} over `rows`."""
    found = {}
    for r in rows:
        found.setdefault(label(r), {}).setdefault(r["n"], []).append(r["seconds"])
    return {key: {n: statistics.median(v) for n, v in by_n.items()} for key, by_n in found.items()}


class Check:
    """The run's settings, clock and output folder; `section` runs one part and keeps going past a failure."""

    def __init__(self, args):
        self.args, self.device, self.start = args, torch.device(args.device), time.perf_counter()
        self.out, self.summary = Path(args.out), {"sections": {}}
        self.out.mkdir(parents=True, exist_ok=True)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def timed(self, call) -> tuple[float, object]:
        self.sync()
        start = time.perf_counter()
        result = call()
        self.sync()
        return time.perf_counter() - start, result

    def section(self, name: str, run) -> None:
        elapsed = time.perf_counter() - self.start
        if elapsed > self.args.budget_s:
            self.summary["sections"][name] = f"skipped: {elapsed:.0f} s spent of the {self.args.budget_s} s budget"
        else:
            try:
                run(self)
                self.summary["sections"][name] = f"done in {time.perf_counter() - self.start - elapsed:.1f} s"
            except Exception:  # noqa: BLE001 (a device check reports every failure and goes on)
                self.summary["sections"][name] = "failed: " + traceback.format_exc(limit=3).strip().splitlines()[-1]
                traceback.print_exc()
        print(f"[{time.perf_counter() - self.start:6.1f} s] {name}: {self.summary['sections'][name]}", flush=True)

    def write_csv(self, name: str, rows: list[dict]) -> None:
        write_rows(self.out / name, rows, list(rows[0]), digits=None)

    def model(self, name: str, dtype: str = "bfloat16", head_scale: float | None = None, seed: int = 0):
        tokenizer = self.tokenizers["qwen2" if name.startswith("qwen") else "smollm2"]
        scale = self.args.head_scale if head_scale is None else head_scale
        return build(name, tokenizer, device=self.args.device, dtype=dtype, seed=seed, head_scale=scale,
                     smoke=self.args.smoke)


def cost_rows(check: Check, model, label: str, dtype: str, context: int, ns: list[int]) -> list[dict]:
    """Seconds of a forward over n new tokens after `context` cached ones, n interleaved, repeats after a warm-up."""
    tokenizer = check.tokenizers["qwen2" if label.startswith("qwen") else "smollm2"]
    ids = random_prompt(tokenizer, context + max(ns), seed=context)
    timer, rows = Prefixed(model, ids[:context], synchronize=check.sync), []
    for repeat in range(check.args.repeats + 1):
        for n in ns:
            seconds = timer.seconds(ids[context : context + n])
            if repeat:
                rows.append({"model": label, "dtype": dtype, "context": context, "layout": "dense", "n": n,
                             "repeat": repeat, "seconds": seconds})
    return rows


def section_costs(check: Check) -> None:
    ns, contexts = check.ns, check.contexts
    rows = []
    for dtype in ("bfloat16", "float16"):
        target = check.model(TARGET, dtype)
        for context in contexts:
            rows += cost_rows(check, target, TARGET, dtype, context, ns)
        del target
    for name in (ASSISTANT, SMOL):
        rows += cost_rows(check, check.model(name), name, "bfloat16", contexts[0], ns)
    check.write_csv("costs.csv", rows)
    check.summary["costs"] = medians(rows, lambda r: f"{r['model']} {r['dtype']} ctx {r['context']}")
    plot_costs(check)


def plot_costs(check: Check) -> None:
    fig, ax = pyplot().subplots(figsize=(7, 4.2))
    for label, by_n in check.summary["costs"].items():
        ns = sorted(by_n)
        ax.plot(ns, [1e3 * by_n[n] for n in ns], marker=".", label=label)
    ax.set(xlabel="tokens per forward (n)", ylabel="median ms per forward", ylim=(0, None),
           title=f"Forward cost on {check.summary['device']}")
    ax.legend(fontsize=7)
    save_figure(fig, check.out / "costs.png", dpi=120)


def hf_generate(model, ids: list[int], new: int, assistant=None) -> int:
    """transformers' greedy generate (assisted with its defaults when `assistant` is given); new tokens (EOS rows are
    zeroed: never the argmax, so every call writes `new`)."""
    kwargs = {} if assistant is None else {"assistant_model": assistant}
    return len(transformers_tokens(model, ids, [model.generation_config.eos_token_id], new, **kwargs))


def section_generate(check: Check) -> None:
    tokenizer, new = check.tokenizers["qwen2"], check.new_tokens
    target = check.model(TARGET)
    helpers = {"self": check.model(TARGET), "first-4-layers": truncated(target, 4),
               "random-0.5b": check.model(ASSISTANT, seed=1)}
    systems = {"target (transformers)": lambda ids: (hf_generate(target, ids, new), None),
               "ours, no assistant": lambda ids: (None, ours(target, None, tokenizer, ids, new))}
    for name, helper in helpers.items():
        systems[f"transformers assisted, {name}"] = lambda ids, h=helper: (hf_generate(target, ids, new, h), None)
        systems[f"ours auto, {name}"] = lambda ids, h=helper: (None, ours(target, h, tokenizer, ids, new))
    systems["ours heuristic, self"] = lambda ids: (None, ours(target, helpers["self"], tokenizer, ids, new,
                                                              "heuristic"))
    prompts = [random_prompt(tokenizer, check.contexts[0], seed=100 + r) for r in range(check.args.repeats + 1)]
    rows = []
    with torch.inference_mode():
        for repeat, ids in enumerate(prompts):  # repeat 0 warms every system up (auto learns the pair's costs)
            for system, run in systems.items():
                seconds, (hf_new, out) = check.timed(lambda: run(ids))
                if repeat:
                    rows.append(generate_row(system, repeat, seconds, hf_new, out))
    check.write_csv("generate.csv", rows)
    check.summary["generate"] = summarize_generate(rows)


def generate_row(system: str, repeat: int, seconds: float, hf_new: int | None, out) -> dict:
    row = {"system": system, "repeat": repeat, "seconds": seconds, "new_tokens": hf_new, "target_forwards": "",
           "mean_k": "", "acceptance": "", "overhead_ms_per_step": "", "fsm_ms_per_step": ""}
    if out is not None:
        s = out.stats
        drafted, accepted = s.drafted_by_source["assistant"], s.accepted_by_source["assistant"]
        steps = max(1, len(s.steps))
        row.update(new_tokens=s.new_tokens, target_forwards=s.target_forward_passes,
                   mean_k=statistics.fmean(s.k_trace) if s.k_trace else 0.0,
                   acceptance=accepted / drafted if drafted else "", fsm_ms_per_step=1e3 * s.seconds.fsm / steps,
                   overhead_ms_per_step=1e3 * s.seconds.overhead / steps)
    return row


def summarize_generate(rows: list[dict]) -> dict:
    """Per system: median ms per token, and the speedup over the target alone (ratio of medians)."""
    per_token = {}
    for r in rows:
        per_token.setdefault(r["system"], []).append(1e3 * r["seconds"] / r["new_tokens"])
    base = statistics.median(per_token["target (transformers)"])
    out = {}
    for system, values in per_token.items():
        extra = [r for r in rows if r["system"] == system and r["overhead_ms_per_step"] != ""]
        out[system] = {"ms_per_token": statistics.median(values), "speedup": base / statistics.median(values)}
        if extra:
            out[system] |= {k: statistics.median(float(r[k]) for r in extra if r[k] != "")
                            for k in ("overhead_ms_per_step", "mean_k") if any(r[k] != "" for r in extra)}
    return out


def section_identity(check: Check) -> None:
    tokenizer, new, rows = check.tokenizers["qwen2"], check.new_tokens // 2, []
    for dtype, scale in (("bfloat16", 1.0), ("bfloat16", check.args.head_scale), ("float32", 1.0)):
        target = check.model(TARGET, dtype, head_scale=scale)
        for p in range(check.args.identity_prompts):
            ids = random_prompt(tokenizer, 64, seed=500 + p)
            plain = ours(target, None, tokenizer, ids, new).token_ids
            drafted = ours(target, target, tokenizer, ids, new, "constant", num_assistant_tokens=8).token_ids
            rows.append(identity_row(target, ids, list(plain), list(drafted), dtype, scale, p))
        del target
    check.write_csv("identity.csv", rows)
    groups = {}
    for r in rows:
        groups.setdefault(f"{r['dtype']} head x{r['head_scale']}", []).append(r["identical"])
    check.summary["identity"] = {g: f"{sum(v)}/{len(v)} identical" for g, v in groups.items()}


def identity_row(model, ids: list[int], plain: list[int], drafted: list[int], dtype: str, scale: float, p: int) -> dict:
    """Whether self-drafting wrote plain decoding's tokens; where not, the reference's top-2 margin there."""
    first = next((i for i, (a, b) in enumerate(zip(plain, drafted)) if a != b), None)
    row = {"dtype": dtype, "head_scale": scale, "prompt": p, "identical": first is None and plain == drafted,
           "first_difference": "" if first is None else first, "top2_margin_there": "", "median_top2_margin": ""}
    with torch.inference_mode():
        logits = forward(model, new_cache(), ids + plain, len(plain) + 1)[:-1].float()  # (L, V): rows for `plain`
    top2 = logits.topk(2, dim=-1).values
    margins = (top2[:, 0] - top2[:, 1]).tolist()
    row["median_top2_margin"] = statistics.median(margins)
    if first is not None:
        row["top2_margin_there"] = margins[first]
    return row


def section_masks(check: Check) -> None:
    import fsm
    tokenizer = check.tokenizers["qwen2"]
    target = check.model(TARGET)
    build_s, guide = check.timed(lambda: fsm.Guide.from_schema(INVOICE, tokenizer, vocab_size=len(tokenizer)))
    text = '{"customer":"ACME","quantity":12,"status":"paid","paid":true,"lines":[{"sku":"ABC-1234","cents":950}]}'
    first, again = [], []
    for token in tokenizer(text, add_special_tokens=False).input_ids:
        first.append(check.timed(guide.mask)[0])
        again.append(check.timed(guide.mask)[0])
        guide.advance(token)
    step_s = statistics.median(check.timed(lambda: forward(target, new_cache(), [1], 1))[0] for _ in range(5))
    rows = [{"what": "guide build (vocabulary + index + first state)", "ms": 1e3 * build_s},
            {"what": "first visit of a state, median", "ms": 1e3 * statistics.median(first)},
            {"what": "first visit of a state, max", "ms": 1e3 * max(first)},
            {"what": "revisit (cached), median", "ms": 1e3 * statistics.median(again)},
            {"what": "target one-token step, median", "ms": 1e3 * step_s},
            *mask_transfer_rows(check, guide, len(tokenizer))]
    rows += constrained_rows(check, target, tokenizer)
    check.write_csv("masks.csv", rows)
    check.summary["masks"] = {r["what"]: round(r["ms"], 3) for r in rows}
    check.summary["cuda_peak_gib"] = torch.cuda.max_memory_allocated() / 2**30 if check.device.type == "cuda" else None


def mask_transfer_rows(check: Check, guide, vocab: int, k: int = 8) -> list[dict]:
    """A step's (k+1, V) masks: stacked on the host and copied (before) vs stacked from device copies (now)."""
    host = [guide.mask().clone() for _ in range(k + 1)]
    device = [m.to(check.device) for m in host]
    logits = torch.randn(k + 1, vocab, device=check.device)
    rounds = 50
    copy = [check.timed(lambda: logits.masked_fill(~torch.stack(host).to(check.device), 0))[0] for _ in range(rounds)]
    kept = [check.timed(lambda: logits.masked_fill(~torch.stack(device), 0))[0] for _ in range(rounds)]
    return [{"what": f"mask {k + 1}x{vocab} stacked on host, copied, applied", "ms": 1e3 * statistics.median(copy)},
            {"what": f"mask {k + 1}x{vocab} stacked on device, applied", "ms": 1e3 * statistics.median(kept)}]


def constrained_rows(check: Check, target, tokenizer) -> list[dict]:
    """Ms per token of constrained decoding: plain (no assistant, forced tokens verified) vs self-drafting + forced."""
    rows = []
    ids = random_prompt(tokenizer, check.contexts[0], seed=7)
    for label, assistant, coalesce in (("plain constrained", None, False), ("self-drafting + coalesced", target, True)):
        for _ in range(2):  # the first run visits the states; the second is timed
            seconds, out = check.timed(lambda: ours(target, assistant, tokenizer, ids, 4 * check.new_tokens,
                                                    schema=INVOICE, coalesce=coalesce))
        valid = out.value is not None
        rows.append({"what": f"constrained generate, {label}: ms per token ({out.stats.new_tokens} tokens, "
                             f"{out.stats.target_forward_passes} target forwards, valid={valid})",
                     "ms": 1e3 * seconds / out.stats.new_tokens})
    return rows


def environment(args) -> dict:
    import transformers
    device = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else f"CPU ({platform.processor()})"
    return {"device": device, "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(), "date": str(datetime.date.today()), "commit": args.commit,
            "command": "python -m experiments.gpu_check " + " ".join(sys.argv[1:]), "smoke": args.smoke}


def write_readme(check: Check) -> None:
    s = check.summary
    lines = [f"# GPU check on {s['device']}", "", *(f"- {k}: `{s[k]}`" for k in
             ("command", "date", "commit", "torch", "transformers", "python", "smoke")), "",
             "Random-weight models with the published architectures (see `experiments.gpu_check`).", "",
             "## Sections", *(f"- {k}: {v}" for k, v in s["sections"].items()), ""]
    if "costs" in s:
        ns = [n for n in (1, 2, 4, 8, 16, 32) if n in next(iter(s["costs"].values()))]
        lines += ["## Forward cost (median ms) by tokens per forward", "",
                  *table(["model, dtype, context", *(f"n={n}" for n in ns)],
                         [[label, *(f"{1e3 * by_n[n]:.2f}" for n in ns)] for label, by_n in s["costs"].items()]),
                  "", "![costs](costs.png)", ""]
    if "generate" in s:
        lines += ["## Greedy generation, target Qwen2.5-Coder-1.5B architecture (bf16)", "",
                  *table(["system", "ms per token", "x target", "mean k", "loop overhead ms/step"],
                         [[name, f"{g['ms_per_token']:.2f}", f"{g['speedup']:.2f}", _fmt(g.get("mean_k")),
                           _fmt(g.get("overhead_ms_per_step"))] for name, g in s["generate"].items()]), ""]
    if "identity" in s:
        lines += ["## Greedy identity, self-drafting (8 drafts per forward) vs plain decoding", "",
                  *(f"- {k}: {v}" for k, v in s["identity"].items()), ""]
    if "masks" in s:
        lines += ["## Masks over the Qwen tokenizer", "", *table(["what", "ms"], list(s["masks"].items())), ""]
    (check.out / "README.md").write_text("\n".join(lines))
    (check.out / "summary.json").write_text(json.dumps(s, indent=1, default=str))


def _fmt(value) -> str:
    return "" if value is None else f"{value:.2f}"


def load_tokenizers(folder: Path | None, smoke: bool) -> dict:
    """{"qwen2": ..., "smollm2": ...} from `folder`/<name>; SmolLM2's from the library's cache when absent."""
    from transformers import AutoTokenizer
    found = {n: AutoTokenizer.from_pretrained(folder / n) for n in ("qwen2", "smollm2")
             if folder is not None and (folder / n).is_dir()}
    if "smollm2" not in found:
        from experiments.models import load_tokenizer
        found["smollm2"] = load_tokenizer(SMOL)
    if "qwen2" not in found:
        if not smoke:
            raise SystemExit(f"error: no qwen2 tokenizer folder under --tokenizers {folder} (needed without --smoke)")
        found["qwen2"] = found["smollm2"]
    return found


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = cli.parser("gpu_check", __doc__)
    p.add_argument("--device", default="cuda")
    p.add_argument("--smoke", action="store_true", help="tiny models, few sizes: the same code in seconds")
    cli.add_out(p)
    p.add_argument("--tokenizers", type=Path, default=None, help="folder holding qwen2/ and smollm2/ tokenizer folders")
    p.add_argument("--commit", default="unknown", help="the code's commit (the device has no git history)")
    p.add_argument("--repeats", type=int, default=None, help="timed rounds (default 3; 1 with --smoke)")
    p.add_argument("--head-scale", type=float, default=6.0, help="output head multiplier: a trained model's peaks")
    p.add_argument("--identity-prompts", type=int, default=None, help="prompts per setting (default 4; 2 with --smoke)")
    p.add_argument("--budget-s", type=float, default=420.0, help="no section starts after this many seconds")
    p.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=list(SECTIONS))
    return p.parse_args(argv)


SECTIONS = {"costs": section_costs, "generate": section_generate, "identity": section_identity,
            "masks": section_masks}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("error: --device cuda but torch sees no GPU (use --device cpu --smoke)", file=sys.stderr)
        return 2
    args.repeats = args.repeats or (1 if args.smoke else 3)
    args.identity_prompts = args.identity_prompts or (2 if args.smoke else 4)
    check = Check(args)
    check.tokenizers = load_tokenizers(args.tokenizers, args.smoke)
    check.ns = [1, 2, 4] if args.smoke else list(range(1, 33))
    check.contexts = [16, 32] if args.smoke else [200, 1000]
    check.new_tokens = 6 if args.smoke else 64
    check.summary |= environment(args)
    with contextlib.suppress(Exception):
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 identity is about fp32, not tf32
    for name in args.sections:
        check.section(name, SECTIONS[name])
        write_readme(check)
    print((check.out / "README.md").read_text())
    return 0 if not any(v.startswith("failed") for v in check.summary["sections"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())

"""Device-check sections for captured steps (static KV caches + CUDA graphs); `experiments.gpu_check` runs them.

  extraction  the invoice extraction (schema `INVOICE`) on the 1.5B target, interleaved per prompt:
              transformers `generate` + XGrammar's processor (compact JSON, as ours writes) on its eager dynamic
              cache and on its static cache + torch.compile, plain eager transformers without a schema, and ours on
              eager dynamic caches and on captured static caches (the default on CUDA): without an assistant, with
              the random 0.5B, and with a copy of the target (every draft accepted).
  steps       what one forward over n new tokens costs after 200 cached ones: the bare replay of a captured graph,
              our captured step (`StaticKV.run`: ids in, padding, replay, logits out) and an eager forward on a
              dynamic cache, for the 1.5B and 7B targets and the 0.5B assistant. `steps.csv` is a cost table
              `experiments.policy_replay --timings ... --layout captured` (at ae05ac6) replays (the recorded CPU
              acceptance of the real pair then gives speedups at these costs).
  captured_identity  greedy tokens of static eager and captured steps against dynamic eager ones, float32 and
              bf16 (bf16 rounds batched rows differently by design: reported, not required).
"""

from __future__ import annotations

import json
import statistics

import torch

from assisted import generate
from drafting.kv_cache import crop_to, forward, new_cache
from drafting.static_cache import BUCKETS, StaticKV, cuda_capture
from experiments.lib.gpu_models import random_prompt
from experiments.lib.report import table

TARGET, ASSISTANT, LARGE = "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "qwen2.5-7b"
BASELINE = "transformers + XGrammar (eager)"
INVOICE = {
    "type": "object",
    "properties": {
        "customer": {"type": "string", "maxLength": 16},
        "quantity": {"type": "integer", "minimum": 1, "maximum": 999},
        "status": {"enum": ["draft", "sent", "paid", "overdue"]},
        "paid": {"type": "boolean"},
        "lines": {
            "type": "array",
            "maxItems": 3,
            "items": {
                "type": "object",
                "properties": {
                    "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
                    "cents": {"type": "integer", "minimum": 0, "maximum": 99999},
                },
                "required": ["sku", "cents"],
            },
        },
    },
    "required": ["customer", "quantity", "status", "paid", "lines"],
}


def ours(model, assistant, tokenizer, ids: list[int], new: int, schedule: str = "auto", **options):
    return generate(model, assistant, tokenizer=tokenizer, input_ids=ids, max_new_tokens=new,
                    num_assistant_tokens_schedule=schedule, **options)


# ---- extraction ---------------------------------------------------------------------------------------------

class XGrammar:
    """XGrammar's transformers processor for one schema, compiled once; a fresh processor per call."""

    def __init__(self, tokenizer, vocab: int, eos: int, schema: dict):
        import xgrammar
        info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab, stop_token_ids=[eos])
        self.grammar = xgrammar.GrammarCompiler(info).compile_json_schema(
            json.dumps(schema), any_whitespace=False, separators=(",", ":"))
        self.processor_class = xgrammar.contrib.hf.LogitsProcessor

    def __call__(self):
        return self.processor_class(self.grammar)


def hf_call(model, tokenizer, ids: list[int], new: int, processor=None, static: bool = False) -> tuple[str, int]:
    """transformers' greedy `generate` (on CUDA its static cache compiles the step); (text, new tokens with EOS)."""
    kwargs = ({"logits_processor": [processor()]} if processor else {}) | (
        {"cache_implementation": "static"} if static else {})
    out = model.generate(torch.tensor([ids], device=model.device), do_sample=False, max_new_tokens=new, **kwargs)
    emitted = out[0, len(ids):].tolist()
    stop = next((i for i, t in enumerate(emitted) if t == tokenizer.eos_token_id), None)
    return tokenizer.decode(emitted[:stop], skip_special_tokens=True), len(emitted) if stop is None else stop + 1


def extraction_systems(check, target, helpers: dict, schema: dict, new: int) -> dict:
    """name -> call(ids) returning (text, new tokens, stats or None)."""
    tokenizer = check.tokenizers["qwen2"]
    systems = {"transformers, no schema (eager)": lambda ids: (*hf_call(target, tokenizer, ids, new), None)}
    try:
        xgr = XGrammar(tokenizer, target.get_output_embeddings().weight.shape[0], tokenizer.eos_token_id, schema)
        systems[BASELINE] = lambda ids: (*hf_call(target, tokenizer, ids, new, xgr), None)
        systems["transformers static cache + compile + XGrammar"] = \
            lambda ids: (*hf_call(target, tokenizer, ids, new, xgr, static=True), None)
    except ImportError:
        check.summary["extraction_note"] = "xgrammar not importable: its systems were not run"
    for label, helper in {"": None, **helpers}.items():
        for engine, cache in (("eager", "dynamic"), ("captured", None)):
            name = f"ours {engine}" + (f" + {label}" if label else "")
            systems[name] = lambda ids, h=helper, c=cache: _ours_call(ours(target, h, tokenizer, ids, new,
                                                                           schema=schema, cache_implementation=c))
    return systems


def _ours_call(out) -> tuple[str, int, object]:
    return out.text, out.stats.new_tokens, out.stats


def section_extraction(check) -> None:
    tokenizer, new = check.tokenizers["qwen2"], 4 * check.new_tokens
    target = check.model(TARGET)
    helpers = {"random-0.5b": check.model(ASSISTANT, seed=1), "self": check.model(TARGET)}
    systems = extraction_systems(check, target, helpers, INVOICE, new)
    prompts = [random_prompt(tokenizer, check.contexts[0], seed=300 + r) for r in range(check.args.repeats + 1)]
    rows, failed = [], {}
    with torch.inference_mode():
        for repeat, ids in enumerate(prompts):  # repeat 0 warms every system up: compiles, captures, auto's costs
            for name, call in systems.items():
                if name in failed:
                    continue
                try:
                    seconds, (text, tokens, stats) = check.timed(lambda: call(ids))
                except Exception as error:  # noqa: BLE001 (one system failing must not stop the others)
                    failed[name] = f"{type(error).__name__}: {str(error)[:300]}"
                    continue
                rows.append(extraction_row(name, repeat, seconds, text, tokens, stats, INVOICE))
    check.write_csv("extraction.csv", rows)
    check.summary["extraction"] = summarize_extraction([r for r in rows if r["repeat"] > 0])
    check.summary["extraction_failed"] = failed


def extraction_row(name: str, repeat: int, seconds: float, text: str, tokens: int, stats, schema: dict) -> dict:
    import jsonschema
    try:
        valid = jsonschema.Draft202012Validator(schema).is_valid(json.loads(text))
    except ValueError:
        valid = False
    row = {"system": name, "repeat": repeat, "seconds": seconds, "new_tokens": tokens, "valid": valid,
           "target_forwards": "", "assistant_forwards": "", "ms_per_target_forward": "",
           "ms_per_assistant_forward": "", "capture_s": "", "cache": "", "text": text}
    if stats is not None:
        s = stats
        row.update(target_forwards=s.target_forward_passes, assistant_forwards=s.assistant_forward_passes,
                   ms_per_target_forward=1e3 * s.seconds.target / max(1, s.target_forward_passes),
                   ms_per_assistant_forward=(1e3 * s.seconds.assistant / s.assistant_forward_passes
                                             if s.assistant_forward_passes else ""),
                   capture_s=s.seconds.capture, cache=s.cache)
    return row


def summarize_extraction(rows: list[dict]) -> dict:
    """Per system: median seconds per call and per token, validity, and the per-prompt speedup over the baseline
    (median and range of the paired ratios)."""
    base = {r["repeat"]: r["seconds"] for r in rows if r["system"] == BASELINE}
    out = {}
    for name in dict.fromkeys(r["system"] for r in rows):
        mine = [r for r in rows if r["system"] == name]
        ratios = [base[r["repeat"]] / r["seconds"] for r in mine if r["repeat"] in base]
        out[name] = {"s_per_call": statistics.median(r["seconds"] for r in mine),
                     "ms_per_token": statistics.median(1e3 * r["seconds"] / max(1, r["new_tokens"]) for r in mine),
                     "tokens": statistics.median(r["new_tokens"] for r in mine),
                     "valid": f"{sum(r['valid'] for r in mine)}/{len(mine)}"}
        if ratios:
            out[name] |= {"x_baseline": statistics.median(ratios), "x_range": (min(ratios), max(ratios))}
        forwards = [r for r in mine if r["target_forwards"] != ""]
        if forwards:
            out[name] |= {"target_forwards": statistics.median(r["target_forwards"] for r in forwards),
                          "ms_per_target_forward": statistics.median(r["ms_per_target_forward"] for r in forwards)}
    return out


# ---- steps --------------------------------------------------------------------------------------------------

def section_steps(check) -> None:
    ns = [1, 2, 3] if check.args.smoke else [1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32]
    rows = []
    for name in (TARGET, ASSISTANT, LARGE):
        model = check.model(name)
        rows += step_rows(check, model, name, check.contexts[0], ns)
        del model
        if check.device.type == "cuda":
            torch.cuda.empty_cache()
    check.write_csv("steps.csv", rows)
    medians = {}
    for r in rows:
        medians.setdefault(f"{r['model']} {r['layout']}", {}).setdefault(r["n"], []).append(r["seconds"])
    check.summary["steps"] = {k: {n: statistics.median(v) for n, v in by_n.items()} for k, by_n in medians.items()}


def step_rows(check, model, name: str, context: int, ns: list[int]) -> list[dict]:
    """Seconds of a forward over n new tokens after `context` cached ones: bare replay, our captured step, eager."""
    tokenizer = check.tokenizers["qwen2"]
    ids = random_prompt(tokenizer, context + max(ns), seed=context)
    capture = cuda_capture if check.device.type == "cuda" else (lambda step: step)
    kv, cache = StaticKV(model, context + max(BUCKETS) + 8, capture), new_cache()
    rows = []
    with torch.inference_mode():
        kv.run(ids[:context], 1)
        forward(model, cache, ids[:context], 1)
        kv.capture_all()
        for repeat in range(2 * check.args.repeats + 2):  # repeat 0 warms up
            for n in ns:
                timings = {"captured": check.timed(lambda: _captured(kv, context, ids[context: context + n]))[0],
                           "bare replay": check.timed(lambda: _bare(kv, context, n))[0],
                           "eager": check.timed(lambda: forward(model, cache, ids[context: context + n], 1))[0]}
                crop_to(cache, context)
                if repeat:
                    rows += [
                        {
                            "model": name,
                            "dtype": str(kv.dtype).removeprefix("torch."),
                            "context": context,
                            "layout": layout,
                            "n": n,
                            "repeat": repeat,
                            "seconds": s,
                        }
                        for layout, s in timings.items()
                    ]
    return rows


def _captured(kv: StaticKV, context: int, ids: list[int]):
    kv.crop(context)
    return kv.run(ids, 1)


def _bare(kv: StaticKV, context: int, n: int):
    """The captured graph of n's bucket replayed alone (no ids copied in, no logits copied out)."""
    kv.start.fill_(context)
    return kv.steps[next(b for b in BUCKETS if b >= n)][1]()


# ---- captured identity --------------------------------------------------------------------------------------

def section_captured_identity(check) -> None:
    tokenizer, new, rows = check.tokenizers["qwen2"], check.new_tokens // 2, []
    for dtype in ("float32", "bfloat16"):
        target = check.model(TARGET, dtype)
        helper = check.model(TARGET, dtype)
        for p in range(check.args.identity_prompts):
            ids = random_prompt(tokenizer, 64, seed=700 + p)
            for setting, options in (("plain", {}), ("schema", {"schema": INVOICE}),
                                     ("self k=8", {"assistant": helper}),
                                     ("schema + self k=8", {"schema": INVOICE, "assistant": helper})):
                options = dict(options)
                assistant = options.pop("assistant", None)
                extra = {"schedule": "constant", "num_assistant_tokens": 8} if assistant is not None else {}
                runs = _engines(target, assistant, tokenizer, ids, new, {**options, **extra},
                                check.device.type == "cuda")
                rows.append({"dtype": dtype, "setting": setting, "prompt": p, "tokens": len(runs["dynamic"]),
                             **{f"{e} identical": runs[e] == runs["dynamic"] for e in runs if e != "dynamic"}})
        del target, helper
    check.write_csv("captured_identity.csv", rows)
    groups = {}
    for r in rows:
        for key in (k for k in r if k.endswith("identical")):
            groups.setdefault(f"{r['dtype']} {key.removesuffix(' identical')}", []).append(r[key])
    check.summary["captured_identity"] = {g: f"{sum(v)}/{len(v)} identical to dynamic eager" for g, v in groups.items()}


def _engines(target, assistant, tokenizer, ids, new, options, cuda: bool) -> dict:
    """Token ids of one call on each engine: dynamic eager, static eager, and (on CUDA) static captured."""
    engines = {"dynamic": dict(cache_implementation="dynamic"),
               "static": dict(cache_implementation="static", cuda_graphs=False)}
    if cuda:
        engines["static+graphs"] = dict(cache_implementation="static", cuda_graphs=True)
    return {e: ours(target, assistant, tokenizer, ids, new, **kw, **options).token_ids for e, kw in engines.items()}


# ---- report -------------------------------------------------------------------------------------------------

def readme_lines(s: dict) -> list[str]:
    """The README's tables for these sections (those that ran)."""
    lines = []
    if "extraction" in s:
        ratio = lambda g: (f"{g['x_baseline']:.2f} ({g['x_range'][0]:.2f}-{g['x_range'][1]:.2f})"  # noqa: E731
                           if "x_baseline" in g else "")
        lines += ["## Structured extraction (invoice schema), target Qwen2.5-Coder-1.5B architecture (bf16)", "",
                  *table(["system", "s per call", "ms per token", "tokens", "valid",
                          "x transformers + XGrammar (range)", "target forwards", "ms per target forward"],
                         [[name, f"{g['s_per_call']:.3f}", f"{g['ms_per_token']:.2f}", f"{g['tokens']:.0f}", g["valid"],
                           ratio(g), g.get("target_forwards", ""), _ms(g.get("ms_per_target_forward"))]
                          for name, g in s["extraction"].items()])]
        lines += [f"- {k}: {v}" for k, v in (s.get("extraction_failed") or {}).items()]
        lines += [f"- {s['extraction_note']}"] if "extraction_note" in s else []
        lines.append("")
    if "steps" in s:
        ns = sorted({int(n) for by_n in s["steps"].values() for n in by_n})
        steps = {label: {int(n): v for n, v in by_n.items()} for label, by_n in s["steps"].items()}
        lines += ["## One forward over n new tokens after 200 cached (median ms)", "",
                  *table(["model, layout", *(f"n={n}" for n in ns)],
                         [[label, *(_ms(1e3 * by_n[n]) if n in by_n else "" for n in ns)]
                          for label, by_n in steps.items()]), ""]
    if "captured_identity" in s:
        lines += ["## Greedy identity of static and captured steps against dynamic eager ones", "",
                  *(f"- {k}: {v}" for k, v in s["captured_identity"].items()), ""]
    return lines


def _ms(seconds_or_ms) -> str:
    return "" if seconds_or_ms in (None, "") else f"{seconds_or_ms:.2f}"

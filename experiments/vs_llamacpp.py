"""Ours on row-invariant quantized targets (int4, int8) against llama.cpp on the same GGUF files, on a CPU.

Systems (greedy, same models, same run; every unit runs each system in an order rotated per unit), ours once per
target of --quantize-target (T: int4 keeps the GGUF's own 4-bit groups, the rest int8; int8 every Linear):
  free prompts (prose, code, extraction: the validation half of experiments/prompts/split.json), s per token
    llama.cpp                  llama-cpp-python's plain greedy decoding of the target GGUF
    ours-plain-T               `assisted.generate` over the T target, no assistant (plain decoding)
    ours-spec-T                the same with the assistant's drafts (plain speculative decoding, `auto`)
  extraction tasks (`experiments.lib.tasks.HELD_OUT`, held out), s per object, every object validated
    llama.cpp-grammar          llama.cpp with its JSON-schema grammar (`json_schema_to_gbnf`: whitespace allowed)
    llama.cpp-grammar-compact  the same grammar with its whitespace rule emptied (compact JSON, as ours writes)
    ours-full-T                `assisted.generate`: T target, assistant, schema, defaults (forced tokens, lookup)
--int4-path P adds ours on the int4 target with its 4-bit linears forced to path P (systems ours-*-int4@P; e.g. vnni
beside the default amx on a CPU with AMX tiles: the same model bit for bit, another kernel).
Every unit runs at each of --threads (torch's threads; one llama.cpp context per count). `--costs` adds the
forward costs behind the ratios: one forward of k new tokens after 200 cached ones, ours and llama.cpp's, and for ours
the one-row step (k = 1) over its floor: the weight bytes a step reads / a read loop's bandwidth at that thread count,
and where that step's time goes (a profile).
`--quality` adds the quality note per target: its greedy tokens against the float32 model's (top-1 agreement,
teacher-forced on the float model's own outputs for the held-out free prompts), and ours-full's objects field by
field with the float32 target.

    pip install llama-cpp-python==0.3.36   # builds llama.cpp from source (about 9 minutes); never in CI
    # on a VM that lists AMX but does not enable it (SIGILL at the first eval), build without it:
    # CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AVX_VNNI=ON
    #   -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF" pip install --force-reinstall --no-deps llama-cpp-python==0.3.36
    python -m experiments.vs_llamacpp --quantize-target int4 int8 --threads 1 2 --repeats 3 --costs --quality \\
        --out experiments/results/...
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import time

import torch

from assisted import generate
from assisted.models.int4_models import linear_kernels
from assisted.models.loading import QUANTIZED_COPIES, load_model, load_pair
from assisted.models.sources import gguf_file
from experiments.lib import cli, runner
from experiments.lib.llamacpp import LlamaCpp
from experiments.lib.report import run_lines, table as table_of, write_run
from experiments.lib.tasks import HELD_OUT as TASKS, chat_ids, load_prompts, validate
from experiments.lib.timing import Prefixed
from structspec_ops import int4

TARGETS = ("int4", "int8")  # --quantize-target's choices
FIELDS = ("threads", "kind", "unit", "repeat", "system", "seconds", "new_tokens", "valid", "text")
COST_KS = (1, 2, 4, 8, 16, 128)
LLAMA = "llama.cpp target (its GGUF)"


def parse_args(argv: list[str] | None):
    p = cli.parser("vs_llamacpp", __doc__)
    p.add_argument("--target", default="qwen2.5-coder-1.5b")
    p.add_argument("--assistant", default="qwen2.5-coder-0.5b")
    p.add_argument("--quantize-target", nargs="+", choices=TARGETS, default=list(TARGETS),
                   help="our targets, each a system of its own in the same run")
    p.add_argument("--assistant-copy", choices=sorted(QUANTIZED_COPIES), default="int4",
                   help="the quantized copy of the assistant that drafts")
    p.add_argument("--int4-path", nargs="*", default=[], choices=sorted(int4.PATHS),
                   help="also run the int4 target with its 4-bit linears on these kernel paths (int4@PATH)")
    p.add_argument("--threads", type=int, nargs="+", default=[1])
    p.add_argument("--per-class", type=int, default=2, help="free prompts per class (validation half)")
    p.add_argument("--max-new-tokens", type=int, default=160, help="budget of an extraction (per object)")
    p.add_argument("--free-max-new-tokens", type=int, default=64, help="budget of a free prompt (per token)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--costs", action="store_true", help="also time single forwards of k new tokens")
    p.add_argument("--quality", action="store_true", help="also compare each target with float32")
    cli.add_out(p)
    return p.parse_args(argv)


def systems(kind: str, targets) -> tuple[str, ...]:
    """The systems a unit of `kind` runs: llama.cpp's, then ours on each target."""
    if kind == "free":
        return ("llama.cpp", *(f"ours-{mode}-{t}" for t in targets for mode in ("plain", "spec")))
    return ("llama.cpp-grammar", "llama.cpp-grammar-compact", *(f"ours-full-{t}" for t in targets))


class Ours:
    """Our generation on each target (plain, speculative, or with the schema: the system's name says)."""

    def __init__(self, models: dict, tokenizer, assistant, max_new: int, free_max_new: int):
        self.models, self.tokenizer, self.assistant = models, tokenizer, assistant  # models: target -> model
        self.max_new, self.free_max_new = max_new, free_max_new
        self.eos = set(next(iter(models.values())).generation_config.eos_token_id)

    def budget(self, schema) -> int:
        return self.free_max_new if schema is None else self.max_new

    def run(self, system: str, ids: list[int], schema=None) -> tuple[str, int]:
        _, mode, target = system.split("-")  # ours-plain-int4, ours-full-int4@vnni
        helper = None if mode == "plain" else self.assistant
        with kernel_path(target):
            out = generate(self.models[target], helper, tokenizer=self.tokenizer, input_ids=ids, schema=schema,
                           max_new_tokens=self.budget(schema))
        tokens = out.token_ids[:-1] if out.token_ids and out.token_ids[-1] in self.eos else out.token_ids
        return out.text, len(tokens)  # EOS not counted (llama.cpp's count leaves it out too)


def kernel_path(target: str):
    """The int4 kernel path a target's name forces ("int4@vnni": vnni; the assistant's too), else no change."""
    path = target.partition("@")[2].split(" ")[0]  # "int4@vnni", "ours int4@vnni target"
    return int4.forced_path(path) if path else contextlib.nullcontext()


def kernel_names(target: str, model) -> str:
    with kernel_path(target):
        return linear_kernels(model)


def units(tokenizer, per_class: int) -> list[tuple[str, str, list[int], object]]:
    """(kind, name, prompt ids, schema or None): free prompts, then the extraction tasks."""
    free = [p for p in load_prompts(half="validation") if p["class"] in ("prose", "code", "extraction")]
    kept = [p for c in ("prose", "code", "extraction") for p in [q for q in free if q["class"] == c][:per_class]]
    rows = [("free", f"{p['class']}/{p['name']}", chat_ids(tokenizer, p), None) for p in kept]
    return rows + [("structured", t.name, chat_ids(tokenizer, {"prompt": t.user}), t) for t in TASKS]


def run_system(system: str, threads: int, ours: Ours, llama: LlamaCpp, ids: list[int], task) -> dict:
    torch.set_num_threads(threads)
    start = time.perf_counter()
    if system.startswith("llama.cpp"):
        schema = task.json_schema() if task is not None else None
        text, tokens = llama.complete(threads, ids, ours.budget(schema), schema, compact=system.endswith("compact"))
    else:
        text, tokens = ours.run(system, ids, task.schema if task is not None else None)
    seconds = time.perf_counter() - start
    valid = "" if task is None else validate(task, text)
    return {"seconds": seconds, "new_tokens": tokens, "valid": valid, "text": text}


def measure(ours: Ours, llama: LlamaCpp, all_units, threads, repeats: int) -> list[dict]:
    for kind, name, ids, task in all_units[:1] + all_units[-1:]:  # untimed: grammars, indexes, allocators warm
        for system in systems(kind, ours.models):
            run_system(system, threads[0], ours, llama, ids, task)
    def call(unit, system, repeat):
        t, (kind, name, ids, task) = unit
        return {"threads": t, "kind": kind, "unit": name, **run_system(system, t, ours, llama, ids, task)}
    rows = runner.run([(t, u) for t in threads for u in all_units], lambda unit: systems(unit[1][0], ours.models),
                      call, repeats, log=lambda r: f"t={r['threads']} {r['unit']:34} {r['system']:26} "
                                                   f"{r['seconds']:7.2f} s {r['new_tokens']:4d} tok valid={r['valid']}")
    return [{k: r[k] for k in FIELDS if k in r} for r in rows]


def _per(row: dict) -> float:
    """Seconds per token for free prompts, per object for extraction tasks."""
    return row["seconds"] / max(row["new_tokens"], 1) if row["kind"] == "free" else row["seconds"]


def table(rows: list[dict], kind: str, ours: str, targets) -> list[str]:
    """Per thread count and system: median ms per token (free) or s per object (structured), validity, and `ours`'
    speedup over the system paired per (unit, repeat) with a 90% interval."""
    unit = "ms / token" if kind == "free" else "s / object"
    lines = [f"| threads | system | median {unit} | tokens | valid | {ours} faster by [90% CI] |", "|---" * 6 + "|"]
    for t in sorted({r["threads"] for r in rows}):
        mine = [r for r in rows if r["kind"] == kind and r["threads"] == t]
        ratios = runner.paired(mine, ours, ("unit", "repeat"), _per)
        for system in [s for s in systems(kind, targets) if any(r["system"] == s for r in mine)]:
            runs = [r for r in mine if r["system"] == system]
            scale, ratio = 1e3 if kind == "free" else 1.0, ratios.get(system, (1.0, 1.0, 1.0))
            valid = "" if kind == "free" else f"{sum(r['valid'] is True for r in runs)}/{len(runs)}"
            lines.append(f"| {t} | {system} | {scale * statistics.median(_per(r) for r in runs):.1f} | "
                         f"{statistics.median(r['new_tokens'] for r in runs):.0f} | {valid} | {runner.span(ratio)} |")
    return lines


def read_bandwidth(threads: int, gib: float = 1.0, repeats: int = 5) -> float:
    """Bytes per second of the best of `repeats` full reads (a sum) of a `gib` GiB float32 buffer at `threads`."""
    torch.set_num_threads(threads)
    buffer = torch.ones(int(gib * 2**30) // 4)  # float32
    buffer.sum()  # touch every page
    return buffer.numel() * 4 / min(runner.timed(buffer.sum)[0] for _ in range(repeats))


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes one decode step reads of `model`'s Linear weights (packed 4-bit and 6-bit, int8, float)."""
    from assisted.models.int8 import Int8Linear
    from assisted.models.packed_linear import PackedLinear
    total = 0
    for module in model.modules():
        if isinstance(module, PackedLinear):
            total += module.packed.numel()
        elif isinstance(module, Int8Linear):
            total += module.in_features * module.out_features + 4 * module.out_features
        elif isinstance(module, torch.nn.Linear):
            total += module.weight.numel() * module.weight.element_size()
    return total


def costs(models: dict, llama: LlamaCpp, threads, repeats: int = 5) -> list[str]:
    """ms of one forward over k new tokens after 200 cached ones (our targets, the assistant copies, llama.cpp) and,
    for ours, the weight bytes a step reads and the one-row step over its floor at each thread count."""
    ids = list(range(1000, 1200 + max(COST_KS)))
    timers = {name: Prefixed(m, ids[:200]) for name, m in models.items()}
    floors = {t: read_bandwidth(t) for t in threads}  # bytes per second of the read loop
    weights = {name: weight_bytes(m) for name, m in models.items()}
    times: dict = {}
    for repeat in range(repeats + 1):  # repeat 0 warms up
        for t in threads:
            torch.set_num_threads(t)
            for name, timer in timers.items():  # untimed: else the first model's k = 1 pays the switch (+20-35 ms)
                with kernel_path(name):
                    timer.seconds(ids[200:201])
            for k in COST_KS:
                spent = {}
                for name, timer in timers.items():
                    with kernel_path(name):
                        spent[name] = timer.seconds(ids[200 : 200 + k])
                spent[LLAMA] = llama.forward_cost(t, ids, k)
                for name, seconds in spent.items():
                    times.setdefault((t, name, k), []).append(seconds) if repeat else None
    rows, shares = [], []
    for t in threads:
        for name in [*models, LLAMA]:
            step, mb = statistics.median(times[(t, name, 1)]), weights.get(name, 0) / 1e6
            rows.append([t, name, *(f"{1e3 * statistics.median(times[(t, name, k)]):.1f}" for k in COST_KS),
                         f"{mb:.0f}" if mb else "", f"{step * floors[t] / weights[name]:.2f}" if mb else ""])
        torch.set_num_threads(t)
        for name, timer in timers.items():
            with kernel_path(name):
                shares += [[t, name, *op] for op in step_profile(timer, ids[200])]
    return [*table_of(["threads", "model", *(f"k={k}" for k in COST_KS), "weight MB", "k=1 / floor"], rows), "",
            "floor: the weight bytes a step reads / a read loop's bandwidth ("
            + ", ".join(f"{floors[t] / 1e9:.1f} GB/s at {t} thread(s)" for t in threads) + ")", "",
            "Where our one-row step goes (torch.profiler over 10 steps, the top ops by own time; the profiler "
            "inflates small ops, so read the shares):", "",
            *table_of(["threads", "model", "op", "calls a step", "share"], shares)]


def step_profile(timer: Prefixed, token: int, steps: int = 10, top: int = 5) -> list[list]:
    """The `top` ops of `steps` one-row steps by own time: (op, calls a step, share of all ops' time)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        for _ in range(steps):
            timer.seconds([token])
    events = sorted(profile.key_averages(), key=lambda e: -e.self_cpu_time_total)
    total = sum(e.self_cpu_time_total for e in events)
    return [[e.key, f"{e.count / steps:.0f}", f"{e.self_cpu_time_total / total:.0%}"] for e in events[:top]]


def quality(models: dict, tokenizer, assistant, args, all_units) -> list[str]:
    """Per target: top-1 agreement with float32 (teacher-forced on float32's greedy output of the held-out free
    prompts) and ours-full's objects field by field with the float32 target's."""
    dense = load_model(args.target)
    agree, same, fields, total = dict.fromkeys(models, 0), dict.fromkeys(models, 0), dict.fromkeys(models, 0), 0
    with torch.inference_mode():
        for kind, name, ids, task in all_units:
            if kind == "free":
                out = generate(dense, tokenizer=tokenizer, input_ids=ids, max_new_tokens=32).token_ids
                full = torch.tensor([ids + out])
                top = dense(full).logits[0, len(ids) - 1 : -1].argmax(-1)
                total += len(out)
                for t, m in models.items():
                    agree[t] += int((m(full).logits[0, len(ids) - 1 : -1].argmax(-1) == top).sum())
                continue
            runs = {t: generate(m, assistant, tokenizer=tokenizer, input_ids=ids, schema=task.schema,
                                max_new_tokens=args.max_new_tokens).value
                    for t, m in {"float32": dense, **models}.items()}
            for t in models:
                if runs["float32"] is not None and runs[t] is not None:
                    left, right = runs["float32"].model_dump(), runs[t].model_dump()
                    fields[t] += len(left)
                    same[t] += sum(left[k] == right.get(k) for k in left)
    return [f"- {t} target: greedy tokens equal to float32's (teacher-forced, held-out free prompts) "
            f"{agree[t]}/{total} ({100 * agree[t] / max(total, 1):.1f}%); fields of ours-full's objects equal to "
            f"the float32 target's {same[t]}/{fields[t]}" for t in models]


def load_targets(args) -> tuple[dict, object, object]:
    """Each target of --quantize-target (one process, same source), the tokenizer and the assistant copy."""
    first, *rest = args.quantize_target
    model, tokenizer, assistant = load_pair(args.target, args.assistant, quantize_target=first,
                                            quantize_assistant=args.assistant_copy)
    models = {first: model, **{t: load_pair(args.target, quantize_target=t)[0] for t in rest}}
    models |= {f"int4@{path}": models["int4"] for path in args.int4_path if "int4" in models}
    return models, tokenizer, assistant


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    try:
        import llama_cpp
    except ImportError:
        print("error: llama-cpp-python is not installed (pip install llama-cpp-python==0.3.36)", file=sys.stderr)
        return 2
    models, tokenizer, assistant = load_targets(args)
    llama = LlamaCpp(gguf_file(args.target), args.threads)
    all_units = units(tokenizer, args.per_class)
    ours = Ours(models, tokenizer, assistant, args.max_new_tokens, args.free_max_new_tokens)
    rows = measure(ours, llama, all_units, args.threads, args.repeats)
    head = [*run_lines("experiments.vs_llamacpp", argv, f"llama-cpp-python {llama_cpp.__version__}"),
            f"- target {args.target}, assistant {args.assistant} ({args.assistant_copy} copy); llama.cpp: the "
            f"target's GGUF; greedy, max_new_tokens {args.free_max_new_tokens} (free prompts) and "
            f"{args.max_new_tokens} (extraction), {args.repeats} repeats, systems rotated per unit",
            *(f"- our {t} target's Linear layers: {kernel_names(t, m)}" for t, m in models.items())]
    readme = []
    for t in models:
        readme += [f"## Plain decoding, free prompts (per token), against ours-spec-{t}", "",
                   *table(rows, "free", f"ours-spec-{t}", models), "",
                   f"## Structured extraction (per object, every object validated), against ours-full-{t}", "",
                   *table(rows, "structured", f"ours-full-{t}", models), ""]
    if args.costs:
        other = "int4" if args.assistant_copy == "int8" else "int8"
        named = {**{f"ours {t} target": m for t, m in models.items()}, f"ours assistant ({args.assistant_copy})":
                 assistant, f"ours assistant ({other})": QUANTIZED_COPIES[other](load_model(args.assistant))}
        cost_llama = LlamaCpp(gguf_file(args.target), args.threads, logits_all=True)
        readme += ["## Forward costs (ms; k new tokens after 200 cached; llama.cpp with logits for every row)", "",
                   *costs(named, cost_llama, args.threads), ""]
    if args.quality:
        readme += ["## Quality note (each target against the float32 model)", "",
                   *quality(models, tokenizer, assistant, args, all_units), ""]
    title = f"Ours ({', '.join(models)} targets) vs llama.cpp on the same GGUF: {args.out.name}"
    write_run(args.out, title, head, readme, rows, FIELDS)
    print((args.out / "README.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Our full system against transformers + XGrammar's logits processor, on held-out extraction tasks.

Systems (all greedy, same models, same run, order rotated per task):
  xgrammar            model.generate + xgrammar.contrib.hf.LogitsProcessor (its defaults: any whitespace)
  xgrammar-compact    the same, compact JSON (no whitespace, "," and ":"), what ours writes
  xgrammar+assistant  the same with assistant_model= (XGrammar's processor follows the order of calls:
                      it is expected to fail or to emit invalid output there; recorded as it happens)
  ours-processor      model.generate + assisted.logits_processor
  ours-processor+assistant  the same with assistant_model= (transformers' assisted generation)
  constrained         assisted.generate, no assistant, forced tokens verified (plain constrained decoding)
  constrained+forced  assisted.generate, no assistant, forced tokens coalesced (our plain constrained default)
  full                assisted.generate with the assistant and coalesced forced tokens (our defaults: `auto`,
                      prompt lookup)
  full-no-lookup      the same without prompt-lookup drafts

    pip install --no-deps --target /tmp/xgr xgrammar==0.2.8 apache-tvm-ffi   # CPU only, no triton needed
    PYTHONPATH=/tmp/xgr python -m experiments.vs_xgrammar --target smollm2-135m --assistant smollm2-135m \\
        --int8-assistant --out experiments/results/vs-xgrammar-...
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from pydantic import BaseModel, Field

from assisted import generate, logits_processor
from assisted.models.loading import load_pair
from experiments.lib.intervals import paired_ratio
from experiments.lib.machine import run_lines
from experiments.lib.tasks import (
    Task, add_assistant_quantization, assistant_label, assistant_quantization, validate, write_rows)


class LineItem(BaseModel):
    description: str = Field(max_length=40)
    quantity: int = Field(ge=1)
    unit_price: float


class Invoice(BaseModel):
    invoice_number: str = Field(max_length=20)
    vendor: str = Field(max_length=40)
    date: str = Field(pattern=r"^\d{4}-\d{2}-\d{2}$")
    items: list[LineItem] = Field(min_length=1, max_length=4)
    currency: str = Field(pattern=r"^[A-Z]{3}$")


class Patient(BaseModel):
    name: str = Field(max_length=40)
    age: int = Field(ge=0, le=130)
    allergies: list[str] = Field(max_length=4)
    blood_type: str = Field(pattern=r"^(A|B|AB|O)[+-]$")


class Flight(BaseModel):
    passenger: str = Field(max_length=40)
    flight_number: str = Field(pattern=r"^[A-Z]{2}[0-9]{2,4}$")
    origin: str = Field(pattern=r"^[A-Z]{3}$")
    destination: str = Field(pattern=r"^[A-Z]{3}$")
    seat: str = Field(max_length=4)
    checked_bags: int = Field(ge=0, le=5)


class Review(BaseModel):
    product: str = Field(max_length=40)
    rating: int = Field(ge=1, le=5)
    pros: list[str] = Field(max_length=3)
    cons: list[str] = Field(max_length=3)
    would_recommend: bool


TASKS = (
    Task("invoice", "extraction", Invoice,
         "Extract the invoice below as JSON with invoice_number, vendor, date (YYYY-MM-DD), items (description, "
         "quantity, unit_price) and currency.\n\nInvoice INV-2291 from Baltic Office Supply, dated 2026-03-02: "
         "3 desk lamps at 24.90 EUR each, 10 packs of printer paper at 4.50 EUR and one 27-inch monitor at "
         "219.00 EUR. All prices in EUR."),
    Task("patient", "extraction", Patient,
         "Extract the patient record below as JSON with name, age, allergies and blood_type.\n\nJonas Weber, "
         "58 years old, was admitted on Tuesday. He is allergic to penicillin and peanuts. Blood type: A negative."),
    Task("flight", "extraction", Flight,
         "Extract the booking below as JSON with passenger, flight_number, origin and destination (IATA codes), "
         "seat and checked_bags.\n\nBooking confirmed for Aiko Yamamoto on LH1234 from Frankfurt (FRA) to "
         "Lisbon (LIS), seat 14C, with two checked bags."),
    Task("review", "extraction", Review,
         "Extract the product review below as JSON with product, rating (1-5), pros, cons and would_recommend."
         "\n\nI have used the Trailblazer 2 hiking boots for a month. Very comfortable and fully waterproof, "
         "but they are heavy and the laces keep coming loose. Four stars; I would still buy them again."),
)
SYSTEMS = (
    "xgrammar",
    "xgrammar-compact",
    "xgrammar+assistant",
    "ours-processor",
    "ours-processor+assistant",
    "constrained",
    "constrained+forced",
    "full-no-lookup",
    "full",
)
OURS = {"constrained": (False, False, 0), "constrained+forced": (False, True, 0),  # system -> (assistant, coalesce,
        "full-no-lookup": (True, True, 0), "full": (True, True, None)}        # prompt_lookup_num_tokens: 0 off)
FIELDS = ("task", "repeat", "system", "seconds", "new_tokens", "valid", "error", "text")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--assistant", default="smollm2-135m")
    add_assistant_quantization(parser, ("--int4-assistant", "--int8-assistant"))
    parser.add_argument("--pack", action="store_true", help="pack the target's Linear weights (every system)")
    parser.add_argument("--quantize-target", choices=["int4", "int8"], default=None,
                        help="a row-invariant quantized target (`assisted.models.int4` / `int8`), for every system")
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS),
                        help="systems to run (full always runs: every ratio pairs with it)")
    parser.add_argument("--repeats", type=int, default=1, help="runs of every (task, system), interleaved")
    parser.add_argument("--out", type=Path, required=True)
    return parser.parse_args(argv)


class Systems:
    """Runs one system on one task; returns (text, new tokens)."""

    def __init__(self, model, tokenizer, assistant, max_new_tokens: int):
        import xgrammar
        self.model, self.tokenizer, self.assistant, self.max_new = model, tokenizer, assistant, max_new_tokens
        self.eos = list(model.generation_config.eos_token_id)
        vocab = model.get_output_embeddings().weight.shape[0] if hasattr(model.get_output_embeddings(), "weight") \
            else model.config.vocab_size
        info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab, stop_token_ids=self.eos)
        self.xgr, self.compiler = xgrammar, xgrammar.GrammarCompiler(info)

    def ids(self, task: Task) -> list[int]:
        text = self.tokenizer.apply_chat_template(task.messages(), tokenize=False, add_generation_prompt=True)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def run(self, system: str, task: Task, temperature: float = 0.0, seed: int = 0) -> tuple[str, int]:
        """`system` on `task`: greedy at temperature 0, else sampled at `temperature` (no top-k/top-p) with `seed`."""
        ids, sample = self.ids(task), temperature > 0
        if system in OURS:
            helper, coalesce, lookup = OURS[system]
            out = generate(self.model, self.assistant if helper else None, tokenizer=self.tokenizer, input_ids=ids,
                           schema=task.schema, max_new_tokens=self.max_new, coalesce=coalesce,
                           prompt_lookup_num_tokens=lookup, do_sample=sample,
                           temperature=temperature if sample else 1.0, seed=seed)
            return out.text, out.stats.new_tokens
        if system.startswith("xgrammar"):
            compact = {"any_whitespace": False, "separators": (",", ":")} if system == "xgrammar-compact" else {}
            grammar = self.compiler.compile_json_schema(json.dumps(task.json_schema()), **compact)
            processor = self.xgr.contrib.hf.LogitsProcessor(grammar)
        else:
            processor = logits_processor(self.tokenizer, schema=task.schema, eos_token_ids=self.eos)
        extra = {"assistant_model": self.assistant} if system.endswith("+assistant") else {}
        if sample:
            extra |= {"temperature": temperature, "top_k": 0, "top_p": 1.0}
        torch.manual_seed(seed)
        with torch.inference_mode():
            out = self.model.generate(torch.tensor([ids]), logits_processor=[processor], do_sample=sample,
                                      max_new_tokens=self.max_new, **extra)
        emitted = out[0, len(ids):].tolist()
        stop = next((i for i, t in enumerate(emitted) if t in self.eos), None)  # EOS, then padding
        text = self.tokenizer.decode(emitted[:stop], skip_special_tokens=True)
        return text, len(emitted) if stop is None else stop + 1


def chosen(names) -> tuple[str, ...]:
    """`names` in SYSTEMS order, with `full` added."""
    return tuple(s for s in SYSTEMS if s in {*names, "full"})


def measure(systems: Systems, tasks, names=SYSTEMS, repeats: int = 1) -> list[dict]:
    names = chosen(names)
    budget, systems.max_new = systems.max_new, 8
    for task in tasks:  # untimed, short: grammars and indexes compiled, allocators warm
        for system in {"xgrammar", "xgrammar-compact", "ours-processor", "full"} & set(names):
            _timed(systems, system, task)
    systems.max_new = budget
    rows = []
    for i, (repeat, task) in enumerate((r, t) for r in range(repeats) for t in tasks):
        order = names[i % len(names):] + names[: i % len(names)]
        for system in order:
            row = {"task": task.name, "repeat": repeat, "system": system, **_timed(systems, system, task)}
            row["valid"] = row["error"] == "" and validate(task, row["text"])
            rows.append(row)
            print(f"{task.name:8} {system:26} {row['seconds']:7.2f} s {row['new_tokens']:4d} tok "
                  f"valid={row['valid']} {row['error']}", file=sys.stderr)
    return rows


def _timed(systems: Systems, system: str, task: Task, temperature: float = 0.0, seed: int = 0) -> dict:
    start = time.perf_counter()
    try:
        text, tokens = systems.run(system, task, temperature, seed)
        error = ""
    except Exception as exc:  # noqa: BLE001  a system failing is a result to record, not a crash
        text, tokens, error = "", 0, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:120]
    return {"seconds": time.perf_counter() - start, "new_tokens": tokens, "error": error, "text": text}


def table(rows: list[dict]) -> list[str]:
    """Per system: median seconds (tokens) per task, valid outputs, the summed medians, and full's speedup paired
    per (task, repeat) unit (geometric mean of the system's seconds / full's, 90% interval)."""
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    names = chosen({r["system"] for r in rows})
    runs: dict = {}  # (task, system) -> rows
    for r in rows:
        runs.setdefault((r["task"], r["system"]), []).append(r)
    full = {(r["task"], r.get("repeat", 0)): r["seconds"] for r in rows if r["system"] == "full"}
    lines = ["| system | " + " | ".join(f"{t} s (tok)" for t in tasks) + " | valid | total s | full is faster by |",
             "|---|" + "---|" * (len(tasks) + 3)]
    for system in names:
        mine = [runs[(t, system)] for t in tasks]
        seconds = [statistics.median(r["seconds"] for r in runs_) for runs_ in mine]
        shown = [f"{sec:.2f} ({statistics.median(r['new_tokens'] for r in runs_):.0f})"
                 if not any(r["error"] for r in runs_) else "error" for sec, runs_ in zip(seconds, mine)]
        ratio, low, high = paired_ratio([(r["seconds"], full[(r["task"], r.get("repeat", 0))])
                                         for runs_ in mine for r in runs_])
        valid = sum(r["valid"] for runs_ in mine for r in runs_)
        faster = "error" if "error" in shown else f"{ratio:.2f}x [{low:.2f}, {high:.2f}]"
        lines.append(f"| {system} | " + " | ".join(shown) + f" | {valid}/{sum(map(len, mine))} | "
                     f"{sum(seconds):.2f} | {faster} |")
    errors = sorted({f"{r['system']}: {r['error']}" for r in rows if r["error"]})
    return lines + ([""] + [f"- error, {e}" for e in errors] if errors else [])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    try:
        import xgrammar  # noqa: F401
    except ImportError:
        print("error: xgrammar is not importable; see this module's docstring for the CPU install", file=sys.stderr)
        return 2
    model, tokenizer, assistant = load_pair(args.target, args.assistant, pack=args.pack,
                                            quantize_assistant=assistant_quantization(args),
                                            quantize_target=args.quantize_target)
    rows = measure(Systems(model, tokenizer, assistant, args.max_new_tokens), TASKS, args.systems, args.repeats)
    args.out.mkdir(parents=True, exist_ok=True)
    write_rows(args.out / "results.csv", rows, FIELDS)
    import xgrammar
    version = getattr(xgrammar, "__version__", None) or _dist_version("xgrammar")
    readme = [f"# Our full system vs transformers + XGrammar: {args.out.name}", "",
              *run_lines("experiments.vs_xgrammar", argv, f"xgrammar {version}"),
              f"- target {args.target}{' (packed)' if args.pack else ''}"
              f"{f' ({args.quantize_target})' if args.quantize_target else ''}, assistant {assistant_label(args)}, "
              f"greedy, max_new_tokens {args.max_new_tokens}",
              f"- four held-out extraction tasks written for this comparison (invoice, patient, flight, review), "
              f"{args.repeats} run(s) each, systems in rotated order per (task, run)", "",
              *table(rows), "",
              "\"full is faster by\": the geometric mean over (task, run) units of the system's seconds per object / "
              "full's, with a 90% t-interval (one unit: no interval). XGrammar's defaults allow any "
              "whitespace (the model writes indented JSON: more tokens); xgrammar-compact and ours write compact JSON.",
              "The CPU is shared with other jobs: single timings are noisy."]
    (args.out / "README.md").write_text("\n".join(readme) + "\n")
    print("\n".join(table(rows)))
    return 0


def _dist_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(name)
    except PackageNotFoundError:
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())

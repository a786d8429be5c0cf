"""An assistant of another family: the Qwen2.5-Coder 1.5B target drafted by SmolLM2-135M (issue 56).

    python -m experiments.foreign_assistant --threads 1 --out experiments/results/foreign-assistant-qwen-smollm2-...

Without XGrammar (the `compare` extra; on a CPU `pip install --no-deps xgrammar apache-tvm-ffi`) its systems are left
out. The system order rotates per unit; greedy outputs are checked against the target's own (free text: transformers'
greedy; structured: ours without an assistant); every object is validated. A is the foreign assistant.
  free text (validation-half prompts of experiments/prompts/split.json, greedy and T = 0.7, no top-k/top-p):
    target            model.generate, no assistant
    hf-uag            transformers' universal assisted generation with A (assistant_tokenizer=; greedy: re-tokenized
                      candidates; sampling: USD over the vocabularies' intersection), its defaults, on a copy of A
                      (USD prunes the assistant's head in place); hf-uag-heuristic: 5 tokens, schedule "heuristic"
    ours-foreign      assisted.generate(A, assistant_tokenizer=A's), defaults; ours-same: the Qwen 0.5B assistant
  structured (the four held-out extraction tasks, `experiments.lib.tasks.HELD_OUT`, greedy, compact JSON):
    xgrammar          model.generate + XGrammar's logits processor; xgrammar+uag: with A through UAG (it fails:
                      transformers hands the target's processors to A's own generate too; recorded as it happens)
    processor+uag     model.generate + assisted.logits_processor on the target's logits only, A through UAG: the
                      working transformers baseline (under transformers 5.25 UAG can fail where a committed target
                      token adds no assistant token: recorded as it happens)
    ours-plain        assisted.generate, no assistant; ours-same, ours-foreign as above, with the schema
Writes results.csv and README.md (paired ratios per unit: seconds per token in free text, per object structured).
"""

from __future__ import annotations

import copy
import hashlib
import json
import statistics
import sys

from assisted import generate, logits_processor
from assisted.models.loading import load_model, load_pair, load_tokenizer, set_eos
from experiments.lib import cli, report, runner
from experiments.lib.systems import (DRAFTING_SETTINGS, drafting_settings, transformers_tokens, xgrammar_compiler,
                                     xgrammar_processor, xgrammar_version)
from experiments.lib.tasks import HELD_OUT as TASKS, chat_ids, load_prompts, validate

FREE = ("target", "hf-uag", "hf-uag-heuristic", "ours-foreign", "ours-same")
STRUCTURED = ("xgrammar", "xgrammar+uag", "processor+uag", "ours-plain", "ours-same", "ours-foreign")
FIELDS = ("part", "unit", "temperature", "repeat", "system", "seconds", "new_tokens", "valid", "same_tokens",
          "acceptance", "assistant_tokenizer_s", "error", "tokens", "text")


def parse_args(argv: list[str] | None):
    p = cli.parser("foreign_assistant", __doc__)
    cli.add_models(p, assistant="smollm2-135m")
    cli.add_run(p, threads=None, max_new_tokens=48, temperatures=[0.0, 0.7])
    p.add_argument("--same-assistant", default="qwen2.5-coder-0.5b", help="a same-vocabulary assistant, or 'none'")
    p.add_argument("--parts", nargs="+", choices=("free", "structured"), default=["free", "structured"])
    p.add_argument("--per-class", type=int, default=2, help="free text: the first N validation prompts per class")
    p.add_argument("--tasks", type=int, default=len(TASKS), help="structured: the first N tasks")
    p.add_argument("--structured-max-new-tokens", type=int, default=160)
    return p.parse_args(argv)


class Models:
    """The target, A (ours, and two copies with their own tokenizer objects for transformers: greedy, sampling) and
    the same-vocabulary assistant."""

    def __init__(self, args):
        self.model, self.tokenizer, self.foreign = load_pair(args.target, args.assistant, pack=args.pack)
        self.foreign_tokenizer = load_tokenizer(args.assistant)
        self.hf = {sample: (copy.deepcopy(self.foreign), load_tokenizer(args.assistant)) for sample in (False, True)}
        self.defaults = {k: getattr(self.foreign.generation_config, k) for k in DRAFTING_SETTINGS}
        self.same = None if args.same_assistant == "none" else load_model(args.same_assistant)
        set_eos(self.tokenizer, self.model, self.same)
        self.eos = list(self.model.generation_config.eos_token_id)


def ours(m: Models, system: str, messages, task, max_new: int, temperature: float, seed: int) -> dict:
    helper = {"ours-foreign": m.foreign, "ours-same": m.same}.get(system)
    extra = {"assistant_tokenizer": m.foreign_tokenizer} if system == "ours-foreign" else {}
    sample, schema = temperature > 0, None if task is None else task.schema
    out = generate(m.model, helper, tokenizer=m.tokenizer, messages=messages, schema=schema, max_new_tokens=max_new,
                   do_sample=sample, temperature=temperature if sample else 1.0, seed=seed, **extra)
    drafted, accepted = out.stats.drafted_by_source["assistant"], out.stats.accepted_by_source["assistant"]
    return {"tokens": out.token_ids, "text": out.text, "acceptance": accepted / drafted if drafted else float("nan"),
            "assistant_tokenizer_s": out.stats.seconds.assistant_tokenizer}


def transformers_run(m: Models, system: str, messages, task, max_new: int, temperature: float, seed: int) -> dict:
    kwargs = {}
    if "uag" in system:
        helper, helper_tokenizer = m.hf[temperature > 0]
        drafting_settings(helper, m.defaults, heuristic=system == "hf-uag-heuristic")
        kwargs |= dict(assistant_model=helper, tokenizer=m.tokenizer, assistant_tokenizer=helper_tokenizer)
    if task is not None:
        kwargs["logits_processor"] = [_processor(m, system, task)]
    emitted = transformers_tokens(m.model, chat_ids(m.tokenizer, messages), m.eos, max_new, temperature, seed,
                                  **kwargs)
    return {"tokens": emitted, "text": m.tokenizer.decode(emitted, skip_special_tokens=True)}


def _processor(m: Models, system: str, task):
    if system.startswith("xgrammar"):
        return xgrammar_processor(xgrammar_compiler(m.model, m.tokenizer, m.eos), task.json_schema(), compact=True)
    return TargetOnly(logits_processor(m.tokenizer, schema=task.schema), m.model.config.vocab_size)


class TargetOnly:
    """A logits processor applied to the target's logits only: under UAG transformers also calls the target's
    processors on the assistant's logits, in the assistant's vocabulary, where a grammar over the target's ids has no
    meaning (those calls pass through unchanged)."""

    def __init__(self, processor, vocab_size: int):
        self.processor, self.vocab_size = processor, vocab_size

    def __call__(self, input_ids, scores):
        return self.processor(input_ids, scores) if scores.shape[-1] == self.vocab_size else scores


def timed(m: Models, system: str, messages, task, max_new: int, temperature: float, seed: int) -> dict:
    run = ours if system.startswith("ours") else transformers_run
    seconds, found, error = runner.timed(lambda: run(m, system, messages, task, max_new, temperature, seed))
    found = found or {"tokens": [], "text": ""}
    return {"seconds": seconds, "new_tokens": len(found["tokens"]), "error": error,
            "tokens": hashlib.sha1(json.dumps(found["tokens"]).encode()).hexdigest()[:12], "text": found["text"],
            "acceptance": found.get("acceptance", float("nan")),
            "assistant_tokenizer_s": found.get("assistant_tokenizer_s", 0.0)}


def units(args) -> list[tuple]:
    """(part, unit name, messages, task or None, temperature, repeat) for every timed run, in order."""
    found = []
    for repeat in range(args.repeats):
        if "free" in args.parts:
            for prompt in load_prompts(half="validation", per_class=args.per_class):
                messages = [{"role": "user", "content": prompt["prompt"]}]
                found += [("free", prompt["name"], messages, None, t, repeat) for t in args.temperatures]
        if "structured" in args.parts:
            found += [("structured", task.name, task.messages(), task, 0.0, repeat) for task in TASKS[: args.tasks]]
    return found


def systems_of(part: str, m: Models, has_xgrammar: bool) -> tuple[str, ...]:
    names = FREE if part == "free" else STRUCTURED
    return tuple(s for s in names if (m.same is not None or s != "ours-same")
                 and (has_xgrammar or not s.startswith("xgrammar")))


def warm_up(args, m: Models, has_xgrammar: bool) -> None:
    """Every system once per structured task and once on the first free prompt per temperature, 8 tokens, untimed:
    guides and grammars compiled, allocators warm, `auto`'s costs for each pair measured (as in any process that
    generates more than once)."""
    seen = set()
    for part, name, messages, task, temperature, _ in units(args):
        if (part, name if task is not None else "", temperature) not in seen:
            seen.add((part, name if task is not None else "", temperature))
            for system in systems_of(part, m, has_xgrammar):
                timed(m, system, messages, task, 8, temperature, args.seed)


def measure(args, m: Models, has_xgrammar: bool) -> list[dict]:
    warm_up(args, m, has_xgrammar)
    rows = []
    for i, (part, name, messages, task, temperature, repeat) in enumerate(units(args)):
        max_new = args.max_new_tokens if part == "free" else args.structured_max_new_tokens
        for system in runner.rotated(systems_of(part, m, has_xgrammar), i):
            row = {"part": part, "unit": name, "temperature": temperature, "repeat": repeat, "system": system,
                   **timed(m, system, messages, task, max_new, temperature, args.seed + repeat)}
            row["valid"] = "" if task is None else (not row["error"] and validate(task, row["text"]))
            rows.append(row)
            print(f"{part:10} {name:24} T={temperature} {system:17} {row['seconds']:7.2f} s {row['new_tokens']:4d} "
                  f"tok valid={row['valid']} {row['error']}", file=sys.stderr)
    for row in rows:  # greedy: the same tokens as the target's own decoding
        reference = "target" if row["part"] == "free" else "ours-plain"
        same = [r for r in rows if (r["part"], r["unit"], r["temperature"], r["repeat"], r["system"]) ==
                (row["part"], row["unit"], row["temperature"], row["repeat"], reference)]
        row["same_tokens"] = "" if row["temperature"] > 0 or not same else row["tokens"] == same[0]["tokens"]
    return rows


def part_table(rows: list[dict], part: str, judged: str = "ours-foreign") -> list[str]:
    """Per temperature (free) or overall (structured): each system's median, validity and greedy identity, and
    `judged`'s paired speedup over it (> 1: `judged` is faster)."""
    per_token = part == "free"
    lines = ["| T | system | units | median tok/s | median s/object | valid | same tokens (greedy) | acceptance | "
             f"{judged} is faster by |", "|---" * 9 + "|"]
    for t in sorted({r["temperature"] for r in rows if r["part"] == part}):
        mine = [r for r in rows if r["part"] == part and r["temperature"] == t]
        cost = (lambda r: r["seconds"] / max(r["new_tokens"], 1)) if per_token else (lambda r: r["seconds"])
        ratios = runner.paired([r for r in mine if not r["error"]], judged, ("unit", "repeat"), cost)
        for system in sorted({r["system"] for r in mine}, key=(FREE if per_token else STRUCTURED).index):
            runs = [r for r in mine if r["system"] == system]
            ratio = runner.span(ratios[system]) if system in ratios else ""
            ok = [r for r in runs if not r["error"]]
            rate = statistics.median(r["new_tokens"] / r["seconds"] for r in ok) if ok else float("nan")
            seconds = statistics.median(r["seconds"] for r in ok) if ok else float("nan")
            same = [r["same_tokens"] for r in runs if r["same_tokens"] != ""]
            acc = [r["acceptance"] for r in runs if r["acceptance"] == r["acceptance"]]
            lines.append(f"| {t} | {system} | {len(runs)} | {rate:.2f} | {seconds:.2f} | "
                         f"{sum(r['valid'] is True for r in runs) if not per_token else '-'}/{len(runs)} | "
                         f"{f'{sum(same)}/{len(same)}' if same else '-'} | "
                         f"{f'{statistics.fmean(acc):.2f}' if acc else '-'} | {ratio} |")
    errors = sorted({f"{r['system']}: {r['error']}" for r in rows if r["part"] == part and r["error"]})
    return lines + [f"- error, {e}" for e in errors]


def main(argv: list[str] | None = None) -> int:
    argv, args = cli.begin(parse_args, argv)
    has_xgrammar = xgrammar_version() is not None
    m = Models(args)
    rows = measure(args, m, has_xgrammar)
    tokens = sum(r["new_tokens"] for r in rows if r["system"] == "ours-foreign")
    spent = sum(r["assistant_tokenizer_s"] for r in rows if r["system"] == "ours-foreign")
    head = [*report.run_lines("experiments.foreign_assistant", argv, f"xgrammar {'yes' if has_xgrammar else 'absent'}"),
            f"- target {args.target}{' (packed)' if args.pack else ''}, assistant of another family "
            f"{args.assistant}, same-vocabulary assistant {args.same_assistant}; free text: {args.per_class} "
            f"validation prompt(s) per class, {args.max_new_tokens} new tokens; structured: {args.tasks} task(s), "
            f"{args.structured_max_new_tokens}; {args.repeats} repeat(s)"]
    body = ["## Free text (seconds per token, paired per prompt and repeat)", "", *part_table(rows, "free"), "",
            "## Structured extraction (seconds per object, paired per task and repeat)", "",
            *part_table(rows, "structured"), "",
            f"ours-foreign's tokenizer calls: {spent:.2f} s over {tokens} tokens "
            f"({1000 * spent / max(tokens, 1):.2f} ms per token).",
            "\"is faster by\": geometric mean over units of the system's cost / ours-foreign's, 90% t-interval. "
            "\"same tokens\": greedy outputs equal to the target's own (free: transformers' greedy; structured: "
            "ours without an assistant); float32 verification can differ from one-token steps at near-ties."]
    report.write_run(args.out, f"An assistant of another family: {args.out.name}", head, body, rows, FIELDS)
    print("\n".join(body[-8:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Prefix reuse benchmark: a batch of documents behind one long shared instruction, with and without
`assisted.PrefixCache`.

Every document is run in both modes, interleaved (the order alternates from one document to the next), so
machine load hits both alike; the prefix cache only ever sees the reuse mode's calls. Reported per mode:
seconds per document (median and mean), prompt tokens prefilled, and whether the outputs are identical.

    python -m experiments.prefix_reuse --model smollm2-135m --out experiments/results/prefix-reuse-smollm2-cpu-DATE
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from assisted import PrefixCache, generate
from assisted.models.loading import load_pair
from experiments.lib.machine import run_lines
from experiments.lib.tasks import add_assistant_quantization, assistant_label, assistant_quantization, write_rows

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "city": {"type": "string", "maxLength": 30},
        "occupation": {"type": "string", "maxLength": 40},
    },
    "required": ["name", "age", "city", "occupation"],
    "additionalProperties": False,
}
EXAMPLES = [
    ("Maria Lopez, a 42-year-old pharmacist, moved to Valencia last spring after years in Madrid.",
     '{"name":"Maria Lopez","age":42,"city":"Valencia","occupation":"pharmacist"}'),
    ("At 29, Kenji Sato already leads the robotics lab in Osaka, where he works as a research engineer.",
     '{"name":"Kenji Sato","age":29,"city":"Osaka","occupation":"research engineer"}'),
    ("The bakery on Rue Oberkampf in Paris belongs to Claire Dubois, 55, who has been a baker since she was 17.",
     '{"name":"Claire Dubois","age":55,"city":"Paris","occupation":"baker"}'),
]
INSTRUCTION = (
    "You are a careful information extraction system. Read the document the user gives you and extract exactly "
    "one person described in it. Return a single JSON object with four keys: name (the person's full name as "
    "written), age (an integer number of years), city (the city where the person lives or works now) and "
    "occupation (a short lowercase job title). Do not add keys, comments or explanations. If the document "
    "mentions several cities, choose the one where the person is now. If the age is given as a birth year, "
    "compute it for the year 2024. Keep names exactly as spelled in the document, including accents.\n\n"
    "Examples:\n" + "\n".join(f"Document: {doc}\nJSON: {out}" for doc, out in EXAMPLES)
)
DOCUMENTS = [
    "Ahmed Khalil, 34, drives a night taxi in Cairo and studies law during the day.",
    "The new head nurse at Oslo University Hospital is Ingrid Berg, who turned 47 this year.",
    "Lucas Moreau (23) plays the cello in the Lyon opera orchestra.",
    "In Nairobi, 38-year-old software developer Grace Wanjiru built an app for farmers.",
    "Tom Becker, an architect aged 61, designed half of the new quarter in Hamburg.",
    "Priya Nair is a 31-year-old data analyst who lives in Bangalore.",
    "After twenty years at sea, captain Jonas Lind (58) now runs a ferry company in Gothenburg.",
    "Elena Rossi, 27, works as a sommelier in a small restaurant in Florence.",
    "Chen Wei, a 45-year-old surgeon, commutes every day to his hospital in Shanghai.",
    "The Toronto city council hired Olivia Grant, 36, as its first chief urban planner.",
    "Diego Fernandez, 52, repairs violins in his workshop in Buenos Aires.",
    "Fatima Zahra, a 24-year-old journalist, reports on politics from Rabat.",
    "Mikko Virtanen (66) is a retired firefighter who still volunteers in Helsinki.",
    "Sofia Andersson, 33, teaches mathematics at a high school in Uppsala.",
    "Rahul Mehta, a 40-year-old chef, opened his third restaurant in Mumbai.",
    "Anna Kowalska, 29, is a physiotherapist at a sports clinic in Krakow.",
    "Veteran pilot James O'Connor, 57, flies cargo planes out of Dublin.",
    "Yuki Tanaka, 21, is a student who works part-time as a barista in Kyoto.",
    "Hans Mueller, a 49-year-old electrician, lives with his family in Munich.",
    "Isabel Costa (35) manages a bookshop in Lisbon's old town.",
]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--assistant", help="drafting model (default: none)")
    add_assistant_quantization(parser, ("--int4-assistant", "--int8-assistant"))
    parser.add_argument("--documents", type=int, default=len(DOCUMENTS))
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, required=True)
    return parser.parse_args(argv)


def messages(document: str) -> list[dict]:
    return [{"role": "system", "content": INSTRUCTION}, {"role": "user", "content": f"Document: {document}\nJSON:"}]


def run(model, tokenizer, assistant, document: str, max_new_tokens: int, cache: PrefixCache | None) -> dict:
    start = time.perf_counter()
    out = generate(model, assistant, tokenizer=tokenizer, messages=messages(document), schema=SCHEMA,
                   max_new_tokens=max_new_tokens, prefix_cache=cache)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "prefill_tokens": out.stats.prefill_tokens, "new_tokens": out.stats.new_tokens,
            "text": out.text, "stop_reason": out.stop_reason}


def measure(model, tokenizer, assistant, documents: list[str], max_new_tokens: int) -> list[dict]:
    """Both modes per document, the order alternating; one shared PrefixCache for the reuse mode."""
    cache, rows = PrefixCache(), []
    run(model, tokenizer, assistant, "Warm-up: Ann, 30, nurse in Rome.", 8, None)  # index built, weights touched
    for i, document in enumerate(documents):
        modes = ["plain", "reuse"] if i % 2 == 0 else ["reuse", "plain"]
        for mode in modes:
            row = run(model, tokenizer, assistant, document, max_new_tokens, cache if mode == "reuse" else None)
            rows.append({"document": i, "mode": mode, **row})
            print(f"doc {i:2d} {mode:5}: {row['seconds']:.2f} s, prefill {row['prefill_tokens']}, "
                  f"{row['new_tokens']} new", file=sys.stderr)
    return rows


def summary(rows: list[dict]) -> list[str]:
    lines = ["| mode | median s/doc | mean s/doc | total s | mean prefill tokens | mean new tokens |",
             "|---|---|---|---|---|---|"]
    for mode in ("plain", "reuse"):
        mine = [r for r in rows if r["mode"] == mode]
        s = [r["seconds"] for r in mine]
        lines.append(f"| {mode} | {statistics.median(s):.3f} | {statistics.mean(s):.3f} | {sum(s):.2f} | "
                     f"{statistics.mean(r['prefill_tokens'] for r in mine):.1f} | "
                     f"{statistics.mean(r['new_tokens'] for r in mine):.1f} |")
    plain = {r["document"]: r for r in rows if r["mode"] == "plain"}
    reuse = {r["document"]: r for r in rows if r["mode"] == "reuse"}
    same = sum(plain[d]["text"] == reuse[d]["text"] for d in plain)
    ratios = [plain[d]["seconds"] / reuse[d]["seconds"] for d in plain]
    lines += ["", f"- identical outputs: {same} of {len(plain)} documents",
              f"- per-document speedup (plain s / reuse s): median {statistics.median(ratios):.2f}x, "
              f"min {min(ratios):.2f}x, max {max(ratios):.2f}x"]
    return lines


def shared_prefix(tokenizer, first: str, second: str) -> int:
    """Tokens the prompts of two documents have in common (the instruction and the chat template's start)."""
    a, b = (tokenizer(tokenizer.apply_chat_template(messages(d), tokenize=False, add_generation_prompt=True),
                      add_special_tokens=False)["input_ids"] for d in (first, second))
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def write(args, rows: list[dict], tokenizer, argv: list[str]) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    write_rows(args.out / "results.csv", rows, list(rows[0]))
    shared = shared_prefix(tokenizer, DOCUMENTS[0], DOCUMENTS[1])
    readme = [
        f"# Prefix reuse {args.out.name}",
        "",
        *run_lines("experiments.prefix_reuse", argv),
        f"- target {args.model}, assistant {assistant_label(args) if args.assistant else 'none'}, "
        f"greedy, schema-constrained (coalesced forced tokens), max_new_tokens {args.max_new_tokens}",
        f"- {len({r['document'] for r in rows})} documents behind one shared system instruction with three "
        f"few-shot examples ({shared} prompt tokens shared by every document's prompt)",
        "",
        *summary(rows),
        "",
        "Both modes run every document, interleaved with alternating order; plain prefills the whole prompt,",
        "reuse keeps the previous document's KV cache and prefills only what follows the shared prefix.",
        "The CPU is shared with other jobs: single timings are noisy, compare the two modes within this run only.",
    ]
    (args.out / "README.md").write_text("\n".join(readme) + "\n")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    model, tokenizer, assistant = load_pair(args.model, args.assistant,
                                            quantize_assistant=assistant_quantization(args))
    rows = measure(model, tokenizer, assistant, DOCUMENTS[: args.documents], args.max_new_tokens)
    write(args, rows, tokenizer, argv)
    print("\n".join(summary(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A rough probe behind two choices of the batched loop (`assisted.generate_batch`): the KV-cache mechanism, and the
default `structspec batch --batch-size`. Not the throughput study (that is its own experiment).

1. Mechanism: per verification step of B rows of different lengths, what keeping rows of different lengths
   costs besides the forward itself: the shared physical cache (`drafting.batch_kv`: move each row's new
   entries left, crop to the longest row) against per-row caches gathered into one padded batch per forward
   and split back after it (a pad-and-stack of every row's whole cache, and a copy of each row's grown cache).
2. Batch size: documents per second of the same documents (schema-constrained extraction, greedy) through
   `generate()` one at a time and `generate_batch` at several batch sizes, the systems interleaved in rotating
   order over rounds; outputs compared for identity.

    python -m experiments.batch_rows_probe --out experiments/results/batch-rows-probe-smollm2-135m-cpu-DATE
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from assisted import PrefixCache, generate, generate_batch
from assisted.generate_batch import make_engine
from assisted.rows.inputs import Item, prepared
from assisted.models.loading import load_pair
from drafting.batch_kv import BatchKV
from experiments.lib.machine import run_lines
from experiments.prefix_reuse import DOCUMENTS, SCHEMA, messages


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--assistant", help="drafting model (default: none)")
    parser.add_argument("--quantize-assistant", choices=("int4", "int8"))
    parser.add_argument("--pack", action="store_true")
    parser.add_argument("--documents", type=int, default=12)
    parser.add_argument("--sizes", default="1,2,4,8", help="generate_batch batch sizes")
    parser.add_argument("--shared", default="", help="batch sizes of the CLI's engine with shared-prefix prefill")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--reuse", action="store_true", help="also generate() with a PrefixCache (--batch-size 1)")
    parser.add_argument("--no-mechanism", action="store_true", help="skip the cache-mechanism probe")
    parser.add_argument("--out", type=Path, required=True)
    return parser.parse_args(argv)


def mechanism(model, rows: int, lengths: list[int], feed: int, kept: int, steps: int = 20) -> dict:
    """Milliseconds per step: the forward, the shared cache's compaction, and the gather/split of per-row caches."""
    kv = BatchKV(model)
    for r, n in enumerate(lengths[:rows]):
        kv.place(r, [5 + (i * 7 + r) % 1000 for i in range(n)])
    real, spent = kv._compact, []

    def timed(*args):
        start = time.perf_counter()
        real(*args)
        spent.append(time.perf_counter() - start)

    kv._compact = timed
    forward = []
    with torch.inference_mode():
        for _ in range(steps):
            start = time.perf_counter()
            kv.forward([[7] * feed for _ in range(rows)])
            forward.append(time.perf_counter() - start)
            kv.crop_rows([n - feed + kept for n in kv.lengths])
        gather = [_gather_and_split(kv, feed, kept) for _ in range(steps)]
    return {"rows": rows, "forward_ms": 1e3 * statistics.median(forward),
            "compact_ms": 1e3 * statistics.median(spent), "gather_split_ms": 1e3 * statistics.median(gather)}


def _gather_and_split(kv: BatchKV, feed: int, kept: int) -> float:
    """The data movement of per-row caches: pad-and-stack every row into one batch, then append each row's kept
    new entries to its own cache (a copy of the row's cache, as `torch.cat` makes)."""
    per_row = [[(layer.keys[r : r + 1, :, :n], layer.values[r : r + 1, :, :n]) for layer in kv.cache.layers]
               for r, n in enumerate(kv.lengths)]
    width = max(kv.lengths)
    start = time.perf_counter()
    for i in range(len(kv.cache.layers)):
        keys = torch.cat([F.pad(row[i][0], (0, 0, 0, width - row[i][0].shape[2])) for row in per_row])
        values = torch.cat([F.pad(row[i][1], (0, 0, 0, width - row[i][1].shape[2])) for row in per_row])
        keys, values = (torch.cat([t, t[:, :, -feed:]], 2) for t in (keys, values))  # the forward's new columns
        for r, row in enumerate(per_row):
            row[i] = (torch.cat([row[i][0], keys[r : r + 1, :, width : width + kept]], 2),
                      torch.cat([row[i][1], values[r : r + 1, :, width : width + kept]], 2))
    return time.perf_counter() - start


def throughput(system: str, model, tokenizer, assistant, documents: list[str], max_new_tokens: int) -> dict:
    kw = dict(tokenizer=tokenizer, schema=SCHEMA, max_new_tokens=max_new_tokens,
              num_assistant_tokens_schedule="heuristic")
    start, cpu = time.perf_counter(), time.process_time()
    if system == "generate":
        outs = [generate(model, assistant, messages=messages(d), **kw) for d in documents]
    elif system == "generate-reuse":  # `structspec batch --batch-size 1`: the shared prompt prefix prefilled once
        cache = PrefixCache()
        outs = [generate(model, assistant, messages=messages(d), prefix_cache=cache, **kw) for d in documents]
    elif system.startswith("batch-"):
        outs = generate_batch(model, assistant, messages=[messages(d) for d in documents],
                              batch_size=int(system.split("-")[1]), **kw)
    else:  # "shared-B": the CLI's batched engine, newcomers prefilled from a row sharing their prompt prefix
        engine = make_engine(model, assistant, batch_size=int(system.split("-")[1]), share_prefix=True,
                             **{k: v for k, v in kw.items() if k != "schema"})
        items = (Item(i, "messages", messages(d), SCHEMA, None, None) for i, d in enumerate(documents))
        found = dict(engine.run(prepared(items, engine.prepare)))
        outs = [found[i] for i in range(len(documents))]
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    batch = outs[0].batch
    return {"system": system, "seconds": seconds, "docs_per_s": len(documents) / seconds, "cpu_seconds": cpu,
            "docs_per_cpu_s": len(documents) / cpu,
            "new_tokens": sum(o.stats.new_tokens for o in outs), "texts": [o.text for o in outs],
            "rows_per_forward": batch.rows_per_forward if batch else 1.0,
            "padding_share": batch.padding_share if batch else 0.0}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    model, tokenizer, assistant = load_pair(args.model, args.assistant, quantize_assistant=args.quantize_assistant,
                                            pack=args.pack)
    lengths = [380, 120, 300, 60, 250, 340, 200, 90]
    probes = [] if args.no_mechanism else [mechanism(model, rows, lengths, feed=6, kept=3) for rows in (2, 4, 8)]
    for p in probes:
        print(p, file=sys.stderr)
    documents = (DOCUMENTS * 4)[: args.documents]
    systems = ["generate", *(["generate-reuse"] if args.reuse else []), *(f"batch-{s}" for s in args.sizes.split(",")),
               *(f"shared-{s}" for s in args.shared.split(",") if s)]
    throughput(systems[-1], model, tokenizer, assistant, documents[:2], 8)  # warm-up: guide built, weights touched
    runs = []
    for round_ in range(args.rounds):
        for system in systems[round_ % len(systems):] + systems[: round_ % len(systems)]:
            runs.append({"round": round_, **throughput(system, model, tokenizer, assistant, documents,
                                                       args.max_new_tokens)})
            print(f"round {round_} {system}: {runs[-1]['docs_per_s']:.3f} doc/s, {runs[-1]['docs_per_cpu_s']:.3f} "
                  "doc/CPU-s", file=sys.stderr)
    write(args, argv if argv is not None else sys.argv[1:], probes, runs, systems)
    return 0


def _mechanism_lines(probes: list[dict]) -> list[str]:
    if not probes:
        return []
    return ["## KV-cache mechanism (ms per verification step; rows of lengths 380, 120, 300, 60, 250, 340, 200, 90;"
            " 6 tokens fed, 3 kept)", "",
            "| rows | forward | shared cache: compaction | per-row caches: gather + split |", "|---|---|---|---|",
            *(f"| {p['rows']} | {p['forward_ms']:.2f} | {p['compact_ms']:.3f} | {p['gather_split_ms']:.3f} |"
              for p in probes), ""]


def write(args, argv: list[str], probes: list[dict], runs: list[dict], systems: list[str]) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    reference = {r["round"]: r["texts"] for r in runs if r["system"] == "generate"}
    lines = [f"# Batched rows probe {args.out.name}", "", *run_lines("experiments.batch_rows_probe", argv),
             f"- target {args.model}, assistant {args.assistant or 'none'} ({args.quantize_assistant or 'as loaded'}), "
             f"pack {args.pack}; greedy, schema-constrained extraction (experiments.prefix_reuse's documents "
             f"and system prompt, chat template), heuristic schedule, max_new_tokens {args.max_new_tokens}, "
             f"{args.documents} documents, {args.rounds} rounds, systems in rotating order", "",
             *_mechanism_lines(probes), "## Documents per second", "",
             "Wall time and this process's CPU time (one thread: CPU time is what the work cost, less exposed to the "
             "other jobs on the machine than wall time). Ratios: median over rounds of the per-round ratio to "
             "`generate()` one document at a time.", "",
             "| system | doc/s (wall) per round | x generate() wall | doc per CPU s per round | x generate() CPU | "
             "rows per forward | padding share | identical to generate() |", "|---|---|---|---|---|---|---|---|"]
    for system in systems:
        mine = [r for r in runs if r["system"] == system]
        cells = []
        for key in ("docs_per_s", "docs_per_cpu_s"):
            base = {r["round"]: r[key] for r in runs if r["system"] == "generate"}
            ratio = statistics.median(r[key] / base[r["round"]] for r in mine)
            cells += [", ".join(f"{r[key]:.3f}" for r in mine), f"{ratio:.2f}"]
        same = sum(t == u for r in mine for t, u in zip(r["texts"], reference[r["round"]]))
        lines.append(f"| {system} | {' | '.join(cells)} | {statistics.mean(r['rows_per_forward'] for r in mine):.2f} | "
                     f"{statistics.mean(r['padding_share'] for r in mine):.3f} | "
                     f"{same}/{sum(len(r['texts']) for r in mine)} |")
    lines += ["", "The CPU is shared with other jobs: compare systems within this run only."]
    (args.out / "README.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())

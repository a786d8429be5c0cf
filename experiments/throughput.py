"""Throughput over many documents: our engine against batched transformers, the same run, interleaved.

    python -m experiments.throughput --quantize-target int8 --int4-assistant --threads 1 --limit 16 --chunk 16 \\
        --repeats 2 --out experiments/results/throughput-qwen-int8-cpu-<date>

Documents: `experiments/prompts/support_tickets.jsonl`, 48 support messages written for this experiment (1 to 4
sentences), each extracted into `Ticket` (a nested object, an array of objects, four enums). Systems, greedy, one
set of models:

  ours:B          assisted.generate_batch(batch_size=B, share_prefix=False): assistant drafts priced for the batch
                  (`auto`), forced tokens, continuous refill
  shared:B        the same with share_prefix=True (the default on the int8 target, where it is exact): a newcomer
                  copies the KV entries of the prompt prefix it shares with a row in the batch (prefills only the rest)
  forced:B        generate_batch without the assistant: forced tokens only (no model drafts)
  forced-shared:B the same with shared prefixes
  single          assisted.generate, one document after another (our single-row loop)
  hf-xgrammar:B   transformers' model.generate on left-padded batches of B, XGrammar's logits processor with compact
                  JSON (no whitespace, "," and ":": what ours writes)
  hf-ours:B       the same with assisted.logits_processor

Units: the documents are cut into chunks of `--chunk`; every (chunk, repeat) unit runs every system, the order
rotated per unit, so slow phases of a shared machine hit all systems alike. Reported per system: documents per
minute, new tokens per second, per-document latency p50/p95 (from the document's admission to its result: a batch's
wall time for transformers, the row's time in the batch for ours; queueing excluded), padding share, valid outputs
(every output checked with `jsonschema`). Ratios are paired per unit (geometric mean, 90% t-interval). Each unit's
row in units.csv also records what its forwards ran and cost (`COSTS`): for ours the batch's `BatchStats` (target
forwards, positions computed and used, the assistant's forwards, positions (its catch-up included) and seconds, and
the seconds of each of the engine's stages), for the one-by-one loop the rows' sums; the README's last table shows
their means for ours.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from assisted import generate, generate_batch, logits_processor
from assisted.rows.batch_stats import STAGES as BATCH_STAGES
from experiments.lib import cli
from experiments.lib.report import cpu_name, pyplot, read_rows, run_lines, save_figure, write_rows
from experiments.lib.runner import interleaved, paired, timed
from experiments.lib.systems import xgrammar_compiler, xgrammar_processor
from experiments.lib.tasks import TICKET, chat_ids

DOCUMENTS = Path(__file__).parent / "prompts" / "support_tickets.jsonl"
OURS = {"ours": (True, False), "shared": (True, True), "forced": (False, False), "forced-shared": (False, True)}
RERUN = ["single", "ours:1", *(f"{kind}:{b}" for b in (4, 8, 16) for kind in OURS),
         *(f"hf-xgrammar:{b}" for b in (1, 4, 8, 16))]  # issue 54's rerun: B in 1/4/8/16
STAGES = tuple(f"{stage}_seconds" for stage in BATCH_STAGES)  # ours: the engine's stages (`BatchStats.stage_seconds`)
COSTS = ("target_seconds", "positions_computed", "positions_used", "prefill_forwards", "assistant_forwards",
         "assistant_positions", "assistant_seconds", *STAGES)  # what each forward did and cost (blank: not known)
UNIT_FIELDS = ("unit", "repeat", "system", "documents", "seconds", "new_tokens", "valid", "errors",
               "latency_p50", "latency_p95", "padding_share", "target_forwards", *COSTS)
DOC_FIELDS = ("unit", "repeat", "system", "id", "latency", "new_tokens", "valid", "error", "text")
LABELS = {"ours": "ours: generate_batch with the assistant",  # each label stands alone: a plot may hold any of them
          "shared": "ours: generate_batch with the assistant, shared prefixes",
          "forced": "ours: generate_batch, forced tokens only",
          "forced-shared": "ours: generate_batch, forced tokens only, shared prefixes",
          "hf-xgrammar": "transformers + XGrammar (compact)", "hf-ours": "transformers + our logits_processor"}


@dataclass(frozen=True)
class Document:
    id: str
    text: str

    def messages(self) -> list[dict]:
        return [{"role": "user", "content": TICKET.user + self.text}]


@dataclass(frozen=True)
class Output:
    """One document's result under one system."""

    text: str
    new_tokens: int
    latency: float
    error: str = ""


@dataclass(frozen=True)
class Pass:
    """One system over one chunk: its outputs in document order, and what the forwards computed."""

    outputs: list[Output]
    padding_share: float
    target_forwards: int
    costs: dict = field(default_factory=dict)  # of `COSTS`, those the system knows


def load_documents(path: Path = DOCUMENTS) -> list[Document]:
    return [Document(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def parse_system(name: str) -> tuple[str, int]:
    """"ours:8" -> ("ours", 8); "single" -> ("single", 1)."""
    kind, _, size = name.partition(":")
    if kind not in (*OURS, "single", "hf-xgrammar", "hf-ours") or (kind != "single") != bool(size):
        raise ValueError(f"unknown system {name!r}: single, or one of {', '.join(OURS)}, hf-xgrammar, hf-ours "
                         f"with :B")
    return kind, int(size or 1)


class Runner:
    """Runs one system over a list of documents with one set of models."""

    def __init__(self, model, tokenizer, assistant, max_new_tokens: int):
        self.model, self.tokenizer, self.assistant, self.max_new = model, tokenizer, assistant, max_new_tokens
        found = model.generation_config.eos_token_id
        self.eos = [found] if isinstance(found, int) else list(found)
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos[0]
        self._xgrammar = None

    def ids(self, doc: Document) -> list[int]:
        return chat_ids(self.tokenizer, doc.messages())

    def run(self, system: str, docs: list[Document]) -> Pass:
        kind, size = parse_system(system)
        if kind == "single":
            return self._single(docs)
        if kind in OURS:
            return self._ours(docs, size, *OURS[kind])
        passes = [self._hf(kind, docs[i : i + size]) for i in range(0, len(docs), size)]
        rows = [len(p.outputs) for p in passes]  # weight each batch's padding by its rows
        share = sum(p.padding_share * n for p, n in zip(passes, rows)) / sum(rows)
        return Pass([o for p in passes for o in p.outputs], share, sum(p.target_forwards for p in passes))

    def _single(self, docs: list[Document]) -> Pass:
        outputs, stats = [], []
        for doc in docs:
            start = time.perf_counter()
            out = generate(self.model, self.assistant, tokenizer=self.tokenizer, input_ids=self.ids(doc),
                           schema=TICKET.schema, max_new_tokens=self.max_new)
            outputs.append(Output(out.text, out.stats.new_tokens, time.perf_counter() - start))
            stats.append(out.stats)
        costs = {"target_seconds": sum(s.seconds.target for s in stats),
                 "assistant_forwards": sum(s.assistant_forward_passes for s in stats),
                 "assistant_seconds": sum(s.seconds.assistant for s in stats)}
        return Pass(outputs, 0.0, sum(s.target_forward_passes for s in stats), costs)

    def _ours(self, docs: list[Document], size: int, drafts: bool, share_prefix: bool) -> Pass:
        results = generate_batch(self.model, self.assistant if drafts else None, tokenizer=self.tokenizer,
                                 input_ids=[self.ids(d) for d in docs], schema=TICKET.schema, batch_size=size,
                                 max_new_tokens=self.max_new, share_prefix=share_prefix)
        outputs = [Output(r.text, r.stats.new_tokens, r.stats.latency_seconds, r.error or "") for r in results]
        batch = results[0].batch
        costs = {name: getattr(batch, name) for name in COSTS if name not in STAGES}
        costs |= {f"{stage}_seconds": s for stage, s in batch.stage_seconds.items()}
        return Pass(outputs, batch.padding_share, batch.target_forwards, costs)

    def _hf(self, kind: str, docs: list[Document]) -> Pass:
        ids = [self.ids(d) for d in docs]
        width = max(map(len, ids))
        input_ids = torch.tensor([[self.pad] * (width - len(x)) + x for x in ids])  # (B, width), left-padded
        attention = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids])
        processor = self._processor(kind)
        start = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(input_ids, attention_mask=attention, logits_processor=[processor],
                                      do_sample=False, max_new_tokens=self.max_new, pad_token_id=self.pad,
                                      eos_token_id=self.eos)
        seconds, outputs, real = time.perf_counter() - start, [], sum(map(len, ids))
        for row in out[:, width:].tolist():
            stop = next((i for i, t in enumerate(row) if t in self.eos), None)  # EOS, then padding
            tokens = len(row) if stop is None else stop + 1
            outputs.append(Output(self.tokenizer.decode(row[: stop], skip_special_tokens=True), tokens, seconds))
            real += tokens
        steps = out.shape[1] - width
        return Pass(outputs, 1 - real / (len(ids) * (width + steps)), steps)  # every row runs to the longest's end

    def _processor(self, kind: str):
        if kind == "hf-ours":
            return logits_processor(self.tokenizer, schema=TICKET.schema)
        self._xgrammar = self._xgrammar or xgrammar_compiler(self.model, self.tokenizer, self.eos)
        return xgrammar_processor(self._xgrammar, TICKET.json_schema(), compact=True)


def valid(text: str) -> bool:
    try:
        TICKET.schema.model_validate_json(text)
    except ValueError:
        return False
    return True


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else float("nan")


def measure(runner: Runner, docs: list[Document], systems: list[str], chunk: int, repeats: int,
            out: Path) -> list[dict]:
    """Every (chunk, repeat) unit runs every system in rotated order; rows are appended to the CSVs as they come."""
    budget, runner.max_new = runner.max_new, 12
    for system in systems:  # untimed: grammars compiled, allocators warm, `auto` has costs
        runner.run(system, docs[:2])
    runner.max_new = budget
    chunks = [docs[i : i + chunk] for i in range(0, len(docs), chunk)]
    rows = []
    for repeat, unit, system in interleaved(range(len(chunks)), systems, repeats):
        seconds, result, error = timed(lambda: runner.run(system, chunks[unit]))
        if error:  # a system failing is a result, not a crash
            print(f"unit {unit} {system}: {error}", file=sys.stderr)
            continue
        rows.append(unit_row(unit, repeat, system, chunks[unit], result, seconds))
        write_rows(out / "units.csv", rows[-1:], UNIT_FIELDS, append=True)
        write_rows(out / "documents.csv", [
            {"unit": unit, "repeat": repeat, "system": system, "id": d.id, "latency": o.latency,
             "new_tokens": o.new_tokens, "valid": valid(o.text), "error": o.error, "text": o.text}
            for d, o in zip(chunks[unit], result.outputs)], DOC_FIELDS, append=True)
        print(f"unit {unit} r{repeat} {system:15} {seconds:7.1f} s {60 * len(chunks[unit]) / seconds:6.1f} doc/min "
              f"valid {rows[-1]['valid']}/{len(chunks[unit])}", file=sys.stderr, flush=True)
    return rows


def unit_row(unit: int, repeat: int, system: str, docs: list[Document], result: Pass, seconds: float) -> dict:
    latencies = [o.latency for o in result.outputs]
    return {"unit": unit, "repeat": repeat, "system": system, "documents": len(docs), "seconds": seconds,
            "new_tokens": sum(o.new_tokens for o in result.outputs),
            "valid": sum(valid(o.text) for o in result.outputs), "errors": sum(bool(o.error) for o in result.outputs),
            "latency_p50": percentile(latencies, 0.5), "latency_p95": percentile(latencies, 0.95),
            "padding_share": result.padding_share, "target_forwards": result.target_forwards, **result.costs}


def read_units(path: Path) -> list[dict]:
    return read_rows(path, text=("system",))


def summary(rows: list[dict]) -> dict[str, dict]:
    """Per system: pooled documents per minute and tokens per second, median latencies and padding, validity."""
    out = {}
    for system in dict.fromkeys(r["system"] for r in rows):
        mine = [r for r in rows if r["system"] == system]
        seconds, docs = sum(r["seconds"] for r in mine), sum(r["documents"] for r in mine)
        out[system] = {"docs_per_min": 60 * docs / seconds,
                       "tokens_per_s": sum(r["new_tokens"] for r in mine) / seconds,
                       "p50": statistics.median(r["latency_p50"] for r in mine),
                       "p95": statistics.median(r["latency_p95"] for r in mine),
                       "padding": statistics.mean(r["padding_share"] for r in mine),
                       "valid": sum(r["valid"] for r in mine), "documents": docs, "units": len(mine)}
    return out


ACCOUNTS = {"seconds": "s", "target_forwards": "target forwards", "positions_computed": "positions computed",
            "positions_used": "used", "target_seconds": "target s", "assistant_forwards": "assistant forwards",
            "assistant_positions": "assistant positions", "assistant_seconds": "assistant s",
            "draft_seconds": "draft stage s", **{name: name.replace("_seconds", " s") for name in STAGES
                                                  if name not in ("draft_seconds", "verify_seconds")}}


def accounts(rows: list[dict]) -> list[str]:
    """Per system of ours, the mean per unit of what its forwards ran and what each stage cost (`ACCOUNTS`)."""
    systems = [s for s in dict.fromkeys(r["system"] for r in rows) if parse_system(s)[0] in OURS]
    if not systems or any(r.get("assistant_seconds", "") == "" for r in rows if r["system"] in systems):
        return []  # units.csv from before these were recorded
    lines = ["", "What each unit's forwards ran and cost (ours, mean per unit; the draft stage holds the assistant's "
             "forwards, the target's s its verification forward with the acceptance test):", "",
             f"| system | {' | '.join(ACCOUNTS.values())} |", "|---" * (len(ACCOUNTS) + 1) + "|"]
    for system in systems:
        mine = [r for r in rows if r["system"] == system]
        means = [statistics.mean(r[name] for r in mine) for name in ACCOUNTS]
        lines.append(f"| {system} | " + " | ".join(f"{m:.2f}" if m % 1 else f"{m:.0f}" for m in means) + " |")
    return lines


def ratio(rows: list[dict], faster: str, slower: str) -> tuple[float, float, float] | None:
    """Documents per minute of `faster` over `slower`, paired per unit."""
    return paired([r for r in rows if r["system"] in (faster, slower)], faster, ("unit", "repeat")).get(slower)


def best(stats: dict[str, dict], kind: str) -> str | None:
    mine = [s for s in stats if s.startswith(kind + ":")]
    return max(mine, key=lambda s: stats[s]["docs_per_min"]) if mine else None


def report(rows: list[dict], header: list[str]) -> list[str]:
    stats = summary(rows)
    lines = [*header, "", "| system | documents/min | new tokens/s | latency p50 s | p95 s | padding | valid | units |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {system} | {s['docs_per_min']:.1f} | {s['tokens_per_s']:.1f} | {s['p50']:.2f} | {s['p95']:.2f} | "
              f"{s['padding']:.0%} | {s['valid']}/{s['documents']} | {s['units']} |" for system, s in stats.items()]
    lines += ["", "Paired per unit (documents per minute, geometric mean, 90% interval):", ""]
    pairs = [(top, other) for top in (best(stats, kind) for kind in OURS)
             for other in ("single", best(stats, "hf-xgrammar"), best(stats, "hf-ours"))]
    pairs += [(s, f"hf-xgrammar:{s.split(':')[1]}") for s in stats if s.split(":")[0] in OURS]  # at the same B
    for top, other in dict.fromkeys(pairs):
        if top and other in stats and (r := ratio(rows, top, other)):
            shown = "one unit: no interval" if math.isnan(r[1]) else f"[{r[1]:.2f}, {r[2]:.2f}]"
            lines.append(f"- {top} over {other}: {r[0]:.2f}x {shown}")
    return lines + accounts(rows)


def plot(rows: list[dict], path: Path, title: str) -> None:
    """Documents per minute against the batch size, one line per kind of system (the one-by-one loop flat)."""
    import matplotlib.ticker
    stats = summary(rows)
    fig, ax = pyplot().subplots(figsize=(7, 4.5))
    for kind, label in LABELS.items():
        sizes = sorted(int(s.split(":")[1]) for s in stats if s.startswith(kind + ":"))
        if sizes:
            ax.plot(sizes, [stats[f"{kind}:{b}"]["docs_per_min"] for b in sizes], marker="o", label=label)
    if "single" in stats:
        ax.axhline(stats["single"]["docs_per_min"], color="gray", linestyle="--", label="ours: generate, one by one")
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set(xlabel="batch size B", ylabel="documents per minute (validity: README)")
    ax.set_title(title, fontsize=9), ax.legend(fontsize=8), ax.grid(alpha=0.3)
    save_figure(fig, path, dpi=120)


def parse_args(argv: list[str] | None):
    p = cli.parser("throughput", __doc__)
    cli.add_models(p)
    p.add_argument("--systems", nargs="+", type=str, default=RERUN)
    p.add_argument("--documents", type=Path, default=DOCUMENTS)
    p.add_argument("--skip", type=int, default=0, help="leave out the first N documents")
    p.add_argument("--limit", type=int, default=None, help="then take at most N documents")
    p.add_argument("--chunk", type=int, default=24, help="documents per unit")
    cli.add_run(p)
    p.add_argument("--report-only", action="store_true", help="rebuild README.md and the plot from units.csv")
    args = p.parse_args(argv)
    for system in args.systems:
        parse_system(system)
    return args


def main(argv: list[str] | None = None) -> int:
    argv, args = cli.begin(parse_args, argv)
    args.out.mkdir(parents=True, exist_ok=True)
    quantized = f" ({args.quantize_target})" if args.quantize_target else ""
    title = (f"{args.target}{quantized} + {cli.assistant_label(args)}{', packed' if args.pack else ''}, greedy, "
             f"{args.threads} thread(s)")
    if not args.report_only:
        if (args.out / "units.csv").exists():
            print(f"error: {args.out / 'units.csv'} exists: use another --out or --report-only", file=sys.stderr)
            return 2
        model, tokenizer, assistant = cli.load(args)
        docs = load_documents(args.documents)[args.skip :][: args.limit]
        header = [f"# Throughput over many documents: {args.out.name}", "", *run_lines("experiments.throughput", argv),
                  f"- {title}; {len(docs)} documents (`{args.documents.name}`), units of {args.chunk}, "
                  f"{args.repeats} repeat(s), max_new_tokens {args.max_new_tokens}"]
        (args.out / "header.md").write_text("\n".join(header) + "\n")
        measure(Runner(model, tokenizer, assistant, args.max_new_tokens), docs, args.systems, args.chunk,
                args.repeats, args.out)
    rows = read_units(args.out / "units.csv")
    lines = report(rows, (args.out / "header.md").read_text().splitlines()) + ["", __doc__.split("\n\n", 2)[2].strip()]
    (args.out / "README.md").write_text("\n".join(lines) + "\n")
    documents = sum(r["documents"] for r in rows if r["system"] == rows[0]["system"]) // args.repeats
    plot(rows, args.out / "throughput.png", f"{title}\n{documents} documents x {args.repeats} repeat(s), "
         f"{cpu_name()}; validity in README")
    print("\n".join(report(rows, [])))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""JSON Schema coverage on JSONSchemaBench (MaskBench): compile every schema, walk every test instance.

    python -m experiments.coverage --tokenizer smollm2-135m
    python -m experiments.coverage --tokenizer qwen2.5-coder-0.5b --subset Handwritten --limit 20
    python -m experiments.coverage --policy spec --limit 4   # open objects in any order, as validators read them

For each schema file: compile it to a ready guide (`fsm.Guide.from_schema`, first mask included) in
a forked worker under a per-stage time limit; walk every test instance (compact JSON, key order
kept, tokenized by the tokenizer) through the guide token by token; a schema is *covered* when it
compiles, every valid instance is accepted and every invalid one rejected. Writes to --out:
schemas.csv (one row per schema), failures.csv (every false reject / false accept / crash on an
instance), summary.json, summary.md and coverage.png (see experiments/lib/coverage_report.py).
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np

from experiments.lib import cli
from experiments.lib.report import write_rows

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # children are forked

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "data" / "jsonschemabench"
SCHEMA_COLUMNS = (
    "file subset status keyword pointer error_type message where stage n_valid n_invalid valid_accepted false_rejects "
    "false_rejects_regex false_rejects_token invalid_rejected false_accepts false_accepts_regex_only "
    "tokenization_mismatch walk_errors compile_ms compile_cpu_ms regex_ms dfa_ms index_ms first_mask_ms regex_chars "
    "dfa_states states_visited first_n first_median_us first_p99_us revisit_n revisit_median_us revisit_p99_us "
    "tokens_valid walk_max_ms forced_tokens peak_rss_mb rss_growth_mb wall_s cpu_s load").split()
FAILURE_COLUMNS = "file subset test kind description path detail text".split()


def subset_of(name: str) -> str:
    """`Kubernetes---kb_1.json` -> Kubernetes; `BFCL_parallel_multiple_12.json` -> BFCL_parallel_multiple."""
    stem = Path(name).name
    if "---" in stem:
        return stem.split("---", 1)[0]
    return re.sub(r"_\d+$", "", stem.removesuffix(".json"))


def select_files(data: Path, subsets: list[str] | None = None, limit: int | None = None) -> list[Path]:
    """The schema files, filtered by subset names; with `limit`, the first `limit` of each subset."""
    files = sorted(Path(data).glob("*.json"))
    if subsets:
        files = [f for f in files if subset_of(f.name).lower() in {s.lower() for s in subsets}]
    kept, taken = [], Counter()
    for f in files:
        taken[subset_of(f.name)] += 1
        if limit is None or taken[subset_of(f.name)] <= limit:
            kept.append(f)
    return kept


def run_coverage(files: list[Path], tokenizer, *, timeout: float = 30.0, workers: int = 2,
                 memory_mb: float = 6000.0, progress: bool = True, second_opinion: bool = True, on_row=None,
                 options: dict | None = None) -> dict:
    """Check every file in forked workers; returns {"rows", "failures", "hist_first", "hist_revisit"}.

    `options`: keyword arguments of `fsm.compile_schema` (the default policy when None).

    `second_opinion`: ask jsonschema what is wrong with each falsely accepted instance (slow import).
    """
    from tqdm.auto import tqdm

    from experiments.lib import coverage_worker
    from experiments.lib.coverage_pool import run_pool
    _warm(tokenizer, second_opinion)
    order = sorted(map(str, files), key=lambda f: -os.path.getsize(f))  # big ones first: no long tail
    work = lambda task, report: coverage_worker.check_file(task, tokenizer, report, second_opinion, options)  # noqa: E731
    totals = {"rows": [], "failures": [], "hist_first": np.zeros(len(coverage_worker.STEP_BINS) - 1, np.int64)}
    totals["hist_revisit"] = totals["hist_first"].copy()
    bar = tqdm(total=len(order), disable=not progress, unit="schema", smoothing=0.05)
    for outcome in run_pool(order, work, workers=workers, timeout=timeout, memory_mb=memory_mb):
        row, failures = _row(outcome, totals)
        totals["rows"].append(row)
        totals["failures"] += [{"file": row["file"], "subset": row["subset"], **f} for f in failures]
        if on_row is not None:
            on_row(row, failures)
        covered = sum(r["status"] == "covered" for r in totals["rows"])
        bar.set_postfix(covered=f"{covered / len(totals['rows']):.0%}", refresh=False)
        bar.update()
    bar.close()
    totals["rows"].sort(key=lambda r: r["file"])
    return totals


def _warm(tokenizer, second_opinion: bool) -> None:
    """Build the vocabulary (and import jsonschema) once in the parent; forked workers inherit them."""
    import torch

    import fsm
    if second_opinion:
        import jsonschema  # noqa: F401
    torch.set_num_threads(1)
    fsm.vocabulary_from_tokenizer(tokenizer).walk_layout


def _row(outcome, totals: dict) -> tuple[dict, list]:
    name = Path(outcome.task).name
    row = {"file": name, "subset": subset_of(name), "wall_s": round(outcome.seconds, 3),
           "cpu_s": round(outcome.cpu_seconds, 3), "load": round(os.getloadavg()[0], 2)}
    if outcome.kind != "done":
        status = {"timeout": "timeout", "memory": "memory", "died": "error"}[outcome.kind]
        row.update(status=status, stage=outcome.stage, message=outcome.detail,
                   peak_rss_mb=round(outcome.peak_rss_mb, 1))
        if outcome.kind == "died":
            row["error_type"] = "WorkerDied"
        return row, []
    result = outcome.result
    if "runner_error" in result:
        row.update(status="error", error_type="RunnerError", message=result["runner_error"][:300], stage=outcome.stage)
        return row, []
    for key in ("hist_first", "hist_revisit"):
        if result.get(key) is not None:
            totals[key] += result[key]
    row.update(result["row"])
    return row, result["failures"]


def fsm_provenance() -> dict:
    """Which fsm this run measures: its folder, a hash of its sources, and whether HEAD has them."""
    import fsm
    folder = Path(fsm.__file__).parent
    names = sorted(p.name for p in folder.glob("*.py"))
    digest = lambda texts: hashlib.sha1(b"".join(texts)).hexdigest()[:12]  # noqa: E731
    used = digest((folder / n).read_bytes() for n in names)
    git = lambda *a: subprocess.run(["git", *a], cwd=REPO, capture_output=True).stdout  # noqa: E731
    head = git("rev-parse", "--short", "HEAD").decode().strip()
    committed = digest(git("show", f"HEAD:fsm/{n}") for n in names)
    return {"folder": str(folder), "sources_sha1": used, "head": head, "same_as_head": used == committed}


def _checkpoint(rows_path: Path, failures_path: Path):
    """on_row callback that appends every row and failure to these files as it arrives (a killed run keeps them)."""
    for path in (rows_path, failures_path):
        path.unlink(missing_ok=True)  # a killed run's leftovers

    def write(row: dict, found: list[dict]) -> None:
        write_rows(rows_path, [row], SCHEMA_COLUMNS, digits=None, append=True)
        write_rows(failures_path, [{"file": row["file"], "subset": row["subset"], **f} for f in found],
                   FAILURE_COLUMNS, digits=None, append=True)

    return write


def main(argv: list[str] | None = None) -> None:
    p = cli.parser("coverage", __doc__)
    p.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder of MaskBench *.json files")
    p.add_argument("--tokenizer", default="qwen2.5-coder-0.5b", help="named source, hub id or folder")
    cli.add_pool(p, timeout=30.0, rebuilds="summary.md/png")
    p.add_argument("--memory-mb", type=float, default=6000.0, help="kill a worker above this RSS (MB)")
    p.add_argument("--subset", action="append", help="only this subset (repeatable), e.g. Handwritten")
    p.add_argument("--limit", type=int, help="at most this many schemas per subset")
    p.add_argument("--policy", choices=("compact", "spec"),
                   help="fsm's object policy: compact (closed, schema order; the default) or spec (open, any order)")
    cli.add_out(p, required=False, help="default: experiments/results/coverage/<tokenizer>[-<policy>]")
    args = p.parse_args(argv)
    options = {"policy": args.policy} if args.policy else {}
    policy = f"-{args.policy}" if args.policy else ""
    out = args.out or REPO / "experiments" / "results" / "coverage" / (Path(str(args.tokenizer)).name + policy)
    out.mkdir(parents=True, exist_ok=True)
    from experiments.lib import coverage_report
    if args.report_only:
        coverage_report.rebuild(out)
        return
    from experiments.models import load_tokenizer
    provenance = fsm_provenance()  # now: the working tree may change during a long run
    tokenizer = load_tokenizer(args.tokenizer)
    files = select_files(args.data, args.subset, args.limit)
    if not files:
        p.error(f"no schema files in {args.data} match the filters")
    partial = out / "schemas.partial.csv", out / "failures.partial.csv"
    totals = run_coverage(files, tokenizer, timeout=args.timeout, workers=args.workers, memory_mb=args.memory_mb,
                          on_row=_checkpoint(*partial), options=options)
    write_rows(out / "schemas.csv", totals["rows"], SCHEMA_COLUMNS, digits=None)
    write_rows(out / "failures.csv", totals["failures"], FAILURE_COLUMNS, digits=None)
    for path in partial:
        path.unlink(missing_ok=True)
    setup = {"tokenizer": str(args.tokenizer), "vocab_size": len(tokenizer), "timeout_s": args.timeout,
             "workers": args.workers, "data": str(args.data), "files": len(files),
             "filters": {"subset": args.subset, "limit": args.limit}, "options": options, "fsm": provenance,
             "command": " ".join(["python -m experiments.coverage", *(sys.argv[1:] if argv is None else argv)])}
    summary = coverage_report.write_report(out, totals, setup)
    print(coverage_report.headline(summary))


if __name__ == "__main__":
    main()

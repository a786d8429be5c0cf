"""Differential sweep: the schema compiler against `jsonschema` on instances nobody listed by hand.

For each schema (the Handwritten, Github and Kubernetes parts of ../shared/data/jsonschemabench, plus
generated combinations of allOf/anyOf/oneOf/$ref/unevaluated*/prefixItems/dependentSchemas/contains),
hypothesis-jsonschema draws instances, `mutants` perturbs them, and `jsonschema` judges every compact
text. Under each policy the compiled language must reject every text the oracle rejects (a false
accept is a bug); under "spec" it should accept every valid text (or the schema raised SchemaError).

    python -m experiments.differential --out experiments/results/<name>
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import fsm
from assisted.inputs import validator_class
from experiments.coverage import DEFAULT_DATA
from experiments.lib import cli
from experiments.lib.report import write_rows
from experiments.lib.coverage_worker import compact
from experiments.lib.differential_cases import combination_schema, mutants, valid_instances, value_pool

POLICIES = ("compact", "spec")
SUBSETS = ("Handwritten", "Github", "Kubernetes")


def texts_for(schema, seed: int, n_valid: int, n_mutants: int, pool: list | None = None) -> list[str]:
    """Compact texts of drawn instances (and `pool`), each followed by its mutants; duplicates dropped."""
    rng = random.Random(seed)
    values = valid_instances(schema, n_valid, seed) + list(pool or [])
    texts = {}
    for value in values:
        for v in [value, *mutants(value, rng, n_mutants)]:
            try:
                texts.setdefault(compact(v), None)
            except (TypeError, ValueError):
                continue
    return list(texts)


def judge(schema, texts: list[str], policies=POLICIES) -> dict:
    """Per policy: compile error (keyword) or the false accepts and (under "spec") rejected valid texts."""
    try:
        cls = validator_class(schema)  # the dialect the guide reads, as `value` validation does
    except fsm.SchemaError as error:  # an unknown $schema: the guide refuses it, nothing to compare
        return {"oracle_error": f"SchemaError: {str(error)[:120]}"}
    validator = cls(schema, format_checker=cls.FORMAT_CHECKER)
    try:
        verdicts = {t: validator.is_valid(json.loads(t)) for t in texts}
    except Exception as error:  # noqa: BLE001 - the oracle cannot read the schema: nothing to compare
        return {"oracle_error": f"{type(error).__name__}: {str(error)[:120]}"}
    out = {"n_valid": sum(verdicts.values()), "n_invalid": sum(not v for v in verdicts.values())}
    for policy in policies:
        out[policy] = _judge_policy(schema, verdicts, policy)
    return out


def _judge_policy(schema, verdicts: dict, policy: str) -> dict:
    from fsm.lazy_dfa import LazyDFA

    start = time.process_time()
    try:
        dfa = LazyDFA(fsm.compile_schema(schema, policy=policy))
    except fsm.SchemaError as error:
        return {"schema_error": error.keyword or "-", "message": str(error)[:200]}
    except Exception as error:  # noqa: BLE001 - a crash of the compiler is a finding, not a reason to stop
        return {"schema_error": "crash", "message": f"{type(error).__name__}: {str(error)[:200]}"}
    accepted = {t: dfa.fullmatch(t.encode()) for t in verdicts}
    return {"false_accepts": [t for t, ok in verdicts.items() if accepted[t] and not ok],
            "valid_rejected": [t for t, ok in verdicts.items() if ok and not accepted[t]],
            "cpu_s": round(time.process_time() - start, 3)}


def schema_files(per_subset: int, seed: int) -> list[Path]:
    """A seeded sample of `per_subset` files from each subset (all of Handwritten when it has fewer)."""
    rng, chosen = random.Random(seed), []
    for subset in SUBSETS:
        names = sorted(p for p in DEFAULT_DATA.iterdir() if p.name.startswith(subset))
        chosen += sorted(rng.sample(names, min(per_subset, len(names))))
    return chosen


def run_one(task: str, args, report=lambda stage: None) -> dict:
    """One task ("file:<path>" or "combo:<seed>") -> a result row."""
    report("generate")
    if task.startswith("combo:"):
        seed = int(task.split(":")[1])
        schema = combination_schema(random.Random(seed))
        pool = value_pool(random.Random(seed + 1), 60)
    else:
        record = json.loads(Path(task.split(":", 1)[1]).read_text())
        seed, schema, pool = args.seed, record["schema"], [t["data"] for t in record.get("tests") or []]
    texts = texts_for(schema, seed, args.instances, args.mutants, pool)
    report("judge")
    return {"task": task, "n_texts": len(texts), **judge(schema, texts)}


def summarize(rows: list[dict]) -> dict:
    """Totals per policy: schemas compiled / refused, texts, false accepts, valid texts rejected."""
    summary = {"schemas": len(rows), "oracle_errors": sum("oracle_error" in r for r in rows),
               "timeouts_or_crashes": sum("status" in r for r in rows)}
    judged = [r for r in rows if "compact" in r]
    summary["texts"] = sum(r["n_valid"] + r["n_invalid"] for r in judged)
    summary["valid_texts"] = sum(r["n_valid"] for r in judged)
    for policy in POLICIES:
        done = [r[policy] for r in judged if "false_accepts" in r[policy]]
        summary[policy] = {
            "compiled": len(done), "schema_error": sum("schema_error" in r[policy] for r in judged),
            "false_accepts": sum(len(d["false_accepts"]) for d in done),
            "schemas_with_false_accepts": sum(bool(d["false_accepts"]) for d in done),
            "valid_rejected": sum(len(d["valid_rejected"]) for d in done),
            "valid_rejected_shallow": sum(depth(json.loads(t)) <= SHALLOW for d in done for t in d["valid_rejected"]),
            "schemas_with_valid_rejected": sum(bool(d["valid_rejected"]) for d in done),
            "crashes": sum(r[policy].get("schema_error") == "crash" for r in judged)}
    return summary


SHALLOW = 3  # free-form values nest at most max_recursion_depth (3) deep: deeper rejections are that limit


def depth(value) -> int:
    """Nesting depth of arrays and objects (a scalar is 0)."""
    children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else None
    return 0 if children is None else 1 + max(map(depth, children), default=0)


def main(argv: list[str] | None = None) -> None:
    from experiments.lib.coverage_pool import run_pool

    parser = cli.parser("differential", __doc__)
    parser.add_argument("--per-subset", type=int, default=100, help="schema files per subset (seeded sample)")
    parser.add_argument("--combos", type=int, default=150, help="generated combination schemas")
    parser.add_argument("--instances", type=int, default=10, help="instances drawn per schema")
    parser.add_argument("--mutants", type=int, default=6, help="mutants per instance")
    parser.add_argument("--seed", type=int, default=0)
    cli.add_pool(parser, timeout=60.0, rebuilds="by_subset.csv and schemas.csv (from rows.jsonl)")
    cli.add_out(parser)
    args = parser.parse_args(argv)
    if args.report_only:
        rows = [json.loads(line) for line in (args.out / "rows.jsonl").read_text().split("\n") if line]
        write_subset_csv(rows, args.out / "by_subset.csv")
        write_rows_csv(rows, args.out / "schemas.csv")
        return
    tasks = [f"file:{p}" for p in schema_files(args.per_subset, args.seed)]
    tasks += [f"combo:{args.seed * 100_000 + i}" for i in range(args.combos)]
    args.out.mkdir(parents=True, exist_ok=True)
    rows, start = [], time.time()
    work = lambda task, report: run_one(task, args, report)  # noqa: E731
    for outcome in run_pool(tasks, work, workers=args.workers, timeout=args.timeout):
        row = outcome.result if outcome.kind == "done" else {"status": f"{outcome.kind}:{outcome.stage}"}
        row = {"task": outcome.task, **({"status": row["runner_error"][:200]} if "runner_error" in row else row)}
        rows.append(row)
        print(json.dumps(_brief(row)), flush=True)
    rows.sort(key=lambda r: r["task"])
    (args.out / "rows.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    summary = {**summarize(rows), "wall_s": round(time.time() - start),
               "args": {k: str(v) for k, v in vars(args).items()}}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    write_subset_csv(rows, args.out / "by_subset.csv")
    write_rows_csv(rows, args.out / "schemas.csv")
    print(json.dumps(summary, indent=2))


def subset_of(task: str) -> str:
    return "Combination" if task.startswith("combo:") else Path(task).name.split("_")[0].split("---")[0]


SUBSET_COUNTS = ("timeouts_or_crashes", "oracle_errors", "texts", "valid_texts")  # per subset, the same per policy
POLICY_COUNTS = ("compiled", "schema_error", "false_accepts", "valid_rejected", "valid_rejected_shallow")


def write_subset_csv(rows: list[dict], path: Path) -> None:
    """One line per subset and policy: the summary's counts."""
    groups: dict = {}
    for row in rows:
        groups.setdefault(subset_of(row["task"]), []).append(row)
    lines = []
    for subset, group in sorted(groups.items()):
        summary = summarize(group)
        lines += [{"subset": subset, "policy": policy, "schemas": summary["schemas"],
                   **{k: summary[k] for k in SUBSET_COUNTS}, **{k: summary[policy][k] for k in POLICY_COUNTS}}
                  for policy in POLICIES]
    write_rows(path, lines, ("subset", "policy", "schemas", "timeouts_or_crashes", "oracle_errors", "compiled",
                             "schema_error", "texts", "valid_texts", "false_accepts", "valid_rejected",
                             "valid_rejected_shallow"))


def write_rows_csv(rows: list[dict], path: Path) -> None:
    """One line per schema: texts and, per policy, the compile error or the counts (rows.jsonl has the texts)."""
    columns = ("schema_error", "false_accepts", "valid_rejected", "cpu_s")
    lines = []
    for row in rows:
        line = {"task": row["task"].split("/")[-1], "status": row.get("status", row.get("oracle_error", "")),
                "n_valid": row.get("n_valid", ""), "n_invalid": row.get("n_invalid", "")}
        for policy in POLICIES:
            r = row.get(policy, {})
            line |= {f"{policy}_schema_error": r.get("schema_error", ""), f"{policy}_cpu_s": r.get("cpu_s", ""),
                     f"{policy}_false_accepts": len(r.get("false_accepts", [])),
                     f"{policy}_valid_rejected": len(r.get("valid_rejected", []))}
        lines.append(line)
    per_policy = [f"{p}_{c}" for p in POLICIES for c in columns]
    write_rows(path, lines, ["task", "status", "n_valid", "n_invalid", *per_policy])


def _brief(row: dict) -> dict:
    out = {"task": row["task"].split("/")[-1]}
    for policy in POLICIES:
        r = row.get(policy, {})
        out[policy] = r.get("schema_error") or (len(r.get("false_accepts", [])), len(r.get("valid_rejected", [])))
    return {**out, **({"status": row["status"]} if "status" in row else {})}


if __name__ == "__main__":
    main()

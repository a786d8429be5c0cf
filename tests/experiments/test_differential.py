"""experiments.differential end to end on three generated schemas: forked tasks, rows, the summary and both CSVs,
and --report-only rebuilding the CSVs from rows.jsonl alone."""

from __future__ import annotations

import csv
import json

import pytest

from experiments import differential
from experiments.coverage import DEFAULT_DATA

pytestmark = pytest.mark.skipif(not DEFAULT_DATA.is_dir(), reason="../shared/data/jsonschemabench is not beside "
                                                                  "the checkout")


def _rows(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_a_small_sweep_judges_every_task_and_reports_it(tmp_path, capsys):
    argv = ["--per-subset", "0", "--combos", "3", "--instances", "2", "--mutants", "2", "--workers", "1",
            "--out", str(tmp_path)]
    differential.main(argv)
    rows = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert [r["task"] for r in rows] == ["combo:0", "combo:1", "combo:2"]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["schemas"] == len(rows) and summary["texts"] > 0
    for policy in differential.POLICIES:  # the compiler never accepts a text jsonschema rejects
        assert summary[policy]["false_accepts"] == 0 and summary[policy]["crashes"] == 0
    by_subset = _rows(tmp_path / "by_subset.csv")
    assert [(r["subset"], r["policy"], r["schemas"]) for r in by_subset] == [("Combination", p, "3")
                                                                              for p in differential.POLICIES]
    schemas = _rows(tmp_path / "schemas.csv")
    assert len(schemas) == len(rows) and {"compact_false_accepts", "spec_valid_rejected"} <= set(schemas[0])
    (tmp_path / "by_subset.csv").unlink()
    differential.main(["--report-only", "--out", str(tmp_path)])
    assert _rows(tmp_path / "by_subset.csv") == by_subset


def test_depth_counts_nesting():
    assert differential.depth(1) == 0 and differential.depth([]) == 1 and differential.depth({"a": [[1]]}) == 3

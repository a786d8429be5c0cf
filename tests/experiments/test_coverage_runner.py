"""The JSONSchemaBench coverage runner on a few hand-written schema files (fast; no benchmark data).

The counts must not depend on fsm's policies, which will widen: the instances here are either
plainly valid or plainly invalid, and two are deliberately mislabeled to check how the runner counts
a false reject and a false accept.
"""

from __future__ import annotations

import json
import time

import pytest

from experiments import coverage
from experiments.lib import coverage_report, coverage_worker
from experiments.lib.coverage_pool import run_pool

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


def _test(data, valid: bool, description: str = "") -> dict:
    return {"description": description, "valid": valid, "data": data}


FILES = {
    # covered: both valid accepted, all three invalid rejected (range, missing key, type).
    "Handwritten---person.json": (PERSON, [
        _test({"name": "Ada", "age": 36}, True),
        _test({"name": "Zoë «ü»", "age": 150}, True),
        _test({"name": "Ada", "age": 151}, False),
        _test({"name": "Ada"}, False),
        _test({"name": 3, "age": 1}, False),
    ]),
    # not covered: one valid instance mislabeled invalid (false accept), one invalid labeled valid (false reject).
    "BFCL_simple_7.json": ({"type": "object", "properties": {"n": {"type": "integer", "maximum": 9}}, "required": ["n"],
                            "additionalProperties": False}, [
        _test({"n": 5}, True),
        _test({"n": 7}, False, "mislabeled: accepted by any correct guide"),
        _test({"n": 10}, True, "mislabeled: rejected by any correct guide"),
    ]),
    # unsupported: uniqueItems over unbounded strings cannot be enforced by a regular language.
    "Github_easy---o1.json": ({"type": "array", "items": {"type": "string"}, "uniqueItems": True}, [_test([], True)]),
}


@pytest.fixture()
def data_dir(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    for name, (schema, tests) in FILES.items():
        (folder / name).write_text(json.dumps({"description": name, "meta": {}, "schema": schema, "tests": tests}))
    return folder


def test_subset_names():
    assert coverage.subset_of("Kubernetes---kb_1_Normalized.json") == "Kubernetes"
    assert coverage.subset_of("BFCL_parallel_multiple_12.json") == "BFCL_parallel_multiple"
    assert coverage.subset_of("Github_easy---o1.json") == "Github_easy"
    assert coverage.subset_of("JME_0.json") == "JME"


def test_select_files_filters(data_dir):
    assert [f.name for f in coverage.select_files(data_dir, ["bfcl_simple"])] == ["BFCL_simple_7.json"]
    assert len(coverage.select_files(data_dir, limit=1)) == 3


def test_json_path_at():
    text = '{"a":[1,{"bc":"x"}],"d":true}'
    assert coverage_worker.json_path_at(text, text.index('"x"') + 1) == "/a/1/bc"
    assert coverage_worker.json_path_at(text, text.index('"d"') + 1) == "/d/<key>"
    assert coverage_worker.json_path_at('{"a/b":{"c d":1}}', 10) == "/a~1b/c d/<key>"
    assert coverage_worker.json_path_at(text, text.index("true")) == "/d"


def test_runner_counts(data_dir, smol_tokenizer, tmp_path):
    files = coverage.select_files(data_dir)
    totals = coverage.run_coverage(files, smol_tokenizer, timeout=60, workers=2, progress=False, second_opinion=False)
    rows = {r["file"]: r for r in totals["rows"]}

    person = rows["Handwritten---person.json"]
    assert person["status"] == "covered"
    assert (person["n_valid"], person["valid_accepted"], person["n_invalid"], person["invalid_rejected"]) == (
        2,
        2,
        3,
        3,
    )
    assert person["false_rejects"] == person["false_accepts"] == person["tokenization_mismatch"] == 0
    assert person["compile_ms"] > 0 and person["first_n"] + person["revisit_n"] > 0
    assert 0 < person["forced_tokens"] <= person["tokens_valid"]

    mislabeled = rows["BFCL_simple_7.json"]
    assert mislabeled["status"] == "not_covered"
    assert (mislabeled["valid_accepted"], mislabeled["false_rejects"], mislabeled["false_rejects_regex"]) == (1, 1, 1)
    assert (mislabeled["false_accepts"], mislabeled["invalid_rejected"]) == (1, 0)
    kinds = sorted(f["kind"] for f in totals["failures"] if f["file"] == "BFCL_simple_7.json")
    assert kinds == ["false_accept", "false_reject_regex"]

    unsupported = rows["Github_easy---o1.json"]
    assert (unsupported["status"], unsupported["keyword"]) == ("unsupported", "uniqueItems")

    summary = coverage_report.write_report(
        tmp_path,
        totals,
        {"tokenizer": "smollm2-135m", "timeout_s": 60, "workers": 2, "files": 3, "data": str(data_dir)},
    )
    overall = summary["overall"]
    assert (overall["schemas"], overall["covered"], overall["unsupported"], overall["false_accepts"]) == (3, 1, 1, 1)
    assert summary["subsets"]["BFCL_simple"]["false_reject_schemas"] == 1
    assert [list(pair) for pair in summary["unsupported_keywords"]] == [["uniqueItems", 1]]
    assert {"summary.md", "summary.json", "coverage.png", "README.md"} <= {p.name for p in tmp_path.iterdir()}
    assert "llguidance" in (tmp_path / "summary.md").read_text()


def _sleepy(task: str, report) -> dict:
    report("compile:regex")
    if task == "stuck":
        time.sleep(60)
    return {"task": task}


def test_pool_kills_a_stuck_task():
    """The stuck task (a 60 s sleep) ends as a timeout at its last reported stage: had the pool waited for it, it
    would have come back "done"."""
    outcomes = {o.task: o for o in run_pool(["fast", "stuck", "also fast"], _sleepy, workers=2, timeout=0.5)}
    assert outcomes["stuck"].kind == "timeout" and outcomes["stuck"].stage == "compile:regex"
    assert outcomes["fast"].kind == outcomes["also fast"].kind == "done"
    assert outcomes["fast"].result == {"task": "fast"}

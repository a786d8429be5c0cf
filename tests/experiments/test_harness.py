"""The benchmark harness (`experiments/lib/`): paired intervals, the interleaved order, the task registry, the CLI
flags, the report writer and the systems on a tiny random model."""

from __future__ import annotations

import math

import pytest

from experiments.lib import cli, report, runner, tasks
from experiments.lib.intervals import paired_ratio


def test_paired_ratio_is_a_geometric_mean_with_a_student_t_interval():
    assert paired_ratio([(2.0, 1.0), (4.0, 2.0), (1.0, 0.5)]) == pytest.approx((2.0, 2.0, 2.0))  # no spread
    ratio, low, high = paired_ratio([(2.0, 1.0), (1.0, 1.0)])  # log ratios 0 and log 2: t with 1 dof, 6.314
    half = 6.3138 * math.log(2) / 2  # t * sd / sqrt(n), sd = log 2 / sqrt(2)
    assert (ratio, low, high) == pytest.approx(
        (math.sqrt(2), math.sqrt(2) * math.exp(-half), math.sqrt(2) * math.exp(half)), rel=1e-4)
    ratio, low, high = paired_ratio([(1.1, 1.0), (0.9, 1.0), (1.0, 1.0), (1.05, 1.0)])
    assert low < 1.0 < high  # a difference within the spread is not called
    assert math.isnan(paired_ratio([(3.0, 1.0)])[1])
    with pytest.raises(ValueError, match="at least one pair"):
        paired_ratio([])


def test_paired_pairs_each_system_with_the_judged_one_per_unit_only():
    rows = [{"unit": u, "repeat": r, "system": s, "seconds": sec * (2 if u == "b" else 1)}
            for u in ("a", "b") for r in (0, 1) for s, sec in (("slow", 4.0), ("ours", 1.0))]
    rows.append({"unit": "c", "repeat": 0, "system": "slow", "seconds": 100.0})  # ours never ran c: not paired
    found = runner.paired(rows, "ours", ("unit", "repeat"))
    assert set(found) == {"slow"} and found["slow"] == pytest.approx((4.0, 4.0, 4.0))
    assert runner.span((4.0, 3.0, 5.0)) == "4.00x [3.00, 5.00]" and runner.span((2.0, math.nan, math.nan)) == "2.00x"


def test_runner_interleaves_repeats_outermost_and_rotates_the_systems_per_unit():
    order = list(runner.interleaved(["u", "v"], ["a", "b", "c"], repeats=2))
    assert [(r, u) for r, u, _ in order[::3]] == [(0, "u"), (0, "v"), (1, "u"), (1, "v")]
    assert ["".join(s for _, _, s in order[i : i + 3]) for i in range(0, 12, 3)] == ["abc", "bca", "cab", "abc"]
    by_unit = list(runner.interleaved(["u", "v"], lambda unit: ["a", "b"] if unit == "u" else ["c", "d", "e"]))
    assert [s for _, _, s in by_unit] == ["a", "b", "d", "e", "c"]  # each unit's own systems, rotated at its place
    calls = []
    rows = runner.run(["u"], ["a", "b"], lambda unit, s, r: calls.append((unit, s, r)) or {"unit": unit}, repeats=2)
    assert calls == [("u", "a", 0), ("u", "b", 0), ("u", "b", 1), ("u", "a", 1)]
    assert rows[2] == {"repeat": 1, "system": "b", "unit": "u"}


def test_timed_records_a_failing_system_instead_of_raising():
    seconds, result, error = runner.timed(lambda: 1 / 0)
    assert seconds >= 0 and result is None and error.startswith("ZeroDivisionError")
    assert runner.timed(lambda: 7)[1:] == (7, "")


def test_the_task_registry_holds_every_task_once_and_validates_against_its_schema():
    assert len(tasks.TASKS) == len({*tasks.DEMO, *tasks.HELD_OUT, *tasks.BUDGET, tasks.TICKET})
    assert [t.name for t in tasks.HELD_OUT] == ["invoice", "patient", "flight", "review"]
    assert tasks.BUDGET[-1] is tasks.task("invoice") and tasks.DEMO == (tasks.CHARACTER, tasks.EMPLOYEE)
    with pytest.raises(KeyError, match="no task 'nope'"):
        tasks.task("nope")
    text = '{"name":"Aurora","age":23,"armor":"leather","strength":10}'
    assert tasks.validate(tasks.CHARACTER, text)
    assert tasks.validate(tasks.CHARACTER, tasks.extract_json("```json\n" + text + "\n```"))
    assert not tasks.validate(tasks.CHARACTER, '{"name":"Aurora"}') and not tasks.validate(tasks.CHARACTER, "not json")
    patient = tasks.task("patient").json_schema()
    assert patient["properties"]["blood_type"]["pattern"] == "^(A|B|AB|O)[+-]$" and "allergies" in patient["required"]
    assert tasks.CHARACTER.messages(False)[0]["content"].endswith("nothing else.")


def test_the_cli_takes_every_spelling_a_cited_command_used():
    p = cli.parser("x", "doc")
    cli.add_models(p)
    cli.add_run(p, out_required=False, temperatures=[0.0])
    for flags, quantize in (([], None), (["--assistant-int4"], "int4"), (["--int4-assistant"], "int4"),
                            (["--assistant-int8"], "int8"), (["--int8-assistant"], "int8")):
        args = p.parse_args(flags)
        assert cli.assistant_quantization(args) == quantize
        assert cli.assistant_label(args) == "qwen2.5-coder-0.5b" + (f" ({quantize} copy)" if quantize else "")
    assert p.parse_args(["--pack"]).pack and p.parse_args(["--packed-target"]).pack
    packed_int4 = p.parse_args(["--pack", "--quantize-target", "int4"])
    assert cli.target_label(packed_int4) == "qwen2.5-coder-1.5b (packed) (int4)"
    with pytest.raises(SystemExit):
        p.parse_args(["--assistant-int4", "--assistant-int8"])  # one copy at a time


def test_report_writes_the_run_and_reads_its_rows_back(tmp_path):
    rows = [{"task": "a", "seconds": 1.23456, "new_tokens": 3, "valid": True, "extra": "left out"}]
    report.write_run(tmp_path / "run", "A run", report.run_lines("experiments.x", ["--out", "y"]), ["body"], rows,
                     ("task", "seconds", "new_tokens", "valid"))
    readme = (tmp_path / "run" / "README.md").read_text()
    assert readme.startswith("# A run\n\n- command: `python -m experiments.x --out y`") and "- code: commit" in readme
    assert report.read_rows(tmp_path / "run" / "results.csv") == [
        {"task": "a", "seconds": 1.2346, "new_tokens": 3, "valid": True}]
    assert report.table(["a", "b"], [[1, 2]]) == ["| a | b |", "|---|---|", "| 1 | 2 |"]


def test_the_forward_cost_timer_leaves_the_prefix_cached(smol_tokenizer):
    from drafting.kv_cache import new_cache
    from experiments.lib.timing import Prefixed
    from tests.helpers_models import threads, tiny_llama

    model = tiny_llama(len(smol_tokenizer), seed=0)
    ids = smol_tokenizer("The cat sat on the mat and looked around").input_ids
    with threads(1):
        timer = Prefixed(model, ids[:5])
        assert timer.seconds(ids[5:8]) > 0 and timer.cache.get_seq_length() == 5  # cropped back to the prefix
        assert all(timer.seconds(ids[5 : 5 + k]) > 0 for k in (1, 2, 4))  # every width, again after each crop
    assert new_cache().get_seq_length() == 0

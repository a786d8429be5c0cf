"""experiments.mask_speed on hand-written schema files: the sample, a walk's verdicts and the totals (no timings
judged; llguidance and XGrammar only where installed)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from experiments import mask_speed

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


@pytest.fixture
def data_dir(tmp_path):
    files = {"Github_easy---a.json": [({"name": "Ada", "age": 36}, True)],
             "Github_easy---b.json": [({"name": 1}, False), ({"name": "Bo", "age": 2}, True)],
             "Github_easy---c.json": [({"name": 1}, False)],  # no valid instance: never sampled
             "BFCL_simple_7.json": [({"name": "Cy", "age": 3}, True)]}
    for name, tests in files.items():
        doc = {"schema": PERSON, "tests": [{"data": d, "valid": v} for d, v in tests]}
        (tmp_path / name).write_text(json.dumps(doc))
    return tmp_path


def test_sample_takes_the_first_valid_instance_per_file(data_dir):
    drawn = mask_speed.sample(5, 0, data_dir)
    assert sorted((subset, name, instance["name"]) for subset, name, _, instance in drawn) == [
        ("BFCL_simple", "BFCL_simple_7.json", "Cy"), ("Github_easy", "Github_easy---a.json", "Ada"),
        ("Github_easy", "Github_easy---b.json", "Bo")]
    assert len(mask_speed.sample(1, 0, data_dir)) == 2  # one per subset


def test_walk_accepts_a_valid_instance_and_names_the_rejected_token(smol_tokenizer):
    ours = mask_speed.Ours(smol_tokenizer)
    good = smol_tokenizer.encode('{"name":"Ada","age":36}', add_special_tokens=False)
    row = mask_speed.walk(ours, PERSON, good)
    assert row["status"] == "ok" and row["walk_s"] >= 0 and row["slow_positions"] <= len(good)
    bad = smol_tokenizer.encode('{"name":1}', add_special_tokens=False)
    position = next(k for k in range(len(bad)) if "1" in smol_tokenizer.decode(bad[k]))
    assert mask_speed.walk(ours, PERSON, bad)["status"] == f"rejected token {position}"
    assert mask_speed.walk(ours, PERSON, good[:-1])["status"] == "not final"
    assert mask_speed.walk(ours, {"type": "nonsense"}, good)["status"].startswith("compile error")


def test_summary_counts_only_schemas_every_system_walked():
    rows = [{"schema": "a", "system": "ours", "status": "ok", "compile_s": 1.0, "walk_s": 3.0,
             "max_position_ms": 5.0, "slow_positions": 2},
            {"schema": "a", "system": "other", "status": "ok", "compile_s": 0.5, "walk_s": 0.5,
             "max_position_ms": 1.0, "slow_positions": 0},
            {"schema": "b", "system": "ours", "status": "ok", "compile_s": 9.0, "walk_s": 9.0,
             "max_position_ms": 99.0, "slow_positions": 9},
            {"schema": "b", "system": "other", "status": "rejected token 3", "compile_s": 0.1}]
    lines = mask_speed.summary(rows, ["ours", "other"])
    assert lines[0].startswith("1 of 2 schemas") and "ours 2, other 1" in lines[0]
    assert "| ours | 1.000 | 3.000 | 4.000 | 1.00x | 1.00x | 5.0 | 2 |" in lines
    assert "| other | 0.500 | 0.500 | 1.000 | 4.00x | 4.00x | 1.0 | 0 |" in lines


@pytest.mark.parametrize("name", ["llguidance", "xgrammar"])
def test_reference_systems_walk_the_same_instance(name, smol_tokenizer):
    if importlib.util.find_spec(name) is None:
        pytest.skip(f"{name} is not installed (an optional benchmark dependency)")
    system = mask_speed.SYSTEMS[name](smol_tokenizer)
    good = smol_tokenizer.encode('{"name":"Ada","age":36}', add_special_tokens=False)
    assert mask_speed.walk(system, PERSON, good)["status"] == "ok"
    bad = smol_tokenizer.encode('{"name":1}', add_special_tokens=False)
    assert mask_speed.walk(system, PERSON, bad)["status"].startswith("rejected token")

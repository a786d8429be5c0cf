"""The throughput experiment end to end on a tiny random model: every system runs, rows and the report come out."""

from __future__ import annotations

import pytest

from experiments import throughput
from tests.helpers_models import tiny_llama


@pytest.fixture(scope="module")
def runner(smol_tokenizer):
    model = tiny_llama(len(smol_tokenizer), seed=0)
    model.generation_config.eos_token_id = smol_tokenizer.eos_token_id
    return throughput.Runner(model, smol_tokenizer, tiny_llama(len(smol_tokenizer), seed=1), max_new_tokens=8)


def test_documents_are_written_for_the_experiment():
    docs = throughput.load_documents()
    assert len(docs) >= 40 and len({d.id for d in docs}) == len(docs)
    assert len({len(d.text) // 80 for d in docs}) >= 3  # varied lengths


def test_systems_parse_and_bad_names_are_refused():
    assert throughput.parse_system("ours:8") == ("ours", 8)
    assert throughput.parse_system("single") == ("single", 1)
    assert throughput.parse_system("forced-shared:4") == ("forced-shared", 4)
    for bad in ("ours", "single:2", "vllm:4", "hf-ours:x"):
        with pytest.raises(ValueError):
            throughput.parse_system(bad)


def test_every_system_runs_and_the_report_pairs_ours_with_the_others(runner, tmp_path):
    docs = throughput.load_documents()[:3]
    systems = ["single", "ours:2", "hf-ours:2"]
    rows = throughput.measure(runner, docs, systems, chunk=3, repeats=2, out=tmp_path)
    assert [r["system"] for r in rows] == ["single", "ours:2", "hf-ours:2", "ours:2", "hf-ours:2", "single"]
    assert all(r["documents"] == 3 and r["new_tokens"] > 0 and r["errors"] == 0 for r in rows)
    read = throughput.read_units(tmp_path / "units.csv")
    assert [(r["system"], r["documents"], r["new_tokens"]) for r in read] == \
        [(r["system"], r["documents"], r["new_tokens"]) for r in rows]
    lines = throughput.report(read, ["# run"])
    assert any(line.startswith("| ours:2 |") for line in lines)
    assert any("ours:2 over single" in line for line in lines)
    assert any("ours:2 over hf-ours:2" in line for line in lines)
    ours = [r for r in read if r["system"] == "ours:2"]  # what the forwards ran and cost, per unit
    assert all(r["positions_used"] > 0 and r["verify_seconds"] > 0 and r["draft_seconds"] >= r["assistant_seconds"]
               for r in ours)
    assert all(r["target_seconds"] > 0 for r in read if r["system"] == "single")
    assert all(r["assistant_positions"] == "" for r in read if r["system"] == "hf-ours:2")  # not known: blank
    assert sum(line.startswith("| ours:2 |") for line in lines) == 2 and any("assistant positions" in line
                                                                             for line in lines)
    throughput.plot(rows, tmp_path / "throughput.png", "tiny")
    assert (tmp_path / "throughput.png").stat().st_size > 0
    assert len((tmp_path / "documents.csv").read_text().splitlines()) == 1 + 6 * 3


def test_left_padded_batches_report_their_padding(runner):
    docs = throughput.load_documents()[:2]
    result = runner.run("hf-ours:2", docs)
    assert len(result.outputs) == 2 and 0 < result.padding_share < 1


@pytest.mark.parametrize("system", ["shared:2", "forced:2", "forced-shared:2"])
def test_the_cli_engine_and_the_engine_without_drafts_run(runner, system):
    docs = throughput.load_documents()[:3]
    result = runner.run(system, docs)
    assert len(result.outputs) == 3 and all(o.new_tokens > 0 and not o.error for o in result.outputs)

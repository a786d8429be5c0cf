"""The headline-figures command end to end on a tiny random pair: CSVs, three PNGs, README, resume, redraw."""

from __future__ import annotations

import csv

import pytest

from experiments import figures
from assisted.models.loading import set_eos
from tests.helpers_models import threads, tiny_llama


@pytest.fixture(scope="module")
def tiny(smol_tokenizer):
    """A 1-layer random Llama with SmolLM2's vocabulary, as target and as its own assistant."""
    model = tiny_llama(len(smol_tokenizer), seed=0)
    set_eos(smol_tokenizer, model)
    return model, smol_tokenizer, model


def _rows(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_figures_command_end_to_end_on_a_tiny_pair(tiny, tmp_path):
    pytest.importorskip("xgrammar")
    out = tmp_path / "run"
    argv = ["--target", "tiny", "--assistant", "tiny", "--per-class", "1", "--tasks", "patient",
            "--max-new-tokens", "4", "--structured-max-new-tokens", "12", "--threads", "1", "--out", str(out)]
    with threads(1):
        assert figures.main(argv, pair=tiny) == 0
    plain, structured = _rows(out / "plain.csv"), _rows(out / "structured.csv")
    temperatures = {float(r["temperature"]) for r in plain}
    assert len(temperatures) >= 6 and min(temperatures) == 0 and max(temperatures) >= 1.5
    assert len(plain) == 5 * len(temperatures) * len(figures.PLAIN)  # five classes, one prompt each
    assert {r["system"] for r in plain} == set(figures.PLAIN)
    assert len(structured) == len(temperatures) * len(figures.STRUCTURED)
    assert {float(r["temperature"]) for r in structured} == temperatures
    assert all(r["valid"] in ("True", "False") and r["error"] == "" for r in structured)
    for name in ("greedy.png", "sampling.png", "structured.png"):
        assert (out / name).read_bytes()[:4] == b"\x89PNG"
    readme = (out / "README.md").read_text()
    assert "- command: `python -m experiments.figures" in readme and figures.llama_cpp_note() in readme
    assert "- code: commit" in readme and "torch threads 1" in readme and "| 1.5 | 5 |" in readme
    with threads(1):
        assert figures.main(argv, pair=tiny) == 0  # a rerun skips every cell already written
    assert len(_rows(out / "plain.csv")) == len(plain)
    (out / "greedy.png").unlink()
    assert figures.main(["--out", str(out), "--report-only"]) == 0
    assert (out / "greedy.png").exists()


def test_schedule_covers_every_class_and_task_first():
    args = figures.parse_args(["--repeats", "1"])
    prompts = [{"class": c, "name": f"{c}{i}"} for c in "ab" for i in range(2)]
    units = figures.schedule(args, prompts, ["t1", "t2"])
    assert [u[1] if u[0] == "structured" else u[1]["name"] for u in units] == ["a0", "t1", "b0", "t2", "a1", "b1"]
    assert figures.parse_args([]).temperatures == [0.0, 0.3, 0.6, 0.9, 1.2, 1.5]


def test_the_structured_view_without_xgrammar_is_refused_before_any_model_loads(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(figures, "xgrammar_version", lambda: None)
    monkeypatch.setattr(figures.cli, "load", lambda args: pytest.fail("loaded models"))
    assert figures.main(["--out", str(tmp_path / "run")]) == 2
    assert "XGrammar" in capsys.readouterr().err and not (tmp_path / "run").exists()


def test_the_setup_label_names_the_target_s_form():
    label = figures.setup_label(figures.parse_args(["--quantize-target", "int4", "--assistant-int4"]))
    assert "(int4)" in label and "float32" not in label
    assert "(float32, packed)" in figures.setup_label(figures.parse_args(["--packed-target"]))

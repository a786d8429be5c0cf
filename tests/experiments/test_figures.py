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


def test_the_plain_view_alone_needs_no_xgrammar_and_pairs_ours_with_each_system(tiny, tmp_path, monkeypatch):
    monkeypatch.setattr(figures, "xgrammar_version", lambda: None)
    out = tmp_path / "plain"
    argv = ["--target", "tiny", "--assistant", "tiny", "--views", "plain", "--per-class", "1", "--temperatures", "0",
            "--max-new-tokens", "4", "--out", str(out)]
    with threads(1):
        assert figures.main(argv, pair=tiny) == 0
    assert len(_rows(out / "plain.csv")) == 5 * len(figures.PLAIN) and not (out / "structured.csv").exists()
    readme = (out / "README.md").read_text()
    assert "Ours (auto) against each system" in readme and "| over target alone | over transformers" in readme
    assert "| all | 5 |" in readme and "JSON extraction" not in readme


def test_the_structured_systems_always_hold_the_reference_and_ours_full():
    args = figures.parse_args(["--structured-systems", "xgrammar", "xgrammar+assistant"])
    assert args.structured_systems == ["xgrammar-compact", "xgrammar", "xgrammar+assistant", "full"]
    assert figures.parse_args([]).structured_systems == list(figures.STRUCTURED)
    with pytest.raises(SystemExit):
        figures.parse_args(["--views", "llama"])


def test_ours_full_is_paired_per_object_and_a_failing_system_is_listed_not_timed():
    from experiments.lib import figures_report
    rows = [{"task": t, "temperature": 0.0, "repeat": r, "system": s, "seconds": sec * (1 + 0.1 * r),
             "new_tokens": tokens, "valid": not error, "error": error, "text": "{}"}
            for t in ("a", "b") for r in (0, 1)
            for s, sec, tokens, error in (("xgrammar", 8.0, 20, ""), ("xgrammar-compact", 4.0, 10, ""),
                                          ("xgrammar+assistant", 0.1, 0, "AssertionError: "), ("full", 2.0, 10, ""))]
    assert all("xgrammar+assistant" not in u for u in figures_report.units(rows, "task").values())
    lines = figures_report.structured_lines(rows, budget=96)
    per_object = lines[lines.index(next(x for x in lines if x.startswith("Ours full against"))) + 2:]
    assert per_object[0] == ("| temperature | units | over transformers + XGrammar (target alone) | over transformers "
                             "+ XGrammar (its defaults: any whitespace) | over transformers assisted + XGrammar |")
    assert per_object[2].startswith("| 0.0 | 4 | 2.00 [2.00, 2.00] | 4.00 [4.00, 4.00] | nan")  # per token: 2.00
    assert "- error, xgrammar+assistant: AssertionError: " in lines
    assert any("transformers assisted + XGrammar 0/4" in x for x in lines)

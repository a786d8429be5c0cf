"""Fast tests of the experiment CLIs: argument parsing and tiny end-to-end cells on random models."""

from __future__ import annotations

import argparse
import copy
import hashlib

import pytest

from experiments import demo, speedup
from experiments.lib.tasks import half_of, load_prompts, set_eos
from tests.helpers_models import threads, tiny_llama


@pytest.fixture(scope="module")
def tiny(smol_tokenizer):
    """A 1-layer random Llama with SmolLM2's vocabulary and tokenizer (chat template included)."""
    model = tiny_llama(len(smol_tokenizer), seed=0)
    set_eos(smol_tokenizer, model)  # the EOS set and pad id every experiment's models get
    return model, smol_tokenizer


def test_parsers():
    a = speedup.parse_args(["--temperatures", "0", "0.6", "--max-new-tokens", "8", "--repeats", "1", "--out", "x"])
    assert a.temperatures == [0.0, 0.6] and a.max_new_tokens == 8 and a.repeats == 1 and str(a.out) == "x"
    assert speedup.parse_args([]).temperatures == [0.0, 0.3, 0.6, 0.9, 1.2]
    assert demo.parse_args(["--assistant"]).assistant and not demo.parse_args([]).assistant
    from experiments.lib.cli import assistant_label, assistant_quantization
    for flags, quantize in (([], None), (["--assistant-int4"], "int4"), (["--assistant-int8"], "int8")):
        parsed = speedup.parse_args(flags)
        assert assistant_quantization(parsed) == quantize
        assert assistant_label(parsed) == "qwen2.5-coder-0.5b" + (f" ({quantize} copy)" if quantize else "")
    with pytest.raises(SystemExit):
        speedup.parse_args(["--assistant-int4", "--assistant-int8"])  # one copy at a time


def test_prompt_split_is_fixed_balanced_and_disjoint():
    everything = load_prompts()
    classes = {p["class"] for p in everything}
    assert len(everything) >= 60 and classes == {"code", "extraction", "prose", "chat", "math"}
    assert len({p["name"] for p in everything}) == len(everything)
    tuning, validation = load_prompts(half="tuning"), load_prompts(half="validation")
    assert {p["name"] for p in tuning}.isdisjoint(p["name"] for p in validation)
    assert len(tuning) + len(validation) == len(everything)
    for half in (tuning, validation):  # every class has at least five prompts in each half
        assert all(sum(p["class"] == c for p in half) >= 5 for c in classes)
    assert all(half_of(p["name"]) == "tuning" for p in tuning)  # the halves are what half_of says ...
    assert all(half_of(p["name"]) == "validation" for p in validation)
    assert half_of("py-lru") == ("tuning", "validation")[hashlib.sha256(b"py-lru").digest()[0] % 2]  # ... by the hash
    assert len(load_prompts(half="validation", per_class=1)) == 5
    with pytest.raises(ValueError, match="half"):
        load_prompts(half="test")


def test_speedup_runs_the_validation_half_with_chosen_systems():
    args = speedup.parse_args(["--systems", "hf-heuristic"])
    assert args.half == "validation"
    assert speedup.chosen_systems(args.systems) == ("target", "hf-heuristic", "ours-auto")


def test_speedup_cell_end_to_end(tiny, tmp_path):
    model, tok = tiny
    args = argparse.Namespace(temperatures=[0.0, 1.0], repeats=1, max_new_tokens=4, num_assistant_tokens=3, seed=1000,
                              target="tiny", assistant="tiny", quantize_target=None, device="cpu", dtype="float32",
                              warmup=True, systems=list(speedup.SYSTEMS))
    prompts = [{"class": c, "name": c, "prompt": "hi"} for c in ("code", "prose")]
    helper = copy.deepcopy(model)  # a separate module, so the forward hooks count each model alone
    with threads(1):
        rows = speedup.run(args, model, helper, tok, prompts, progress=False)
    assert len(rows) == 2 * 2 * len(speedup.SYSTEMS)
    greedy = [r for r in rows if r["temperature"] == 0.0 and r["system"] not in ("target", "ours-auto")]
    assert all(r["tokens_per_forward"] > 1 for r in greedy if r["new_tokens"] > 1)  # itself as assistant
    assert all(r["mean_k"] >= 0 for r in rows if r["system"] == "ours-auto")  # auto may decode plainly (k = 0)
    summary = speedup.summarize(rows)
    speedup.write(rows, summary, args, tmp_path / "out", "test")
    assert {p.name for p in (tmp_path / "out").iterdir()} == {"results.csv", "greedy.png", "sampling.png", "README.md"}
    (tmp_path / "out" / "README.md").unlink()
    assert speedup.main(["--out", str(tmp_path / "out"), "--report-only"]) == 0  # rebuilt from results.csv alone
    readme = (tmp_path / "out" / "README.md").read_text()
    assert "ours-auto/target" in readme and "| best other |" in readme
    assert "| code | 2 |" in readme and "| T = 1.0 | 2 |" in readme  # pooled per class and temperature
    for i, shard in enumerate(((r for r in rows if r["class"] == "code"), (r for r in rows if r["class"] != "code"))):
        speedup.write(list(shard), summary, args, tmp_path / "sharded" / f"shard-{i}", f"run shard {i}")
    assert speedup.main(["--out", str(tmp_path / "sharded"), "--report-only"]) == 0  # the shards, reported together
    merged = (tmp_path / "sharded" / "README.md").read_text()
    assert "run shard 0`; `run shard 1`; `python -m experiments.speedup" in merged and "| all | 4 |" in merged
    (tmp_path / "out" / "README.md").write_text(readme.replace("- code: commit", "- code: commit 1234567 was"))
    assert speedup.main(["--out", str(tmp_path / "out"), "--report-only"]) == 0
    assert "- code: commit 1234567 was" in (tmp_path / "out" / "README.md").read_text()  # the run's commit, kept
    back = speedup.read_rows(tmp_path / "out" / "results.csv")
    assert [(r["system"], r["new_tokens"], r["repeat"]) for r in back] == [
        (r["system"], r["new_tokens"], r["repeat"]) for r in rows
    ]
    assert helper.generation_config.num_assistant_tokens_schedule != "heuristic"  # restored afterwards


def test_speedup_is_per_new_token():
    cell = {"class": "prose", "prompt": "story", "temperature": 1.2, "repeat": 0, "tokens_per_forward": 1.0,
            "acceptance_rate": float("nan"), "mean_k": float("nan"), "target_forwards": 1}
    target = dict(cell, system="target", seconds=6.0, new_tokens=12)  # sampled: it stopped early
    ours = dict(cell, system="ours", seconds=10.0, new_tokens=40)
    assert speedup._speedup([target, ours], ours) == pytest.approx(2.0)  # 0.5 s per token against 0.25 s
    assert speedup.summarize([target, ours])[("prose", 1.2, "ours")]["per_token"] == pytest.approx(0.25)


def test_vs_xgrammar_table_pairs_full_with_each_system_per_task_and_run():
    from experiments import vs_xgrammar

    assert vs_xgrammar.chosen(["xgrammar"]) == ("xgrammar", "full")
    rows = [{"task": t, "repeat": r, "system": s, "seconds": sec * (1 + 0.1 * r), "new_tokens": 10, "valid": True,
             "error": "", "text": "{}"}
            for t in ("a", "b") for r in (0, 1) for s, sec in (("xgrammar", 8.0), ("full", 2.0))]
    lines = vs_xgrammar.table(rows)
    assert lines[2].startswith("| xgrammar | 8.40 (10) | 8.40 (10) | 4/4 | 16.80 | 4.00x [4.00, 4.00]")
    assert lines[3].startswith("| full |")

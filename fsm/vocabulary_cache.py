"""The vocabulary index (token bytes, their WalkLayout and its TokenTrie) kept on disk, once per machine and tokenizer.

A file is named by a hash of what the index is made of: every token's piece (or, for a tokenizer loaded from a folder
with a tokenizer.json, that file's bytes and a sample of the pieces: 70 ms less), the special and added tokens, the
decoder's configuration and the logits width. It is never trusted blindly: it records the key it was built for, and
every array in it carries the zip format's CRC-32, which reading checks (a file that fails, truncated or corrupt, is
rebuilt and replaced). Writers write a temporary file in the same folder and rename it over the old one, so concurrent
writers and readers only ever see whole files.

The folder is ``$STRUCTSPEC_VOCAB_CACHE``, else ``$STRUCTSPEC_CACHE/vocabularies``, else
``~/.cache/structured-speculation/vocabularies``; ``STRUCTSPEC_VOCAB_CACHE=off`` turns the cache off.
Vocabularies under MIN_CACHED_TOKENS tokens, and tokenizers without a Rust backend, are built in memory only.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import numpy as np

FORMAT = 2  # bump when the layout or the way token bytes are read changes
MIN_CACHED_TOKENS = 4096  # smaller vocabularies build faster than a file loads
SAMPLED_PIECES = 1024  # pieces read into the key of a tokenizer whose tokenizer.json is known (all of them otherwise)
_ARRAYS = ("blob", "offsets", "order", "counts", "lengths", "tail_bytes", "valid_utf8", "char_counts", "columns",
           "trie_nodes", "trie_bytes", "trie_children", "trie_end_start", "trie_ends", "trie_end_rows")


def cache_dir() -> Path | None:
    """The folder of the cached vocabularies, or None when the cache is off."""
    return cache_folder("STRUCTSPEC_VOCAB_CACHE", "vocabularies")


def cache_folder(variable: str, name: str) -> Path | None:
    """``$variable``, else ``$STRUCTSPEC_CACHE/name``, else ``~/.cache/structured-speculation/name``; None where
    ``variable=off``."""
    chosen = os.environ.get(variable)
    if chosen == "off":
        return None
    if chosen:
        return Path(chosen).expanduser()
    root = os.environ.get("STRUCTSPEC_CACHE") or Path.home() / ".cache" / "structured-speculation"
    return Path(root).expanduser() / name


def content_key(tokenizer, vocab_size: int) -> str | None:
    """sha256 hex of what the token bytes of `tokenizer` are made of; None for a tokenizer without a Rust backend."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    decoder = None if backend.decoder is None else backend.decoder.__getstate__().decode()
    added = sorted((i, t.content, bool(t.special)) for i, t in tokenizer.added_tokens_decoder.items())
    header = json.dumps([FORMAT, vocab_size, len(tokenizer), decoder, sorted(tokenizer.all_special_ids), added])
    digest = hashlib.sha256(header.encode())
    count = min(vocab_size, len(tokenizer))
    file = _tokenizer_file(tokenizer)
    if file is not None:  # its bytes stand for the pieces, and a sample of the pieces guards against a file changed
        digest.update(b"file\x00" + hashlib.sha256(file.read_bytes()).digest())  # on disk since it was loaded
    ids = range(0, count, max(1, count // SAMPLED_PIECES)) if file is not None else range(count)
    pieces = [backend.id_to_token(i) for i in ids]  # None: no token at that id
    if None in pieces:
        pieces = ["\x01" if p is None else p for p in pieces]
    digest.update("\x00".join(pieces).encode("utf-8", "surrogatepass"))
    return digest.hexdigest()


def _tokenizer_file(tokenizer) -> Path | None:
    """The tokenizer.json the tokenizer was loaded from, where it came from a folder that holds one."""
    folder = Path(str(getattr(tokenizer, "name_or_path", "") or ""))
    file = folder / "tokenizer.json"
    return file if folder.is_dir() and file.is_file() else None


def load(path: Path, key: str, layout_type):
    """(token_bytes, layout) from the file at `path` when it is whole and built for `key`, else None. `layout_type`:
    `fsm.vocabulary.WalkLayout` (passed in: that module imports this one)."""
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {name: data[name] for name in _ARRAYS}
            if str(data["key"]) != key:  # a damaged array raised on its read (zipfile checks each CRC-32)
                return None
    except Exception:  # noqa: BLE001 - a damaged file fails in many ways (zipfile, numpy): rebuilt, whichever
        return None
    blob, offsets, counts = arrays["blob"].tobytes(), arrays["offsets"].tolist(), arrays["counts"]
    token_bytes = tuple(blob[a:b] for a, b in zip(offsets[:-1], offsets[1:]))
    starts = np.concatenate([[0], np.cumsum(counts)])
    columns = tuple(arrays["columns"][starts[j]:starts[j + 1]] for j in range(len(counts)))
    layout = layout_type(arrays["order"], columns, counts, arrays["lengths"], arrays["tail_bytes"],
                        arrays["valid_utf8"], arrays["char_counts"], prebuilt_trie=_trie_of(arrays))
    return token_bytes, layout


def store(path: Path, key: str, token_bytes: tuple[bytes, ...], layout) -> None:
    """Write the file at `path` whole or not at all (a temporary file renamed over it); errors are ignored: the
    cache only saves time."""
    offsets = np.zeros(len(token_bytes) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(b) for b in token_bytes])
    columns = np.concatenate(layout.columns) if layout.columns else np.zeros(0, np.uint8)
    arrays = dict(blob=np.frombuffer(b"".join(token_bytes), dtype=np.uint8), offsets=offsets, order=layout.order,
                  counts=layout.counts, lengths=layout.lengths, tail_bytes=layout.tail_bytes,
                  valid_utf8=layout.valid_utf8, char_counts=layout.char_counts, columns=columns,
                  **_trie_arrays(layout.trie))
    temporary = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=path.stem + ".", suffix=".tmp")
        with os.fdopen(handle, "wb") as out:
            np.savez(out, key=np.asarray(key), **arrays)
        os.replace(temporary, path)
    except OSError:
        if temporary is not None:
            Path(temporary).unlink(missing_ok=True)


def load_or_build(tokenizer, vocab_size: int, build_bytes, layout_type):
    """(token_bytes, layout or None) of `tokenizer`: from the cache when a whole file for its content is there, else
    `build_bytes()` with its layout (`layout_type.build`), stored for next time. The layout is None when the cache is
    not used."""
    folder = cache_dir()
    if folder is None or vocab_size < MIN_CACHED_TOKENS:
        return build_bytes(), None
    key = content_key(tokenizer, vocab_size)
    if key is None:
        return build_bytes(), None
    path = folder / f"vocabulary-{key[:32]}.npz"
    found = load(path, key, layout_type)
    if found is not None:
        return found
    token_bytes = build_bytes()
    layout = layout_type.build(token_bytes)
    store(path, key, token_bytes, layout)
    return token_bytes, layout


def _trie_arrays(trie) -> dict:
    """A TokenTrie's per-depth arrays, concatenated, with what splits them again."""
    def joined(parts, dtype):
        return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)
    return dict(trie_nodes=np.asarray([len(b) for b in trie.node_bytes], dtype=np.int64),
                trie_bytes=joined(trie.node_bytes, np.uint8), trie_children=joined(trie.child_start, np.int64),
                trie_end_start=joined(trie.end_start, np.int64), trie_ends=np.asarray([len(r) for r in trie.end_rows],
                                                                                      dtype=np.int64),
                trie_end_rows=joined(trie.end_rows, np.int64))


def _trie_of(arrays: dict):
    """The TokenTrie of `_trie_arrays`."""
    from fsm.token_trie import TokenTrie

    nodes, ends = arrays["trie_nodes"], arrays["trie_ends"]
    node_at = np.concatenate([[0], np.cumsum(nodes)])
    range_at = np.concatenate([[0], np.cumsum(nodes + 1)])  # child_start and end_start: n_j + 1 entries per depth
    end_at = np.concatenate([[0], np.cumsum(ends)])
    depths = range(len(nodes))
    return TokenTrie(tuple(arrays["trie_bytes"][node_at[j]:node_at[j + 1]] for j in depths),
                     tuple(arrays["trie_children"][range_at[j]:range_at[j + 1]] for j in depths),
                     tuple(arrays["trie_end_start"][range_at[j]:range_at[j + 1]] for j in depths),
                     tuple(arrays["trie_end_rows"][end_at[j]:end_at[j + 1]] for j in depths))


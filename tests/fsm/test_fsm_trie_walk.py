"""The token trie (fsm.token_trie): it spells every token, its walk ends each token where the column walk does, and
guides that walk it give bitwise the masks of guides that walk columns only (the reference, TRIE_WALK off) along
the walks of JSONSchemaBench schemas and of regexes, with a byte-level BPE and a SentencePiece vocabulary."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

import fsm
from fsm import index as ix
from fsm.caches import clear_caches
from fsm.lazy_dfa import DEAD
from fsm.regex import compile_regex
from fsm.token_trie import TokenTrie
from fsm.vocabulary import Vocabulary, vocabulary_from_tokenizer
from tests.fsm_walk import random_walk

DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "jsonschemabench"
SCHEMAS = 6  # drawn at random (fixed seed) from the schemas with a valid instance
REGEXES = (r"[a-z]{2,6}( [a-z]{1,4})*\.", r"(\+|-)?\d{1,5}(\.\d{1,3})?(e-?\d{1,2})?", r"(ab|cd){1,3}x|é+|🙂\d",
           r"[^\"\\]{5,40}")


def _spelled(trie: TokenTrie, layout) -> dict[int, bytes]:
    """row -> the bytes of its path in the trie (a walk of every node)."""
    prefixes, out = [bytes([b]) for b in trie.node_bytes[0].tolist()], {}
    for j in range(trie.depth):
        for node, prefix in enumerate(prefixes):
            for row in trie.end_rows[j][trie.end_start[j][node]:trie.end_start[j][node + 1]].tolist():
                out[row] = prefix
        if j + 1 < trie.depth:
            starts, following = trie.child_start[j], trie.node_bytes[j + 1].tolist()
            prefixes = [prefixes[node] + bytes([following[child]]) for node in range(len(prefixes))
                        for child in range(starts[node], starts[node + 1])]
    return out


def test_the_trie_spells_every_token_once_and_shares_prefixes():
    words = (b"ab", b"abc", b"ab", b"a\x00", b"a", b"", b"b\xc3\xa9", b"\x00", b"abd", b"")  # duplicates, NUL, empty
    vocabulary = Vocabulary(words, ())
    layout = vocabulary.walk_layout
    trie = layout.trie
    spelled = _spelled(trie, layout)
    assert sorted(spelled) == list(range(len(layout.order)))
    assert all(spelled[row] == words[token] for row, token in enumerate(layout.order.tolist()))
    assert [len(b) for b in trie.node_bytes] == [3, 3, 3]  # a b \0 | ab a\0 b\xc3 | abc abd b\xc3\xa9


@pytest.mark.parametrize("pattern", REGEXES[::2])
def test_the_trie_walk_ends_tokens_where_the_column_walk_does(smol_tokenizer, pattern):
    vocabulary = vocabulary_from_tokenizer(smol_tokenizer)
    layout = vocabulary.walk_layout
    dfa = compile_regex(pattern)
    dfa.explore_all()
    for state in range(dfa.n_states):
        reference = ix._walk_rows(dfa, layout, state, stays=[])[0]  # (n_tokens,) every token walked, no shortcut
        rows, ends = layout.trie.walk(dfa, state)
        got = np.full(len(layout.order), DEAD, dtype=np.int32)
        got[rows] = ends
        assert len(np.unique(rows)) == len(rows) and np.array_equal(got, reference), state


def _cases() -> list[tuple[str, dict, object]]:
    if not DATA.is_dir():
        return []
    files = sorted(DATA.iterdir())
    random.Random(62).shuffle(files)
    out = []
    for path in files:
        case = json.loads(path.read_text())
        valid = [t["data"] for t in case.get("tests", []) if t.get("valid")]
        if valid and len(json.dumps(valid[0])) < 2000:
            out.append((path.name, case["schema"], valid[0]))
        if len(out) == SCHEMAS:
            break
    return out


def _schema_masks(schema, instance, tokenizer) -> list[bytes] | None:
    """Packed masks along the tokenizer's tokens of `instance` (as far as the guide allows), or None if refused."""
    try:
        guide = fsm.Guide.from_schema(schema, tokenizer, policy="compact")
    except (fsm.SchemaError, fsm.GuideBudgetError, fsm.RegexError, ValueError):
        return None
    masks = []
    for token in vocabulary_from_tokenizer(tokenizer).encode(json.dumps(instance, separators=(",", ":"),
                                                                        ensure_ascii=False)):
        masks.append(np.packbits(guide.mask().numpy()).tobytes())
        if not guide.mask()[token]:
            break
        guide.advance(token)
    masks.append(np.packbits(guide.mask().numpy()).tobytes())
    return masks


def _regex_masks(pattern, tokenizer, seed: int) -> list[bytes]:
    guide = fsm.Guide.from_regex(pattern, tokenizer)
    tokens = random_walk(guide.copy(), random.Random(seed), budget=30)
    masks = []
    for token in tokens:
        masks.append(np.packbits(guide.mask().numpy()).tobytes())
        guide.advance(token)
    return masks


def _both(monkeypatch, fresh, compute):
    """(reference, trie) results of `compute()`, each from fresh caches (all first visits)."""
    out = []
    for trie in (False, True):
        monkeypatch.setattr(ix, "TRIE_WALK", trie)
        fresh()
        out.append(compute())
    return out


@pytest.fixture(params=["smol", "sentencepiece"])
def tokenizer(request, smol_tokenizer, sentencepiece_tokenizer):
    return smol_tokenizer if request.param == "smol" else sentencepiece_tokenizer


@pytest.mark.skipif(not DATA.is_dir(), reason="JSONSchemaBench data not present")
def test_schema_walks_give_the_same_masks(tokenizer, monkeypatch):
    compared = 0
    for name, schema, instance in _cases():
        reference, trie = _both(monkeypatch, clear_caches, lambda: _schema_masks(schema, instance, tokenizer))
        assert trie == reference, name
        compared += len(reference or ())
    assert compared > 50


@pytest.mark.parametrize("pattern", REGEXES)
def test_regex_walks_give_the_same_masks(tokenizer, monkeypatch, pattern):
    reference, trie = _both(monkeypatch, clear_caches, lambda: _regex_masks(pattern, tokenizer, seed=3))
    assert trie == reference and len(reference) > 1


def test_the_differential_sees_a_dropped_token(smol_tokenizer, monkeypatch):
    """Negative control: a trie walk that loses one surviving token gives another mask, and the comparison fails."""
    walk = TokenTrie.walk

    def lossy(self, dfa, state):
        rows, ends = walk(self, dfa, state)
        return (rows[1:], ends[1:]) if len(rows) > 1 else (rows, ends)

    pattern = REGEXES[0]
    reference, _ = _both(monkeypatch, clear_caches, lambda: _regex_masks(pattern, smol_tokenizer, seed=3))
    monkeypatch.setattr(TokenTrie, "walk", lossy)
    _, broken = _both(monkeypatch, clear_caches, lambda: _regex_masks(pattern, smol_tokenizer, seed=3))
    assert broken != reference

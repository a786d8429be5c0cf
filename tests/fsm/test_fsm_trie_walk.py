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


def test_a_nodes_subtree_holds_its_tokens_then_every_longer_token_below_it():
    words = (b"ab", b"abc", b"ab", b"a\x00", b"a", b"", b"b\xc3\xa9", b"\x00", b"abd", b"", b"abcd")
    vocabulary = Vocabulary(words, ())
    layout = vocabulary.walk_layout
    trie, spelled = layout.trie, _spelled(layout.trie, layout)
    start, size, rows = trie.subtrees
    assert sorted(rows.tolist()) == list(range(len(layout.order)))
    prefixes = [bytes([b]) for b in trie.node_bytes[0].tolist()]
    for j in range(trie.depth):
        for node, prefix in enumerate(prefixes):
            below = rows[start[j][node]: start[j][node] + size[j][node]].tolist()
            own = trie.end_start[j][node + 1] - trie.end_start[j][node]
            assert all(spelled[r] == prefix for r in below[:own])
            assert sorted(below) == sorted(r for r, b in spelled.items() if b.startswith(prefix))
        if j + 1 < trie.depth:
            starts, following = trie.child_start[j], trie.node_bytes[j + 1].tolist()
            prefixes = [prefixes[node] + bytes([following[child]]) for node in range(len(prefixes))
                        for child in range(starts[node], starts[node + 1])]


@pytest.mark.parametrize("pattern", [*REGEXES, r"[a-z]+(,[0-9])*", r"x(ab)+y?\}"])
def test_the_trie_walks_a_head_as_the_column_walk_does(smol_tokenizer, pattern):
    """A head's walk (tokens that stay inside, crossing tokens with where they first pass an accepting state) is the
    same from the trie as from the columns, from every state of the head's DFA that no token stays in."""
    vocabulary = vocabulary_from_tokenizer(smol_tokenizer)
    layout = vocabulary.walk_layout
    dfa = compile_regex(pattern)
    dfa.explore_all()
    compared, crossed = 0, 0
    for state in range(dfa.n_states):
        if list(ix.staying(dfa, layout, state)) or dfa.accepting[state]:
            continue
        ends, crossing, at, where = ix._walk_rows(dfa, layout, state, track_crossing=True, stays=[])
        rows, got_ends, got_crossing, got_at, got_where = layout.trie.walk_head(dfa, state)
        got = np.full(len(layout.order), DEAD, dtype=np.int32)
        got[rows] = got_ends
        assert np.array_equal(got, ends) and np.array_equal(got_crossing, crossing), state
        assert np.array_equal(got_at, at) and np.array_equal(got_where, where), state
        compared, crossed = compared + 1, crossed + len(crossing)
    assert compared and (crossed or pattern not in (REGEXES[0], r"[a-z]+(,[0-9])*", r"x(ab)+y?\}"))


def test_a_head_walk_steps_no_byte_past_the_heads_end(smol_tokenizer, monkeypatch):
    """A head of one byte (a key's opening quote) ends after it: the walk reads the first byte of every token and sets
    the longer tokens that start with it apart as crossing, stepping no cell past it (the column walk stepped each
    of them on through the head's DFA), and keeps arrays over its own tokens, not over the vocabulary."""
    from fsm import rx
    from fsm.lazy_dfa import LazyDFA

    vocabulary = vocabulary_from_tokenizer(smol_tokenizer)
    head = rx.literal('"')
    dfa = LazyDFA(head)
    stepped = []
    step = LazyDFA.step
    monkeypatch.setattr(LazyDFA, "step", lambda self, states, data: stepped.append(len(states)) or step(self, states,
                                                                                                          data))
    walk = ix._walk_head(dfa, head, vocabulary)
    crossing = vocabulary.walk_layout.order[walk.crossing].tolist()
    assert sum(stepped) == 0 and len(crossing) > 10
    assert all(vocabulary.token_bytes[t][:1] == b'"' and len(vocabulary.token_bytes[t]) > 1 for t in crossing)
    assert walk.allowed.sum() == 1 and (walk.cross_at == 1).all()
    assert walk.nbytes < 2 * vocabulary.vocab_size  # arrays over the tokens inside, not over the vocabulary


@pytest.mark.parametrize("prefix", [b'{"', b'{"extraordinarily_long_key_na', b'{"extraordinarily_long_key_name"'])
def test_a_literal_is_walked_along_its_bytes(smol_tokenizer, monkeypatch, prefix):
    """A state whose term starts with a literal (inside a key, before a value) finds the tokens that spell a prefix of
    it by bisection in the trie, one DFA cell per byte, and walks only below the literal's end (the tokens that spell
    it whole): the same tokens and end states as the column walk, and no row of the DFA filled for the literal."""
    from fsm.lazy_dfa import LazyDFA

    key = "extraordinarily_long_key_name"
    schema = {"type": "object", "properties": {key: {"type": "integer"}}, "required": [key]}
    guide = fsm.Guide.from_schema(schema, smol_tokenizer)
    index, state = guide.index, guide.index.dfa.walk(prefix)
    rows_filled, row = [], LazyDFA.row
    monkeypatch.setattr(LazyDFA, "row", lambda self, s: rows_filled.append(s) or row(self, s))
    ids, ends = ix._walk_all_tokens(index.dfa, index.vocabulary, state)
    assert rows_filled == []
    reference = ix._walk_rows(index.dfa, index.vocabulary.walk_layout, state, stays=[])[0]
    expected = {int(index.vocabulary.walk_layout.order[r]): int(e) for r, e in enumerate(reference) if e != DEAD}
    assert dict(zip(ids.tolist(), ends.tolist())) == expected and expected


def test_a_column_head_walk_steps_no_token_past_the_heads_end(smol_tokenizer, monkeypatch):
    """A string's head (its characters and closing quote) is walked by columns, the free text set apart without a
    walk (`fsm.staying`): a token that passes the quote is set apart there as crossing and stepped no further (no
    step starts from an accepting state of the head)."""
    from fsm import rx
    from fsm.json_terms import QUOTE, STRING_CHAR
    from fsm.lazy_dfa import LazyDFA

    vocabulary = vocabulary_from_tokenizer(smol_tokenizer)
    head = rx.seq(rx.star(STRING_CHAR), QUOTE)
    dfa = LazyDFA(head)
    assert list(ix.staying(dfa, vocabulary.walk_layout, dfa.state_of(head)))  # the column walk, not the trie's
    from_accepting, step = [], LazyDFA.step
    monkeypatch.setattr(LazyDFA, "step", lambda self, states, data: from_accepting.append(
        int(self.accepting.take(states).sum())) or step(self, states, data))
    walk = ix._walk_head(dfa, head, vocabulary)
    assert len(walk.crossing) > 10 and sum(from_accepting) == 0


def test_crossing_tokens_walked_from_a_states_start_set_free_text_apart(smol_tokenizer, monkeypatch):
    """Tokens a head walk set apart without knowing where they pass its end are walked from the state's start in the
    whole term's DFA (`fsm.crossing.add_walked`): the free text among them ends without a walk there too, where
    they end in the column walk of every token (all 128k of Qwen2.5's tokens once took a 43 ms column walk)."""
    from fsm import crossing, rx
    from fsm.json_terms import QUOTE, STRING_CHAR
    from fsm.lazy_dfa import LazyDFA

    layout = vocabulary_from_tokenizer(smol_tokenizer).walk_layout
    term = rx.seq(rx.star(STRING_CHAR), QUOTE, rx.literal(b","))
    dfa = LazyDFA(term)
    start = dfa.state_of(term)
    expected = ix._walk_rows(dfa, layout, start, stays=[])[0]  # (n_tokens,) by rows, every token walked
    stepped, step = [], LazyDFA.step
    monkeypatch.setattr(LazyDFA, "step", lambda self, states, data: stepped.append(len(states)) or step(
        self, states, data))
    out = crossing.Crossed()
    rows = np.arange(len(layout.order))
    crossing.add_walked(out, dfa, layout, rows, 0, start)
    ids, slots, targets = ix._crossed_arrays(out)
    found = np.full(len(layout.order), DEAD, dtype=np.int32)
    found[layout.row_of[ids]] = np.asarray(targets, dtype=np.int32)[slots]
    assert np.array_equal(found, expected)
    assert sum(stepped) < len(rows) // 4


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


@pytest.mark.parametrize("seed", range(5))
def test_a_literal_state_of_few_tokens_is_sorted_as_one_of_many(monkeypatch, seed):
    """`literal_info` sorts up to FEW_TOKENS ids in Python: the same ids, places (a token listed twice goes where its
    last entry says), mask and longest token as the numpy path."""
    from fsm import literals

    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 12, 1000)
    ids = rng.integers(0, 40, int(rng.integers(0, literals.FEW_TOKENS + 1)))  # duplicates likely
    slots = rng.integers(0, 5, len(ids)).astype(np.int32)

    def info(few: int):
        monkeypatch.setattr(literals, "FEW_TOKENS", few)
        return literals.literal_info(ids.copy(), slots.copy(), 5, None, np.zeros(1000, dtype=bool), lengths)

    python, numpy = info(literals.FEW_TOKENS), info(-1)
    assert python.token_ids.tolist() == numpy.token_ids.tolist()
    assert python.token_ids.dtype == numpy.token_ids.dtype and python.slots.dtype == numpy.slots.dtype
    assert python.slots.tolist() == numpy.slots.tolist()
    assert bool((python.mask == numpy.mask).all()) and python.max_token_length == numpy.max_token_length


def test_a_dfa_walk_derives_a_block_per_byte_not_a_row():
    """`LazyDFA.walk` steps by blocks: the states of filled rows, and no row filled on its way."""
    texts = [b"ab", b"abcd", b"abx", b"zz", b"a1b2", b""]
    pattern = r"(ab|cd)+x?|[a-z][0-9][a-z][0-9]|z{2,3}"
    from fsm.lazy_dfa import LazyDFA

    root = compile_regex(pattern).root
    by_blocks, by_rows = LazyDFA(root), LazyDFA(root).explore_all()
    for text in texts:
        walked = by_blocks.walk(text)
        expected = by_rows.walk(text)
        assert (walked == DEAD) == (expected == DEAD)
        if walked != DEAD:
            assert by_blocks.term(walked) is by_rows.term(expected)
    assert not by_blocks._filled[: by_blocks.n_states].any()

"""States that start with a literal (fsm.literals): the literal read off the terms, next states numbered when a token
goes there. Their masks, and the term every allowed token leads to, are the column walk's (TRIE_WALK off: the
reference) on keys with escapes and multi-byte UTF-8, literals that end inside a token, and tokens that run past a
literal's end into what follows, with a SentencePiece vocabulary (every byte a token: places numbered late), a
byte-level BPE that lacks a few bytes (where the terms prove every place token-live, `fsm.liveness`: numbered late
too) and the same BPE with that proof off (places numbered at once and checked)."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

import fsm
from fsm import index as ix
from fsm import liveness
from fsm.caches import clear_caches
from fsm.lazy_dfa import UNFILLED
from fsm.regex import dfa_of
from fsm.literals import UNNUMBERED, LiteralStateInfo
from fsm.vocabulary import vocabulary_from_tokenizer
from tests.fsm_walk import random_walk

KEYS = ['a"b\\c', "clé_🙂_naïve", "extraordinarily_long_key_name", "x", '{"}:,']
SCHEMA = {
    "type": "object",
    "properties": {
        KEYS[0]: {"type": "string"},
        KEYS[1]: {"enum": ["été", "🙂🙂", "plain"]},
        KEYS[2]: {"type": "integer"},
        KEYS[3]: {"type": "array", "items": {"const": 'quote"d\\'}},
        KEYS[4]: {"type": "object", "properties": {"in": {"type": "boolean"}}, "required": ["in"]},
    },
    "required": KEYS,
}
INSTANCE = {KEYS[0]: 'v"\\', KEYS[1]: "été", KEYS[2]: -12, KEYS[3]: ['quote"d\\'] * 2, KEYS[4]: {"in": True}}


@pytest.fixture(params=["smol", "smol-checked", "sentencepiece"])
def tokenizer(request, smol_tokenizer, sentencepiece_tokenizer, monkeypatch):
    if request.param == "smol-checked":  # every state's places checked, as where the terms prove nothing
        monkeypatch.setattr(liveness.TokenLiveness, "all_live_from", lambda self, state: self.trivial)
    return sentencepiece_tokenizer if request.param == "sentencepiece" else smol_tokenizer


def _walks(tokenizer) -> list[list[int]]:
    """The instance's tokens, and random walks of the reference guide."""
    clear_caches()
    guide = fsm.Guide.from_schema(SCHEMA, tokenizer)
    text = json.dumps(INSTANCE, separators=(",", ":"), ensure_ascii=False)
    return [vocabulary_from_tokenizer(tokenizer).encode(text)] + [
        random_walk(guide.copy(), random.Random(seed), budget=60) for seed in range(4)]


def _trace(term, tokenizer, walks) -> tuple[list, int, ix.TokenIndex]:
    """Per position of each walk in a new index of `term`: the packed mask and the term id each allowed token leads
    to (terms are interned: while both indexes live, a term is one object); how many states were LiteralStateInfos;
    the index."""
    index, out, literal = ix.TokenIndex(dfa_of(term), vocabulary_from_tokenizer(tokenizer)), [], 0
    for tokens in walks:
        guide = fsm.Guide(index)
        for token in tokens:
            info = index.info(guide.state)
            literal += isinstance(info, LiteralStateInfo)
            ids, nexts = info.successors()
            terms = [index.dfa.term(s).id if s >= 0 else s for s in nexts.tolist()]
            out.append((np.packbits(guide.mask().numpy()).tobytes(), dict(zip(ids.tolist(), terms))))
            guide.advance(token)
    return out, literal, index


def test_literal_states_give_the_column_walks_masks_and_next_states(tokenizer, monkeypatch):
    walks, term = _walks(tokenizer), fsm.compile_schema(SCHEMA)
    monkeypatch.setattr(ix, "TRIE_WALK", False)
    reference, _, held = _trace(term, tokenizer, walks)
    monkeypatch.setattr(ix, "TRIE_WALK", True)
    clear_caches()  # the head walks: first visits again (the term is held)
    got, literal, _ = _trace(term, tokenizer, walks)
    assert got == reference and len(reference) > 100 and held
    proved = fsm.Guide.from_schema(SCHEMA, tokenizer).index._live.all_live_from(0)  # else numbered at once
    assert (literal > 50) == proved


def test_a_mask_inside_a_key_numbers_no_state_and_a_step_one(sentencepiece_tokenizer):
    """Inside a long key the mask reads the key off the terms: no DFA cell or state for its bytes, nor for where the
    tokens past its end go; advancing numbers the one place the token goes to."""
    clear_caches()
    guide = fsm.Guide.from_schema(SCHEMA, sentencepiece_tokenizer)
    dfa = guide.index.dfa
    guide.state = dfa.walk(b'{"a\\"b\\\\c":"v\\"\\\\","' + KEYS[1].encode() + b'":"plain","extra')
    start, states, cells = guide.state, dfa.n_states, int((dfa._table[: dfa.n_states] != UNFILLED).sum())
    info = guide.index.info(guide.state)
    assert isinstance(info, LiteralStateInfo) and (info.states == UNNUMBERED).all() and len(info.token_ids) > 3
    assert (dfa.n_states, int((dfa._table[: dfa.n_states] != UNFILLED).sum())) == (states, cells)
    token = int(info.token_ids[-1])
    guide.advance(token)
    assert dfa.n_states == states + 1 and (info.states != UNNUMBERED).sum() == 1
    assert guide.state == dfa.walk(guide.index.vocabulary.token_bytes[token], start)


def test_literal_states_that_walk_alike_share_a_mask_not_their_places(smol_tokenizer):
    """Two objects with the same key: the states before that key find the same tokens going to the same places
    (`fsm.literals.LiteralInfos`), so they share one mask; each numbers its own places, the states of its own term."""
    clear_caches()
    inner = {"type": "object", "properties": {"same_key": {"type": "integer"}}, "required": ["same_key"]}
    schema = {"type": "object", "properties": {"a": inner, "b": {"type": "array", "items": inner}},
              "required": ["a", "b"]}
    guide = fsm.Guide.from_schema(schema, smol_tokenizer)
    index, dfa = guide.index, guide.index.dfa
    before = [dfa.walk(b'{"a":{'), dfa.walk(b'{"a":{"same_key":1},"b":[{')]
    infos = [index.info(state) for state in before]
    assert all(isinstance(info, LiteralStateInfo) for info in infos) and before[0] != before[1]
    assert infos[0].mask is infos[1].mask and infos[0].states is not infos[1].states
    token = int(infos[0].token_ids[-1])
    after = [info.next_of(token) for info in infos]
    assert after == [dfa.walk(index.vocabulary.token_bytes[token], state) for state in before]
    assert after[0] != after[1] and (infos[1].states != UNNUMBERED).sum() == 1

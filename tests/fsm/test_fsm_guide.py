"""Vocabulary, TokenIndex and Guide with real tokenizers (byte-level BPE and SentencePiece)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

import fsm
from fsm import crossing, rx, staying
from fsm import index as ix
from fsm.lazy_dfa import DEAD
from fsm.vocabulary import vocabulary_from_tokenizer
from tests.fsm_walk import random_walk, text_of
from tests.fsm.test_fsm_schema import Character

TEXTS = ['{"name": "é😀 ü"}', "  leading spaces\n\ttabs", "数字 123 ٣", "a\u00a0b"]


@pytest.fixture(params=["smol", "sentencepiece"])
def tokenizer(request, smol_tokenizer, sentencepiece_tokenizer):
    return smol_tokenizer if request.param == "smol" else sentencepiece_tokenizer


@pytest.mark.parametrize("text", TEXTS)
def test_token_bytes_spell_the_text(tokenizer, text):
    vocabulary = vocabulary_from_tokenizer(tokenizer)
    ids = tokenizer.encode(text, add_special_tokens=False)
    spelled = b"".join(vocabulary.token_bytes[i] for i in ids)
    assert spelled.decode("utf-8").lstrip(" ") == text.lstrip(" ")  # SentencePiece may add one leading space


def test_sentencepiece_byte_fallback_and_spaces(sentencepiece_tokenizer):
    vocabulary = vocabulary_from_tokenizer(sentencepiece_tokenizer)
    fallback = sentencepiece_tokenizer.convert_tokens_to_ids(["<0x0A>", "<0xC3>", "▁the"])
    assert [vocabulary.token_bytes[i] for i in fallback] == [b"\n", b"\xc3", b" the"]


def test_special_tokens_have_no_bytes(tokenizer):
    vocabulary = vocabulary_from_tokenizer(tokenizer)
    for i in tokenizer.all_special_ids:
        assert vocabulary.token_bytes[i] == b""


def test_mask_is_as_wide_as_the_logits_and_padding_ids_are_never_allowed(smol_tokenizer):
    width = len(smol_tokenizer) + 64
    guide = fsm.Guide.from_regex(r"[a-z ]+", smol_tokenizer, vocab_size=width)
    assert guide.mask().shape == (width,) and guide.mask().dtype == torch.bool
    assert not guide.mask()[len(smol_tokenizer):].any()


def test_mask_and_allowed_agree(tokenizer):
    guide = fsm.Guide.from_schema(Character, tokenizer)
    guide.advance(guide.forced()[0])
    assert torch.nonzero(guide.mask()).flatten().tolist() == guide.allowed()


def test_eos_exactly_in_final_states(smol_tokenizer):
    guide = fsm.Guide.from_regex("ab?", smol_tokenizer)
    eos = smol_tokenizer.eos_token_id
    assert not guide.is_final() and eos not in guide.allowed()
    guide.advance(smol_tokenizer.convert_tokens_to_ids("a"))
    assert guide.is_final() and eos in guide.allowed() and not guide.only_eos_allowed()
    guide.advance(smol_tokenizer.convert_tokens_to_ids("b"))
    assert guide.only_eos_allowed()
    guide.advance(eos)
    assert guide.is_finished() and guide.forced() == []


def test_invalid_token_raises(smol_tokenizer):
    guide = fsm.Guide.from_regex("[0-9]+", smol_tokenizer)
    with pytest.raises(fsm.InvalidTokenError, match="not allowed"):
        guide.advance(smol_tokenizer.convert_tokens_to_ids("a"))
    with pytest.raises(fsm.InvalidTokenError):
        guide.advance(smol_tokenizer.eos_token_id)  # EOS before anything was written
    assert issubclass(fsm.InvalidTokenError, ValueError)


def test_copy_is_independent(smol_tokenizer):
    guide = fsm.Guide.from_schema(Character, smol_tokenizer)
    ahead = guide.copy()
    for token in ahead.forced():
        ahead.advance(token)
    assert guide.state == 0 and ahead.state != 0 and ahead.index is guide.index


def test_character_forced_tokens(tokenizer):
    guide = fsm.Guide.from_schema(Character, tokenizer)
    forced = guide.forced()
    text = tokenizer.decode(forced)
    assert text == '{"name":"', text  # the key is forced; the value is the model's
    for token in forced:
        guide.advance(token)
    assert guide.forced() == []


def test_forced_tail_that_a_longer_token_could_span_is_held_back(smol_tokenizer):
    names = smol_tokenizer.convert_tokens_to_ids("names")
    # "name" is forced by the bytes, but the allowed token "names" spans past its end: hold it back.
    guide = fsm.Guide.from_regex(r"name(?:s|d|[0-9])x", smol_tokenizer)
    assert names in guide.allowed()
    assert guide.forced() == []
    # No token spans "name" + digit, so "name" is forced.
    guide = fsm.Guide.from_regex(r"name[0-9]x", smol_tokenizer)
    assert smol_tokenizer.decode(guide.forced()) == "name"


def test_forced_tokens_are_the_canonical_spelling(smol_tokenizer):
    guide = fsm.Guide.from_regex(r'\{"temperature":[0-9]', smol_tokenizer)
    assert guide.forced() == smol_tokenizer.encode('{"temperature":', add_special_tokens=False)


def test_tokens_may_end_inside_a_character(sentencepiece_tokenizer):
    guide = fsm.Guide.from_regex("é|è", sentencepiece_tokenizer)
    lead, tail = sentencepiece_tokenizer.convert_tokens_to_ids(["<0xC3>", "<0xA9>"])
    guide.advance(lead)
    assert not guide.is_final()
    guide.advance(tail)
    assert guide.is_final()


@pytest.mark.parametrize("seed", range(5))
def test_no_dead_ends_on_unicode_walks(tokenizer, seed):
    guide = fsm.Guide.from_schema(
        {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 3}, tokenizer
    )
    text = text_of(guide, random_walk(guide, random.Random(seed), budget=15))  # asserts no dead end
    assert text.startswith("[") and text.endswith("]")


def test_index_is_shared_between_guides(smol_tokenizer):
    a = fsm.Guide.from_schema(Character, smol_tokenizer)
    b = fsm.Guide.from_schema(Character, smol_tokenizer)
    assert a.index is b.index


def test_states_no_token_sequence_can_finish_are_not_entered(smol_tokenizer):
    # SmolLM2 has no token with byte 0xF1, the first byte of U+40000: after "a" nothing could follow.
    guide = fsm.Guide.from_regex("a\U00040000|ab|bc", smol_tokenizer)
    a, b = smol_tokenizer.convert_tokens_to_ids(["a", "b"])
    assert b in guide.allowed() and a in guide.allowed()  # "a" then "b" still finishes
    guide = fsm.Guide.from_regex("a\U00040000|bc", smol_tokenizer)
    assert b in guide.allowed() and a not in guide.allowed()


def _counted_token_walk(guide, text: str, monkeypatch):
    """walk(min_loop_bytes) -> ({token id: end state} of every token from the state after `text`, token-bytes
    stepped through the DFA): a full walk (257) or one with the in-place shortcuts (32), work counted."""
    from fsm import index as ix
    from fsm.lazy_dfa import LazyDFA

    state = guide.index.dfa.walk(text.encode())
    stepped = []
    real_step = LazyDFA.step
    monkeypatch.setattr(
        LazyDFA, "step", lambda self, states, data: stepped.append(len(states)) or real_step(self, states, data)
    )

    def walk(min_loop_bytes: int) -> tuple[dict, int]:
        stepped.clear()
        monkeypatch.setattr(staying, "MIN_LOOP_BYTES", min_loop_bytes)
        ids, ends = ix._walk_all_tokens(guide.index.dfa, guide.index.vocabulary, state)
        return dict(zip(ids.tolist(), ends.tolist())), sum(stepped)

    return walk


@pytest.mark.parametrize("text, free", [('{"names":["Jo', True), ('{"na', True), ('{"names":["a","b"]', False)])
def test_free_text_tokens_end_in_place_without_a_walk(smol_tokenizer, monkeypatch, text, free):
    """Tokens whose first byte leads to a state that loops on their other bytes (a string, an undeclared
    key) end there unwalked: same (ids, end states) as a full walk, with far fewer token-bytes stepped
    through the DFA (work counted, not timed)."""
    schema = {
        "type": "object",
        "properties": {"names": {"type": "array", "items": {"type": "string"}}},
        "required": ["names"],
    }
    walk = _counted_token_walk(fsm.Guide.from_schema(schema, smol_tokenizer, policy="spec"), text, monkeypatch)
    (shortcut, work), (full, full_work) = walk(32), walk(257)
    assert shortcut == full
    assert (work < full_work / 2) if free else (work == full_work)


def test_a_choice_of_words_derives_no_row_to_look_for_free_text(smol_tokenizer, monkeypatch):
    """Where each first character leads to its own word (an enum's values), no state after it can loop on enough
    bytes, nor do enough first characters lead there to count: a derivative or two of each says so, not a row of
    derivatives (`staying.char_ends`) per word."""
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta", "iota", "kappa"]
    guide = fsm.Guide.from_schema({"enum": words}, smol_tokenizer)
    index, layout = guide.index, guide.index.vocabulary.walk_layout
    state = index.dfa.walk(b'"')
    looked, char_ends = [], staying.char_ends
    monkeypatch.setattr(staying, "char_ends", lambda dfa, s: looked.append(s) or char_ends(dfa, s))
    assert list(staying.staying(index.dfa, layout, state)) == [] and looked == [state]


@pytest.mark.parametrize("schema", [{"type": "string"}, {"type": "string", "pattern": "^[^数]*$"}])
def test_tokens_of_whole_characters_end_in_place_without_a_walk(tokenizer, monkeypatch, schema):
    """In free text, tokens whose characters are multi-byte (é, 数) end in place like ASCII ones, unwalked,
    where every character of their lead bytes leads back; a lead byte some of whose characters are barred
    (a pattern without 数) is walked: same (ids, end states) as a full walk either way."""
    guide = fsm.Guide.from_schema(schema, tokenizer)
    walk = _counted_token_walk(guide, '"x', monkeypatch)
    (full, _), (shortcut, _) = walk(257), walk(32)
    assert shortcut == full
    index, layout = guide.index, guide.index.vocabulary.walk_layout
    state = index.dfa.walk(b'"x')
    rows = np.flatnonzero(np.any([s.rows for s in staying.staying(index.dfa, layout, state)], axis=0))
    leads = layout.columns[0][rows]
    assert (leads >= 0xC2).any()  # multi-byte first characters among the tokens set apart
    barred = "数".encode()[0]
    assert (barred in leads.tolist()) == ("pattern" not in schema)


@pytest.mark.parametrize("text, saved", [('"', 2), ('"ab', 2), ('"abcdefghijklmnopqrstuvwxyz01234', 1.2)])
def test_counted_text_tokens_end_without_a_walk(smol_tokenizer, monkeypatch, text, saved):
    """In a string with maxLength each character leads to a new state (a counter): tokens whose other bytes
    are all characters that count alike end at the state their length determines, unwalked: same (ids,
    end states) as a full walk, near the end of the count too, with fewer token-bytes stepped (work counted)."""
    walk = _counted_token_walk(fsm.Guide.from_schema({"type": "string", "maxLength": 36}, smol_tokenizer), text,
                               monkeypatch)
    (full, full_work), (shortcut, work) = walk(257), walk(32)
    assert shortcut == full
    assert work * saved < full_work  # near the end of the count most tokens die early anyway


@pytest.mark.parametrize("accepted_after", [None, 3])
def test_counted_text_in_a_head_walk_keeps_the_crossing_tokens_apart(tokenizer, monkeypatch, fresh_fsm_caches,
                                                                       accepted_after):
    """A head walk through counter states ([0-z]{0,40} then a quote, or [0-z]{3,40}: accepting inside the
    count): the tokens that stay inside the count end at the count's state, those passing an accepting
    state are set apart, as a walk without the shortcut does."""
    from fsm import index as ix
    from fsm.lazy_dfa import LazyDFA

    letters = rx.byte_range(ord("0"), ord("z"))
    if accepted_after is None:
        head = rx.seq(rx.repeat(letters, 0, 40), rx.literal('"'))
    else:
        head = rx.repeat(letters, accepted_after, 40)
    walks = {}
    for min_loop_bytes in (32, 257):
        monkeypatch.setattr(staying, "MIN_LOOP_BYTES", min_loop_bytes)
        dfa = LazyDFA(head)
        walk = ix._walk_head(dfa, head, vocabulary_from_tokenizer(tokenizer))
        ends = [dfa.term(end).id for end in walk.ends[walk.end_of].tolist()]
        walks[min_loop_bytes] = (walk.inside.tolist(), ends, walk.crossing.tolist())
    assert walks[32] == walks[257]
    assert len(walks[32][0]) > 1000  # tokens of letters and digits stay inside


def _same_language(a, b) -> bool:
    return rx.is_empty(rx.alt(rx.inter(a, rx.complement(b)), rx.inter(b, rx.complement(a))))


def _plain_walk(index, state: int) -> dict[int, int]:
    """token -> next state of `state` from a walk of the whole vocabulary (no head sharing)."""
    from fsm import index as ix

    ids, ends = ix._walk_all_tokens(index.dfa, index.vocabulary, state)
    keep = index._live.keep(ends)
    if keep is not None:
        ids, ends = ids[keep], ends[keep]
    out = dict(zip(ids.tolist(), ends.tolist()))
    if index.dfa.accepting[state]:
        out.update(dict.fromkeys(index.vocabulary.eos_token_ids, ix.FINISHED))
    return out


def test_states_with_one_head_share_its_walk(tokenizer, monkeypatch, fresh_fsm_caches):
    """Three states seq(head, tail) with one head and three tails: the first is walked plainly (a head met
    once is not worth its own walk), then the vocabulary is walked once for the head (work counted), and
    each state allows exactly what a walk of its own allows, into states of the same language."""
    from fsm import index as ix

    head = rx.seq(rx.star(rx.byte_range(ord("a"), ord("z"))), rx.literal('"'))
    root = rx.alt(
        *(rx.seq(rx.literal(first), head, rx.literal(last)) for first, last in (("x", ",1"), ("y", "}2"), ("z", "]3")))
    )
    guide = fsm.Guide.from_rx(root, tokenizer)
    index = guide.index
    walks, plain = [], []
    real_head, real_plain = ix._walk_head, ix._walk_all_tokens
    monkeypatch.setattr(ix, "_walk_head", lambda *args: walks.append(args[1]) or real_head(*args))
    monkeypatch.setattr(ix, "_walk_all_tokens", lambda *args: plain.append(args[2]) or real_plain(*args))
    states = [index.dfa.walk(prefix) for prefix in (b"x", b"y", b"z", b"yab")]
    infos = [index.info(state) for state in states]
    assert walks == [head] and plain == [states[0]]
    monkeypatch.setattr(ix, "_walk_all_tokens", real_plain)
    for state, info in zip(states, infos):
        expected = _plain_walk(index, state)
        assert info.token_ids.tolist() == sorted(expected)
        for token, nxt in zip(info.token_ids.tolist(), info.next_states.tolist()):
            assert index.next_state(state, token) == nxt
            assert nxt == expected[token] or _same_language(index.dfa.term(nxt), index.dfa.term(expected[token]))


def test_head_sharing_allows_what_a_plain_walk_allows(tokenizer):
    """Along random walks of an open object in any order, with an object inside (heads: a key, a value, the
    members of the inner object), every state allows exactly the tokens a walk of the whole vocabulary from
    it allows."""
    inner = {"type": "object", "properties": {"id": {"type": "integer"}, "ok": {"type": "boolean"}}}
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 5},
            "tags": {"type": "array", "items": {"type": "string"}},
            "n": {"type": "integer"},
            "sub": inner,
        },
        "required": ["name"],
    }
    guide = fsm.Guide.from_schema(schema, tokenizer, policy="spec")
    index, rng = guide.index, random.Random(0)
    for _ in range(6):
        walker = guide.copy()
        for _ in range(40):
            if walker.is_finished():
                break
            allowed = walker.allowed()
            assert allowed == sorted(_plain_walk(index, walker.state))
            walker.advance(allowed[rng.randrange(len(allowed))])


def test_members_of_one_object_share_a_walk_whatever_members_are_left(tokenizer, monkeypatch, fresh_fsm_caches):
    """Inside the third key of an open object in any order, the states after different first members hold
    the same items (`rx.split_pick`) with different members left: the vocabulary is walked once for those
    items (the first state plainly: a head met once), and each state allows exactly what its own walk allows
    (a key already written is not); a state after a token is numbered only once a token goes there."""
    from fsm import index as ix

    schema = {"type": "object", "properties": {k: {"type": "integer"} for k in ("alpha", "beta", "gamma")}}
    guide = fsm.Guide.from_schema(schema, tokenizer, policy="spec")
    index = guide.index
    walks, plain = [], []
    real_head, real_plain = ix._walk_head, ix._walk_all_tokens
    monkeypatch.setattr(ix, "_walk_head", lambda *args: walks.append(args[1]) or real_head(*args))
    monkeypatch.setattr(ix, "_walk_all_tokens", lambda *args: plain.append(args[2]) or real_plain(*args))
    prefixes = (b'{"alpha":1,"', b'{"beta":2,"', b'{"gamma":3,"', b'{"zeta":4,"')
    states = [index.dfa.walk(prefix) for prefix in prefixes]
    infos = [index.info(state) for state in states]
    assert len(set(states)) == 4 and len(walks) == 1 and plain == [states[0]]
    numbered = index.dfa.n_states  # an end's state is numbered when a token first goes there
    infos[1].next_of(int(infos[1].token_ids[-1]))
    assert index.dfa.n_states - numbered <= 1
    monkeypatch.setattr(ix, "_walk_all_tokens", real_plain)
    for state, info in zip(states, infos):
        expected = _plain_walk(index, state)
        assert info.token_ids.tolist() == sorted(expected)
        for token, nxt in zip(info.token_ids.tolist(), info.next_states.tolist()):
            assert nxt == expected[token] or _same_language(index.dfa.term(nxt), index.dfa.term(expected[token]))
    again = [index.dfa.walk(b'alpha":1}', state) for state in states]
    assert again[0] == DEAD and DEAD not in again[1:]
    assert index.heads.head_bytes == sum(walk.nbytes for walk in index.heads.heads.values())  # masks kept count


def test_crossing_tokens_resume_where_they_leave_the_head(tokenizer):
    """A token that passes the end of a head (a string value's closing quote, then `,"` and a key) goes on
    from the state its bytes reach there, not from the start: same (token, end state) pairs as walking each
    from the state, and most of them resumed."""
    from fsm import index as ix

    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "note": {"type": "string"}, "n": {"type": "integer"}},
    }
    index = fsm.Guide.from_schema(schema, tokenizer, policy="spec").index
    state = index.dfa.walk(b'{"name":"ab')
    split = ix.Split.of(index.dfa.term(state))
    walk = ix._walk_head(index._dfa_for(split.head), split.head, index.vocabulary)
    layout = index.vocabulary.walk_layout
    crossed, from_start = crossing.Crossed(), crossing.Crossed()
    crossing.cross_on(walk, split, walk.groups, index.dfa, layout, crossed, ix.Split.of, lambda nbytes: True,
                      index.heads.dfa_for)
    crossing.add_walked(from_start, index.dfa, layout, walk.crossing, 0, state)
    resumed, expected = (_crossed_states(index, c) for c in (crossed, from_start))
    assert sorted(resumed) == sorted(expected) and len(resumed) > 10 and (walk.cross_state >= 0).mean() > 0.5
    pairs = {(resumed[t], expected[t]) for t in resumed}  # the same places, told apart by the tokens they allow
    assert all(a == b or sorted(_plain_walk(index, a)) == sorted(_plain_walk(index, b)) for a, b in pairs)


def test_crossing_tokens_go_on_through_the_next_heads_walked_once(tokenizer, monkeypatch, fresh_fsm_caches):
    """Inside two string values of one object (heads alike, tails that differ: what follows them is another key),
    the tokens that pass the closing quote go on through the heads that follow it (a comma, a key's quote) as groups
    walked once and kept: the second state walks fewer of them, grows the whole DFA by no state for its crossing
    tokens, and allows exactly what a walk of the vocabulary from it allows."""
    keys = ("alpha", "beta", "gamma")
    schema = {"type": "object", "properties": {k: {"type": "string"} for k in keys}, "required": list(keys)}
    index = fsm.Guide.from_schema(schema, tokenizer).index
    states = [index.dfa.walk(prefix) for prefix in (b'{"alpha":"a', b'{"alpha":"a","beta":"b')]
    index.info(index.dfa.walk(b'{"alpha":"a","beta":"b","gamma":"'))  # the string's head met before
    groups, walk_groups = [], crossing.walk_groups
    monkeypatch.setattr(crossing, "walk_groups", lambda *args: groups.append(args[2]) or walk_groups(*args))
    counts, grown = [], []
    for state in states:
        groups.clear()
        before = index.dfa.n_states
        info = index.info(state)
        counts.append(len(groups))
        grown.append(index.dfa.n_states - before)
        assert info.token_ids.tolist() == sorted(_plain_walk(index, state))
    assert counts[0] >= 2 and counts[1] < counts[0]
    if isinstance(info, ix.HeadStateInfo):  # every token is token-live: the crossing tokens' states are numbered
        assert grown[1] == 0  # when a token goes there


def test_groups_that_pass_at_one_state_are_walked_at_once(tokenizer):
    """The tokens that pass a string's closing quote after 1, 2, 3... bytes go on through the next head in one walk
    (`crossing.walk_groups`), each from its own byte: every token ends, or passes the next head's end, exactly where
    a walk of its group alone takes it; read from the wrong byte (the control), they do not."""
    keys = ("alpha", "beta")
    schema = {"type": "object", "properties": {k: {"type": "string"} for k in keys}, "required": list(keys)}
    index = fsm.Guide.from_schema(schema, tokenizer).index
    split = ix.Split.of(index.dfa.term(index.dfa.walk(b'{"alpha":"ab')))
    walk = ix._walk_head(index._dfa_for(split.head), split.head, index.vocabulary)
    parts = [(at, rows) for (at, where), rows in walk.groups if where == walk.groups[0][0][1]]
    nxt = ix.Split.of(split.whole(walk.dfa.term(walk.groups[0][0][1])))
    head_dfa, layout = index.heads.dfa_for(nxt.head), index.vocabulary.walk_layout
    start = head_dfa.state_of(nxt.head)
    merged = _group_outcomes(crossing.walk_groups(head_dfa, layout, parts, start))
    alone = {}
    for at, rows in parts:
        alone.update(_group_outcomes(crossing.walk_group(head_dfa, layout, rows, at, start)))
    assert len(parts) >= 3 and len(merged) >= 10 and merged == alone
    shifted = _group_outcomes(crossing.walk_groups(head_dfa, layout, [(parts[0][0], np.sort(np.concatenate(
        [rows for _, rows in parts])))], start))
    assert shifted != alone


def _group_outcomes(group) -> dict[int, tuple]:
    """row -> ("inside", end state) or ("passes", bytes read, state) of a GroupWalk's tokens that survive."""
    out = {row: ("inside", int(group.ends[i])) for row, i in zip(group.inside.tolist(), group.end_of.tolist())}
    for row, at, state in zip(group.crossing.tolist(), group.cross_at.tolist(), group.cross_state.tolist()):
        out[row] = ("passes", at, state)
    return out


def test_group_walks_grow_the_current_dfa_of_heads(tokenizer, fresh_fsm_caches):
    """Once the DFA of heads started over (past half of max_states), the groups of a head walked in the old one are
    walked on in the new one: an old walk kept in the cache never grows its DFA past the budget."""
    keys = ("alpha", "beta", "gamma", "delta")
    schema = {"type": "object", "properties": {k: {"type": "string"} for k in keys}, "required": list(keys)}
    index = fsm.Guide.from_schema(schema, tokenizer).index
    index.info(index.dfa.walk(b'{"alpha":"a","beta":"'))  # the string's head met (a plain walk)
    index.info(index.dfa.walk(b'{"alpha":"'))  # walked as a head, its groups in the DFA of heads
    old = index.heads.dfa
    index.heads.dfa = None  # started over
    for walk in index.heads.heads.values():
        walk.next.clear()  # its groups walked again
    index.info(index.dfa.walk(b'{"alpha":"a","beta":"b","gamma":"'))
    groups = [g for walk in index.heads.heads.values() for g in walk.next.values()]
    assert groups and index.heads.dfa not in (None, old) and all(g.dfa is index.heads.dfa for g in groups)


def test_a_vocabulary_that_lacks_bytes_keeps_a_heads_mask_too(smol_tokenizer, fresh_fsm_caches):
    """SmolLM2 spells a few bytes with no token of their own, so where a token leads must be token-live
    (`fsm.liveness`): the few places a head's tokens go are numbered and checked, not a state per token, and the
    state keeps the head's mask (a HeadStateInfo) with exactly a plain walk's tokens and longest token. (A pattern of
    any characters later in the object keeps the states from being proved live by their terms alone.)"""
    keys = ("alpha", "beta", "gamma")
    properties = {**{k: {"type": "string"} for k in keys}, "delta": {"type": "string", "pattern": "^.+$"}}
    schema = {"type": "object", "properties": properties, "required": [*keys, "delta"]}
    index = fsm.Guide.from_schema(schema, smol_tokenizer).index
    assert not index._live.trivial
    index.info(index.dfa.walk(b'{"alpha":"a","beta":"'))  # the string's head met before
    state = index.dfa.walk(b'{"alpha":"')
    assert not index._live.all_live_from(state)
    info = index.info(state)
    expected = _plain_walk(index, state)
    lengths = index.vocabulary.walk_layout.lengths
    assert isinstance(info, ix.HeadStateInfo) and info.token_ids.tolist() == sorted(expected)
    assert info.max_token_length == int(lengths[info.token_ids].max())
    assert all(index.is_accepting(nxt) or index._live.keep(np.asarray([nxt]))[0] for nxt in info.next_states.tolist())


def test_a_head_is_walked_once_for_every_schema_over_a_vocabulary(smol_tokenizer, monkeypatch, fresh_fsm_caches):
    """Two schemas with a free string value share its head's walk (a function of the head and the tokens): the
    second schema's string state walks no token of the vocabulary, plainly or as a head."""
    walks, walk_head, walk_all = [], ix._walk_head, ix._walk_all_tokens
    monkeypatch.setattr(ix, "_walk_head", lambda *args: walks.append("head") or walk_head(*args))
    monkeypatch.setattr(ix, "_walk_all_tokens", lambda *args: walks.append("plain") or walk_all(*args))
    for key in ("first", "second"):
        schema = {"type": "object", "properties": {key: {"type": "string"}, "other": {"type": "string"}},
                  "required": [key, "other"]}
        index = fsm.Guide.from_schema(schema, smol_tokenizer).index
        states = [index.dfa.walk(b'{"%s":"a' % key.encode()), index.dfa.walk(b'{"%s":"a","other":"b' % key.encode())]
        walks.clear()
        infos = [index.info(state) for state in states]
        assert walks == ([] if key == "second" else ["plain", "head"])
        for state, info in zip(states, infos):
            assert info.token_ids.tolist() == sorted(_plain_walk(index, state))


@pytest.mark.parametrize("b", [{"type": "string", "pattern": "^x+$"}, {"type": "integer"}], ids=["pattern", "plain"])
def test_which_ends_lead_on_asks_the_tail_once_and_builds_no_term(smol_tokenizer, monkeypatch, b):
    """Whether an end of the head leads on is asked of the end and of the tail apart (a sequence is empty where a
    part is; behind a plain tail every end that is something does): the same answers as asking each seq(end, tail),
    without building one, also behind a tail that is not plain (a `pattern` later in the document)."""
    schema = {"type": "object", "properties": {"a": {"type": "string"}, "b": b}, "required": ["a", "b"]}
    index = fsm.Guide.from_schema(schema, smol_tokenizer).index
    split = ix.Split.of(index.dfa.term(index.dfa.walk(b'{"a":"q')))
    assert split.tail.plain == ("pattern" not in b) and not split.frames
    head_dfa = fsm.regex.LazyDFA(split.head).explore_all()
    ends = [head_dfa.term(s) for s in range(head_dfa.n_states)] + [rx.NOTHING]
    expected = [not rx.is_empty(rx.seq(end, split.tail), rx.WALK_LIMIT, undecided=True) for end in ends]
    built, seq = [], rx.seq
    monkeypatch.setattr(rx, "seq", lambda *parts: built.append(parts) or seq(*parts))
    assert split.leads_on(ends).tolist() == expected and built == [] and any(expected) and not all(expected)
    if split.tail.plain:
        assert split.leads_on(ends[:-1]).tolist() == expected[:-1] and built == []


def _crossed_states(index, crossed) -> dict[int, int]:
    """token -> the state it leads to, of the crossing tokens gathered in `crossed`."""
    from fsm import index as ix

    ids, slots, _ = ix._crossed_arrays(crossed)
    return {t: ix._number_target(index.dfa, crossed.targets, s) for t, s in zip(ids.tolist(), slots.tolist())}


@pytest.mark.parametrize("value", [{"type": "string", "minLength": 3}, {"type": "string", "pattern": "^a.+$"}],
                         ids=["minLength", "pattern"])
def test_a_head_that_could_end_inside_a_string_ends_at_its_quote(tokenizer, value):
    """A string that may end after some characters and go on (`minLength`, a `pattern`) is walked as a head up to its
    closing quote: its crossing tokens all pass that quote (the head that stopped at the characters had every token of
    more characters crossing), and states that share the head allow exactly what their own walks allow."""
    from fsm import index as ix

    schema = {"type": "object", "properties": {"s": value, "t": value}, "required": ["s", "t"]}
    index = fsm.Guide.from_schema(schema, tokenizer).index
    states = [index.dfa.walk(prefix) for prefix in (b'{"s":"a', b'{"s":"abc","t":"a')]
    assert DEAD not in states
    split = ix.Split.of(index.dfa.term(states[0]))
    walk = ix._walk_head(index._dfa_for(split.head), split.head, index.vocabulary)
    crossing = index.vocabulary.walk_layout.order[walk.crossing].tolist()
    assert crossing and all(b'"' in index.vocabulary.token_bytes[t][:-1] for t in crossing)
    for state in states * 2:  # the second time round a head met before: shared walks
        assert index.info(state).token_ids.tolist() == sorted(_plain_walk(index, state))


def test_heads_are_walked_at_first_sight_once_many_are_shared(smol_tokenizer, monkeypatch, fresh_fsm_caches):
    """Past EAGER_AFTER_HEADS head walks (a document whose states share heads), a head is walked on its own
    at the first state it starts: no plain walk of that state (work counted)."""
    from fsm import index as ix

    head = rx.seq(rx.star(rx.byte_range(ord("a"), ord("z"))), rx.literal('"'))
    guide = fsm.Guide.from_rx(rx.seq(rx.literal("x"), head, rx.literal(",1")), smol_tokenizer)
    monkeypatch.setattr(ix, "EAGER_AFTER_HEADS", 0)
    walks, plain = [], []
    real_head, real_plain = ix._walk_head, ix._walk_all_tokens
    monkeypatch.setattr(ix, "_walk_head", lambda *args: walks.append(args[1]) or real_head(*args))
    monkeypatch.setattr(ix, "_walk_all_tokens", lambda *args: plain.append(args[2]) or real_plain(*args))
    guide.index.info(guide.index.dfa.walk(b"x"))
    assert walks == [head] and plain == []


@pytest.mark.parametrize("n", [0, 1, 5, crossing.SMALL_UNIQUE, crossing.SMALL_UNIQUE + 1, 5000])
def test_group_ends_are_numbered_as_np_unique_numbers_them(n):
    """A group walk numbers its ends in Python for a few tokens, with np.unique past SMALL_UNIQUE: alike either way."""
    values = np.random.default_rng(n).integers(0, max(n // 3, 1), size=n).astype(np.int32)
    distinct, index = crossing._distinct(values)
    expected, inverse = np.unique(values, return_inverse=True)
    assert distinct.dtype == np.int64 and index.dtype == np.int32
    assert np.array_equal(distinct, expected) and np.array_equal(index, inverse)

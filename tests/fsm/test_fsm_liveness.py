"""Token liveness (`fsm.liveness`) on small vocabularies that lack single-byte tokens, against a brute force: every
state of a term's DFA crawled over every token. `Spelling` proves states live by structure alone, so what it proves
must be live, and masks built on its answers must be the brute force's."""

from __future__ import annotations

import numpy as np
import pytest

import fsm
from fsm import index as ix
from fsm import liveness, rx
from fsm.lazy_dfa import DEAD, LazyDFA
from fsm.rx_parse import parse
from fsm.vocabulary import Vocabulary

pytestmark = pytest.mark.usefixtures("fresh_fsm_caches")

# "x" and 0xF1 have no token of their own (0xF1 only before 0x80); "z" has no token at all. id 0 is EOS.
WORDS = (b"", b"a", b"b", b"c", b"ab", b"xa", b"ax", b"xx", b"\xf1\x80", b"\x80", b"y", b'"', b'{"', b'"}', b",")
SINGLES = sum(1 << w[0] for w in WORDS if len(w) == 1)


def _letters(chars: str) -> rx.Rx:
    return rx.byte_set(sum(1 << ord(c) for c in chars))


def _rule(name: str, body_of) -> rx.Rx:
    """A recursive rule: `body_of(call)` is its body."""
    rule = rx.Rule(name)
    call = rx.call(rule, plain=True)
    rx.define(rule, body_of(call))
    return call


TERMS = {
    "needs x": rx.seq(rx.literal(b"a"), _letters("x"), rx.literal(b"a")),  # live: "ax" then "a"
    "needs x last": rx.seq(rx.literal(b"a"), _letters("x")),  # "ax" ends it
    "x or a": rx.star(rx.alt(rx.literal(b"ab"), _letters("ax"))),
    "only z": rx.seq(rx.literal(b"a"), rx.literal(b"z")),
    "z or b": rx.seq(rx.literal(b"a"), _letters("zb"), rx.optional(rx.literal(b"a"))),
    "f1 pair": rx.seq(rx.byte_set(1 << 0xF1), rx.byte_set(1 << 0x80), rx.literal(b"a")),
    "f1 alone": rx.seq(rx.literal(b"b"), rx.byte_set(1 << 0xF1), rx.byte_set(0xFF << 0x80)),
    "and with a plain part": rx.inter(rx.star(_letters("abx")), rx.seq(rx.star(_letters("ab")), _letters("b"))),
    "and needing x": rx.inter(rx.star(_letters("abx")), rx.seq(_letters("ab"), _letters("x"), rx.star(_letters("b")))),
    "and of two with x": rx.inter(rx.star(_letters("abx")), rx.seq(rx.star(_letters("ax")), rx.literal(b"xb"))),
    "not": rx.inter(rx.star(_letters("ax")), rx.complement(rx.star(rx.literal(b"a")))),
    "counted": rx.repeat(rx.alt(_letters("xa"), rx.literal(b"ab")), 2, 5),
    "list": rx.seq(rx.literal(b'"'), rx.any_order_list([rx.literal(b"a"), _letters("xb")], [rx.literal(b"bb")],
                                                        rx.NOTHING, rx.literal(b",")), rx.literal(b'"')),
    "list in braces": rx.seq(rx.literal(b'{"'), rx.any_order_list([rx.literal(b"a")], [], rx.NOTHING, rx.literal(b",")),
                             rx.literal(b'"}')),  # "{" only inside a token: not proved, yet live
    "regex": parse("(a|x)+b[abx]{0,3}"),
    "not with x": rx.inter(rx.seq(rx.star(_letters("abx")), _letters("b")), rx.complement(rx.literal(b"ab"))),
    "not from x": rx.inter(rx.seq(_letters("x"), rx.star(_letters("ab"))), rx.complement(rx.literal(b"xa"))),
}
RULES = {  # endless DFAs: checked along bounded walks
    "nest": _rule("nest", lambda call: rx.alt(rx.literal(b"a"), rx.seq(rx.literal(b'"'), call, rx.literal(b",")))),
    "nest with x": _rule("x", lambda call: rx.alt(_letters("ax"), rx.seq(rx.literal(b"b"), call, _letters("x")))),
    "needing z": _rule("z", lambda call: rx.alt(rx.literal(b"z"), rx.seq(rx.literal(b"b"), call))),
}


def _token_live(dfa: LazyDFA) -> np.ndarray:
    """(n_states,) bool: some sequence of tokens reaches acceptance from the state, over every state of the DFA."""
    dfa.explore_all()
    into: dict[int, set[int]] = {s: set() for s in range(dfa.n_states)}
    for state in range(dfa.n_states):
        for word in WORDS[1:]:
            end = dfa.walk(word, state)
            if end != DEAD:
                into[end].add(state)
    live = np.asarray(dfa.accepting[: dfa.n_states], dtype=bool).copy()
    todo = np.flatnonzero(live).tolist()
    while todo:
        for source in into[todo.pop()]:
            if not live[source]:
                live[source] = True
                todo.append(source)
    return live


@pytest.mark.parametrize("name", TERMS)
def test_what_spelling_proves_is_token_live(name):
    dfa = LazyDFA(TERMS[name])
    live = _token_live(dfa)
    spelling = liveness.Spelling(SINGLES)
    proved = [spelling.spelled(dfa.term(s)) for s in range(dfa.n_states)]
    assert all(live[s] for s in range(dfa.n_states) if proved[s]), [s for s in range(dfa.n_states) if proved[s]]


def test_spelling_proves_the_plain_parts_and_intersections_with_a_part_of_single_bytes():
    spelling = liveness.Spelling(SINGLES)
    proved = {name: spelling.spelled(term) for name, term in TERMS.items()}
    assert proved == {"needs x": False, "needs x last": False, "x or a": True, "only z": False, "z or b": True,
                      "f1 pair": False, "f1 alone": False, "and with a plain part": True, "and needing x": False,
                      "and of two with x": False, "not": False, "counted": True, "list": True, "list in braces": False,
                      "regex": True, "not with x": False, "not from x": False}
    assert {name: spelling.spelled(term) for name, term in RULES.items()} == {"nest": True, "nest with x": False,
                                                                            "needing z": False}


def test_every_state_of_a_proved_term_is_proved():
    """The derivatives of a proved term are built of its parts: the index skips the check for all its tokens."""
    spelling = liveness.Spelling(SINGLES)
    for name in ("x or a", "and with a plain part", "counted", "list", "regex"):
        dfa = LazyDFA(TERMS[name]).explore_all()
        assert all(spelling.spelled(dfa.term(s)) for s in range(dfa.n_states)), name


@pytest.mark.parametrize("name", TERMS)
def test_what_a_witness_of_single_bytes_proves_is_token_live(name):
    dfa = LazyDFA(TERMS[name])
    live = _token_live(dfa)
    check = liveness.TokenLiveness(dfa, frozenset(b for b in range(256) if SINGLES >> b & 1), crawl=None)
    proved = [s for s in range(dfa.n_states) if check._spells_witness(dfa.term(s))]
    assert all(live[s] for s in proved), proved


def test_a_witness_of_single_bytes_proves_what_the_spelling_does_not(monkeypatch):
    """(a|b|x)*b minus "ab": neither part is of single bytes alone, but its witness "b" is; "x(a|b)*" minus "xa"
    has the witness "x", which "x" alone does not spell: the emptiness test decides it."""
    restricted = []
    monkeypatch.setattr(liveness, "restrict", lambda term, *rest: restricted.append(term) or liveness.rx.NOTHING)
    singles = frozenset(b for b in range(256) if SINGLES >> b & 1)
    for name, proved in (("not with x", True), ("not from x", False)):
        dfa = LazyDFA(TERMS[name])
        assert not liveness.Spelling(SINGLES).spelled(dfa.term(0))
        check = liveness.TokenLiveness(dfa, singles, crawl=lambda state: (None, np.zeros(0, np.int64)))
        check.exact = np.zeros(1, dtype=bool)  # no crawl: what the emptiness test leaves is read as dead
        assert check._is_live(0) == proved
    assert restricted == [TERMS["not from x"]]


@pytest.mark.parametrize("name", TERMS)
def test_masks_are_the_brute_forces(name):
    """Every state a guide reaches allows exactly the tokens that lead somewhere token-live (and EOS where it
    accepts), whichever path its first visit took."""
    index = ix.TokenIndex(LazyDFA(TERMS[name]), Vocabulary(WORDS, (0,)))
    reference = LazyDFA(TERMS[name])
    live = _token_live(reference)
    seen, todo = {0}, [0]
    while todo:
        state = todo.pop()
        ref_state = reference.state_of(index.dfa.term(state))
        expected = [t for t, word in enumerate(WORDS) if t and _lives(reference, live, word, ref_state)]
        expected += [0] if index.is_accepting(state) else []
        info = index.info(state)
        assert info.token_ids.tolist() == sorted(expected), (name, state)
        for nxt in info.next_states.tolist():
            if nxt >= 0 and nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)


@pytest.mark.parametrize("name", RULES)
def test_what_spelling_proves_of_a_rule_single_bytes_spell(name):
    """Along every walk of up to 6 tokens: a proved state reaches acceptance by single-byte tokens alone."""
    dfa, spelling = LazyDFA(RULES[name]), liveness.Spelling(SINGLES)
    states = {0}
    for _ in range(6):
        states |= {dfa.walk(w, s) for s in states for w in WORDS[1:]} - {DEAD}
    assert spelling.spelled(dfa.term(0)) == (name == "nest")
    for state in states:
        if spelling.spelled(dfa.term(state)):
            assert _single_bytes_finish(dfa, state), (name, state)


def _single_bytes_finish(dfa: LazyDFA, state: int, limit: int = 5_000) -> bool:
    seen, todo = {state}, [state]
    while todo and len(seen) < limit:
        state = todo.pop(0)
        if dfa.accepting[state]:
            return True
        for byte in range(256):
            nxt = dfa.next(state, byte) if SINGLES >> byte & 1 else DEAD
            if nxt != DEAD and nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return False


def _lives(dfa: LazyDFA, live: np.ndarray, word: bytes, state: int) -> bool:
    end = dfa.walk(word, state)
    return end != DEAD and bool(live[end])


def test_smollm2_spells_a_plain_schema_without_a_check(smol_tokenizer, monkeypatch):
    """SmolLM2 lacks 0xF1 and 0xF2 alone, but a JSON string's byte sets hold other bytes: a schema of strings,
    numbers and enums is walked with no liveness check (a deterministic count of the work saved)."""
    checks = []
    is_live = liveness.TokenLiveness._is_live
    monkeypatch.setattr(liveness.TokenLiveness, "_is_live", lambda self, s: checks.append(s) or is_live(self, s))
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "n": {"type": "integer"},
                                               "kind": {"enum": ["a", "b"]}}, "required": ["name", "n", "kind"]}
    guide = fsm.Guide.from_schema(schema, smol_tokenizer)
    assert not guide.index._live.trivial
    for token in guide.index.vocabulary.encode('{"name":"naïve 🙂","n":12,"kind":"b"}'):
        guide.mask()
        guide.advance(token)
    assert guide.is_final() and checks == []


def test_smollm2_checks_the_states_of_a_pattern_that_needs_a_byte_it_lacks(smol_tokenizer):
    """SmolLM2 has no token with 0xF1 (U+40000..U+7FFFF start with it): after "b" this pattern needs one, so the
    string's first state is not proved and drops "b", which a walk of its bytes alone would allow."""
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^(b[\U00040000-\U0007ffff]|c)+$"}},
              "required": ["s"]}
    index = fsm.Guide.from_schema(schema, smol_tokenizer).index
    state = index.dfa.walk(b'{"s":"')
    assert not index._live.all_live_from(state)
    b, c = (index.vocabulary.ids_by_bytes[word] for word in (b"b", b"c"))
    assert index.dfa.walk(b"b", state) != DEAD
    allowed = index.info(state).token_ids.tolist()
    assert c in allowed and b not in allowed

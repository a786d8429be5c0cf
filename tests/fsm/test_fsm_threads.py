"""Thread safety: guides (and one bare lazy DFA) shared by many threads, with the interpreter forced to
switch threads every microsecond, answer exactly as a fresh index does sequentially."""

from __future__ import annotations

import random
import sys
import threading

import numpy as np
import pytest

import fsm
from fsm import rx
from fsm.index import FINISHED, TokenIndex
from fsm.lazy_dfa import LazyDFA

N_THREADS = 8


def _run_threads(target, n: int = N_THREADS) -> list:
    results, errors = [None] * n, []
    barrier = threading.Barrier(n)

    def run(i):
        try:
            barrier.wait()
            results[i] = target(i)
        except BaseException as error:  # noqa: BLE001 - reported below, with the thread's number
            errors.append((i, repr(error)))

    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(previous)
    assert not errors, errors
    return results


def _walk(guide: fsm.Guide, rng: random.Random, steps: int) -> list[tuple[int, int, bytes]]:
    """(token, term id of the state, allowed ids) at every step of a random walk."""
    eos, out = set(guide.eos_token_ids), []
    for _ in range(steps):
        if guide.is_finished():
            break
        allowed = guide.index.info(guide.state).token_ids
        assert guide.mask().sum() == len(allowed)
        choices = [t for t in allowed.tolist() if t not in eos] or allowed.tolist()
        token = rng.choice(choices)
        out.append((token, _term_id(guide), allowed.tobytes()))
        guide.advance(token)
    return out


def _term_id(guide: fsm.Guide) -> int:
    return -1 if guide.state == FINISHED else guide.index.dfa.term(guide.state).id


SCHEMAS = [
    {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 3000},
            "n": {"type": "integer", "minimum": -(2**63)},
            "tags": {"type": "array", "items": {"enum": ["a", "bb", "ccc"]}},
        },
        "required": ["name", "n"],
    },
    {"type": "array", "items": {"type": "number", "minimum": -1e40, "maximum": 1e40}, "maxItems": 50},
]


@pytest.mark.parametrize("schema", SCHEMAS)
def test_concurrent_guides_answer_like_a_fresh_sequential_index(smol_tokenizer, schema):
    term = fsm.compile_schema(schema)
    vocabulary = fsm.Guide.from_rx(term, smol_tokenizer).index.vocabulary
    shared = TokenIndex(LazyDFA(term), vocabulary)  # fresh: every state is first visited by the threads
    walks = _run_threads(lambda i: _walk(fsm.Guide(shared), random.Random(i), steps=60))
    reference = TokenIndex(LazyDFA(term), vocabulary)  # built by one thread
    for i, walk in enumerate(walks):
        guide = fsm.Guide(reference)
        for token, term_id, allowed in walk:
            assert _term_id(guide) == term_id and guide.index.info(guide.state).token_ids.tobytes() == allowed, i
            guide.advance(token)
    states = range(min(shared.dfa.n_states, 200))  # fixed first: computing forced tokens discovers more states
    forced = _run_threads(lambda i: [fsm.Guide(shared, s).forced() for s in states])
    by_term = {reference.dfa._add(shared.dfa.term(s)): f for s, f in zip(states, forced[0])}
    assert all(f == forced[0] for f in forced)
    assert all(fsm.Guide(reference, s).forced() == f for s, f in by_term.items() if s >= 0)


@pytest.mark.parametrize("round_", range(4))
def test_one_lazy_dfa_driven_from_many_threads_matches_the_terms(round_):
    term = fsm.compile_schema({"type": "array", "items": {"type": "string", "maxLength": 500}})
    dfa = LazyDFA(term)  # fresh each round: the threads grow its table concurrently
    alphabet = list(b'ab\\u0"\xc3\xa9') + [0x61] * 20
    texts = [[b'["' + bytes(random.Random(f"{round_}/{i}/{k}").choices(alphabet, k=40 + 10 * k)) for k in range(30)]
             for i in range(N_THREADS)]
    answers = _run_threads(lambda i: [dfa.fullmatch(t) or dfa.walk(t) != -1 for t in texts[i]])
    for batch, got in zip(texts, answers):
        for text, answer in zip(batch, got):
            expected = rx.matches(term, text) or _prefix_live(term, text)
            assert answer == expected, text


def _prefix_live(term: rx.Rx, data: bytes) -> bool:
    for byte in data:
        term = rx.derivative(term, byte)
        if term is rx.NOTHING or rx.is_empty(term):
            return False
    return True


def test_concurrent_guide_construction_shares_one_index(smol_tokenizer):
    schema = {"type": "object", "properties": {"threads": {"type": "integer", "minimum": 17, "maximum": 10**30 + 17}}}
    indexes = _run_threads(lambda i: fsm.Guide.from_schema(schema, smol_tokenizer).index)
    assert all(index is indexes[0] for index in indexes)
    assert np.array_equal(fsm.Guide(indexes[0]).mask().numpy(), fsm.Guide(indexes[3]).mask().numpy())

"""generate_batch() with an assistant of another tokenizer drafts for its rows together: the rows that need the
assistant's next token in a step get it from one batched forward (the engine's `drafting.assistant.Assistant` over a
`ForeignAsker` per row), each row's text respelled between the vocabularies as alone.

Each row of a batch (prompts of different lengths, drafts of different lengths, refills) is decoded as alone: its
tokens are plain decoding of the target, and what it drafts and has accepted, step by step, is what single-row
`generate` drafts with the same assistant; greedy identity alone cannot see a drafter that drafts from a wrong context,
so a control puts the target's ids into the assistant's cache and must fail the drafting check. Pairs: a tiny random
Llama and a nudged copy behind a shuffled vocabulary (`tests.helpers_foreign.permuted`: it writes about the target's
text, in ids that mean nothing to the target), in float (padded forwards, equal up to rounding), int8 (padded,
row-invariant: bitwise) and 4-bit (ragged, row-invariant, the assistant's cache filled lazily by its first draft).
"""

from __future__ import annotations

import pytest

from assisted import generate, generate_batch
from assisted.models.int4_models import int4_copy, quantize_int4
from assisted.models.int8 import int8_copy, quantize_int8
from assisted.rows.row import Row
from drafting.batch_kv import BatchKV
from tests.assisted.test_generate_batch import CONSTRAINTS, PROMPTS, V, nudged
from tests.helpers_foreign import permuted
from tests.helpers_models import smollm2_tokenizer, tiny_llama

pytestmark = [pytest.mark.usefixtures("one_thread")]

KINDS = {  # (target, assistant before its vocabulary is shuffled), each from its own seeded float model
    "float": lambda: (tiny_llama(V, seed=0), nudged(tiny_llama(V, seed=0), 0.002)),
    "int8": lambda: (quantize_int8(tiny_llama(V, seed=0)), nudged(tiny_llama(V, seed=0), 0.002)),
    "int4-ragged": lambda: (quantize_int4(tiny_llama(V, seed=0, hidden=64)),
                            nudged(tiny_llama(V, seed=0, hidden=64), 0.002)),
}
COPIES = {"float": lambda m: m, "int8": int8_copy, "int4-ragged": int4_copy}


@pytest.fixture(scope="module")
def tok():
    return smollm2_tokenizer()


@pytest.fixture(scope="module")
def pairs(tok):
    """kind -> (target, foreign assistant, its tokenizer); built on first use."""
    built = {}

    def pair(kind: str):
        if kind not in built:
            target, near = KINDS[kind]()
            helper, helper_tok = permuted(near, tok, seed=1)
            built[kind] = target, COPIES[kind](helper), helper_tok
        return built[kind]

    return pair


def drafting(result) -> tuple:
    """What a row drafted and had accepted, by source, and its step records (k, sources, accepted)."""
    stats = result.stats
    return stats.drafted_by_source, stats.accepted_by_source, stats.steps


def rows_and_alone(target, helper, helper_tok, tok, **kw) -> tuple[list, list]:
    """The batch's rows (3 at a time, refilled) and each prompt decoded alone with the same assistant."""
    kw = dict(tokenizer=tok, assistant_tokenizer=helper_tok, max_new_tokens=24, num_assistant_tokens=3, **kw)
    rows = generate_batch(target, helper, prompts=PROMPTS, batch_size=3, **kw)
    return rows, [generate(target, helper, prompt=prompt, **kw) for prompt in PROMPTS]


@pytest.mark.parametrize("kind, constraint, schedule", [
    ("float", "none", "constant"), ("float", "schema-verified", "heuristic"), ("int8", "none", "heuristic"),
    ("int8", "regex", "constant"), ("int4-ragged", "none", "heuristic")])
def test_each_row_drafts_accepts_and_decodes_as_alone(tok, pairs, plain_reference, kind, constraint, schedule):
    target, helper, helper_tok = pairs(kind)
    if kind == "int4-ragged":
        assert BatchKV(target).ragged() is not None and BatchKV(helper).ragged() is not None
    kw = dict(num_assistant_tokens_schedule=schedule, **CONSTRAINTS[constraint])
    rows, alone = rows_and_alone(target, helper, helper_tok, tok, **kw)
    plain = {k: v for k, v in kw.items() if k not in ("num_assistant_tokens_schedule",)}
    for i, (prompt, row, one) in enumerate(zip(PROMPTS, rows, alone)):
        ref = plain_reference(target, tokenizer=tok, prompt=prompt, max_new_tokens=24, **plain)
        assert row.error is None, f"row {i}: {row.error}"
        assert (row.token_ids, row.stop_reason) == (one.token_ids, one.stop_reason) == \
            (ref.token_ids, ref.stop_reason), f"row {i}"
        assert drafting(row) == drafting(one), f"row {i}: k trace {row.stats.k_trace} != {one.stats.k_trace}"
    batch, drafted = rows[0].batch, [r.stats.drafted_by_source["assistant"] for r in rows]
    accepted = sum(r.stats.accepted_by_source["assistant"] for r in rows)
    assert len(set(drafted)) > 1 and 0.1 * sum(drafted) < accepted < 0.9 * sum(drafted)  # differing, partly accepted
    assert batch.refills == len(PROMPTS) - 3 and batch.rows_per_forward > 1
    passes = sum(r.stats.assistant_forward_passes for r in rows)
    assert 0 < batch.assistant_forwards < passes  # rows drafted together: a forward serves several rows
    assert all(r.stats.seconds.assistant_tokenizer > 0 for r in rows)  # each row's respelling booked on it


def test_a_batch_that_feeds_its_assistant_the_targets_ids_fails_the_drafting_check(tok, pairs, monkeypatch):
    """Control: the assistant's cache prefilled with the target's prompt ids (not its own): every row's output is still
    plain decoding (the target verifies), but what the rows draft differs from alone, and the check above sees it."""
    target, helper, helper_tok = pairs("float")
    monkeypatch.setattr(Row, "helper_seq", property(lambda row: row.seq))
    rows, alone = rows_and_alone(target, helper, helper_tok, tok, num_assistant_tokens_schedule="constant")
    assert [r.token_ids for r in rows] == [a.token_ids for a in alone]
    assert any(drafting(row) != drafting(one) for row, one in zip(rows[:3], alone[:3]))

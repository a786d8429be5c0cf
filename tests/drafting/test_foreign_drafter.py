"""`drafting.foreign_drafter.ForeignDrafter`: an assistant with its own tokenizer keeps in step with the target by text.

The target spells text in characters (a b c d), the assistant in an 8-token BPE (a b c d ab cd ba) and always writes
"ab" (a boosted head): its text is "abab...", its target tokens a b a b ... It is asked as the engine asks it: one
target token per call, through the assistant's drafting rounds (`drafting.assistant.Assistant.rounds` with a
`ForeignAsker`) on one row's cache.
"""

from __future__ import annotations

import math

import pytest
import torch

import fsm
from drafting.assistant import Assistant
from drafting.base import Cursor, Drafted
from drafting.foreign_drafter import GREEDY, ForeignAsker, ForeignDrafter
from drafting.proposal import Proposal
from drafting.respell import speller
from drafting.row_kv import OneRow
from tests.helpers_foreign import char_tokenizer
from tests.helpers_models import boost, tiny_llama, tiny_tokenizer

A, B, C, D = 1, 2, 3, 4  # target ids (char tokenizer)
AB, CD = 5, 6  # assistant ids (tiny tokenizer)
PROMPT = [1, 2]  # the target's prompt "ab"; the assistant's is its own


class Asked(ForeignDrafter):
    """The drafter with `draft(context, regex)`: its target token after `context` under the target's guide."""

    def attach(self, assistant) -> Asked:
        self.assistant = Assistant(OneRow(assistant), GREEDY)
        return self

    @property
    def cached(self) -> int:
        return self.assistant.kv.lengths[0]

    def draft(self, context: list[int], regex: str | None = None) -> Drafted | None:
        guide = None if regex is None else fsm.Guide.from_regex(regex, char_tokenizer())
        proposal = Proposal(context, Cursor(guide, frozenset({0})), k=1, lookup_k=0, limit=1, use_forced=False)
        self.assistant.rounds([ForeignAsker(proposal, self)])
        return proposal.drawn[0] if proposal.tokens else None


@pytest.fixture
def drafter():
    assistant = boost(tiny_llama(8, seed=4, eos=0), AB, 50.0)
    target_speller = speller(fsm.vocabulary_from_tokenizer(char_tokenizer()))
    own = speller(fsm.vocabulary_from_tokenizer(tiny_tokenizer()))
    with torch.inference_mode():
        yield Asked([AB], Cursor(None, frozenset({0})), target_speller, own, len(PROMPT), frozenset({0})).attach(
            assistant)


def test_it_hands_out_settled_target_tokens_of_its_text(drafter):
    first = drafter.draft(PROMPT, None)
    assert first.token == A and first.q is None  # "ab" is spelled a b; b waits for what follows
    assert drafter.out == [AB] and drafter.calls == 1
    assert [drafter.draft(PROMPT + [A], None).token, drafter.draft(PROMPT + [A, B], None).token] == [B, A]
    assert drafter.calls == 2 and drafter.asked == 3 and drafter.drafted == 3


def test_tokens_it_predicted_are_handed_out_without_the_tokenizer(drafter, monkeypatch):
    drafter.draft(PROMPT, None)
    drafter.draft(PROMPT + [A], None)  # "abab": b and a are settled
    spent = drafter.tokenizer_seconds
    assert drafter.draft(PROMPT + [A, B], None).token == A and drafter.tokenizer_seconds == spent


def test_after_the_target_writes_something_else_it_keeps_the_common_text_and_feeds_the_rest(drafter):
    for context in (PROMPT, PROMPT + [A], PROMPT + [A, B]):
        drafter.draft(context, None)
    assert drafter.out == [AB, AB] and drafter.cached == 2  # prompt and the first "ab"
    drafter.draft(PROMPT + [A, B, C, D], None)  # the target wrote "abcd": its "ab" stays, "cd" is fed
    assert drafter.out[:2] == [AB, CD] and bytes(drafter.data).startswith(b"abcd")
    assert drafter.cached == 3  # the prompt, "ab" kept, "cd" fed with the next forward (its token not yet fed)
    drafter.draft(PROMPT + [C], None)  # the target's text is now "c": nothing of the assistant's stays
    assert bytes(drafter.data).startswith(b"c") and drafter.out[0] == C


def test_a_token_the_targets_guide_forbids_ends_the_draft(drafter):
    assert drafter.draft(PROMPT, "[bcd]+") is None and drafter.drafted == 0 and drafter.asked == 1  # no "a"


def test_confidence_is_the_product_over_the_assistant_tokens_that_wrote_the_target_token(drafter):
    drafter.draft(PROMPT, None)
    drafter.out, drafter.conf, drafter.ends, drafter.data = [AB, CD], [0.5, 0.8], [2, 4], bytearray(b"abcd")
    drafter.done = True
    drafter.seen, drafter.seen_ids, drafter.seen_ends = bytearray(), [], []
    ids, confidence = drafter._settled()
    assert ids == [A, B, C, D] and confidence == [0.5, 0.5, 0.8, 0.8]
    drafter.conf = [math.nan, 0.8]  # a fed or forced token counts 1
    assert drafter._settled()[1] == [1.0, 1.0, 0.8, 0.8]


def test_it_stops_at_its_position_limit(drafter):
    drafter.max_positions = 2  # the prompt and one token
    assert drafter.draft(PROMPT, None).token == A
    drafter.draft(PROMPT + [A], None)
    assert drafter.calls == 1 and len(drafter.out) == 1

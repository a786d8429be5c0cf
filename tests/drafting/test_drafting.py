"""drafting/: forced runs, the assistant under the guide's mask, their combination, cache feeding.

A row's draft is made here as the engine makes it: a `Proposal` completed by the engine's `Assistant` over one row's
cache (`OneRow`), or, without an assistant, by `Proposal.fill` alone.
"""

import pytest
import torch

import fsm
from drafting.kv_cache import forward, new_cache
from drafting.sampling import Warp, make_generator
from drafting import Cursor, ForcedTokens, Proposal
from drafting.assistant import Assistant, pick, settle
from drafting.base import DeviceMasks
from drafting.lookup import PromptLookup
from drafting.row_kv import OneRow
from tests.helpers_models import TINY_WORDS, boost, tiny_llama, tiny_tokenizer
from tests.helpers_rounding import assert_within, gamma

pytestmark = [pytest.mark.usefixtures("one_thread")]

EOS = 0
GREEDY, SAMPLING = Warp(False), Warp(True, temperature=0.8)


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def cursor(tok, regex):
    guide = None if regex is None else fsm.Guide.from_regex(regex, tok)
    return Cursor(guide, frozenset([EOS]))


def spell(tokens):
    return "".join(TINY_WORDS[t] for t in tokens)


CPU = torch.device("cpu")


def propose(tok, assistant: Assistant | None, seq, c: Cursor, *, k, limit, lookup=None, lookup_k=None, cut=None,
            use_forced=True, generator=None):
    """One row's draft after `seq` from the guide state `c` (advanced here), as the engine drafts it: up to `k`
    assistant tokens, then up to `lookup_k` (default k) prompt-lookup copies, at most `limit` in all."""
    sampling = assistant is not None and assistant.warp.do_sample
    proposal = Proposal(seq, c, k=k if assistant is not None else 0, lookup_k=k if lookup_k is None else lookup_k,
                        limit=limit, lookup=lookup, use_forced=use_forced, sampling=sampling, cut=cut)
    if assistant is None:
        assert not proposal.fill()
    else:
        assistant.draft([proposal], [generator], [None])
    return proposal.draft(DeviceMasks(CPU), len(tok), CPU)


def one_row(model, warp=GREEDY) -> Assistant:
    """The engine's assistant over one row's own dynamic cache."""
    return Assistant(OneRow(model), warp)


def test_forced_tokens_come_in_the_tokenizers_own_spelling(tok):
    c = cursor(tok, "abcd(a|b)")
    forced = ForcedTokens()
    run = []
    while (t := forced.next(c)) is not None:
        run.append(t)
        c.advance(t)
    assert spell(run) == "abcd" and run == [5, 6]  # "ab" "cd", not a b c d


def test_forced_only_source_drafts_the_run_and_stops_where_the_model_must_choose(tok):
    c = cursor(tok, "abcd(a|b)d")
    draft = propose(tok, None, [1], c.copy(), k=5, limit=10)
    assert draft.tokens == (5, 6) and draft.forced == (True, True) and draft.model_drafted == 0
    assert draft.masks.shape == (3, len(tok)) and not draft.ends_output
    g = c.copy()
    for i, token in enumerate(draft.tokens):  # row i is the guide state before token i
        assert torch.equal(draft.masks[i], g.mask())
        g.advance(token)
    assert torch.equal(draft.masks[2], g.mask())


def test_a_forced_run_to_the_end_ends_the_output_and_the_limit_cuts_it(tok):
    c = cursor(tok, "abcdba")
    assert propose(tok, None, [1], c.copy(), k=5, limit=10).ends_output
    cut = propose(tok, None, [1], c.copy(), k=5, limit=1)
    assert cut.tokens == (5,) and not cut.ends_output


def test_without_assistant_and_forced_tokens_drafts_are_empty(tok):
    draft = propose(tok, None, [1], cursor(tok, "abcd(a|b)").copy(), k=5, limit=10, use_forced=False)
    assert draft.tokens == () and draft.masks.shape == (1, len(tok))


@pytest.mark.parametrize("warp", [GREEDY, SAMPLING], ids=["greedy", "sampling"])
def test_assistant_drafts_only_allowed_tokens_and_forced_ones_do_not_count_against_k(tok, warp):
    model = tiny_llama(len(tok), seed=3, init=0.5, eos=EOS)
    c = cursor(tok, "(a|b|c|d)(cd)(a|b)+")
    draft = propose(tok, one_row(model, warp), [1, 2], c.copy(), k=3, limit=20, generator=make_generator(CPU, 0))
    assert draft.model_drafted == 3
    assert draft.forced == (False, True, False, False)  # model, forced "cd", model, model
    g = c.copy()
    for token in draft.tokens:
        assert token in g.guide.allowed()
        g.advance(token)
    if warp.do_sample:
        assert draft.q.shape == (4, len(tok))
        assert_within(draft.q.sum(-1), torch.ones(4, dtype=torch.float64), 2 * gamma(2 * len(tok)), "sum of q")
        assert draft.q[1, 6] == 1.0  # the forced token is a point mass
        assert (draft.q[~draft.masks[:-1]] == 0).all()  # q lives inside the mask
    else:
        assert draft.q is None


def test_assistant_feeds_tokens_it_did_not_produce_and_rolls_back(tok):
    model = tiny_llama(len(tok), seed=4, init=0.5, eos=EOS)
    assistant = one_row(model)
    seq = [1, 2, 3]
    draft = propose(tok, assistant, seq, Cursor(None, frozenset([EOS])), k=4, limit=10)
    assert len(draft.tokens) == 4
    assert assistant.kv.lengths == [len(seq) + 3]  # the last drafted token has not been fed yet
    assistant.rollback([len(seq) + 1])  # one draft token accepted, then the target's own token
    assert assistant.kv.kv.cache.get_seq_length() == len(seq) + 1
    committed = seq + [draft.tokens[0], 7]
    again = propose(tok, assistant, committed, Cursor(None, frozenset([EOS])), k=1, limit=10)  # feeds [7] first
    full = forward(model, new_cache(), committed, 1)  # a fresh forward over the whole sequence
    assert again.tokens == (int(full.argmax(-1)),)
    assert assistant.kv.lengths == [len(committed)]


def test_drafting_stops_after_eos(tok):
    model = boost(tiny_llama(len(tok), seed=5, eos=EOS), EOS, 50.0)
    draft = propose(tok, one_row(model), [1], Cursor(None, frozenset([EOS])), k=5, limit=10)
    assert draft.tokens == (EOS,) and draft.ends_output


def test_drafting_stops_at_a_final_state_that_allows_only_eos(tok):
    model = tiny_llama(len(tok), seed=6, init=0.5, eos=EOS)
    draft = propose(tok, one_row(model), [1], cursor(tok, "(a|b)(c|d)"), k=5, limit=10)
    assert len(draft.tokens) == 2 and draft.ends_output and draft.model_drafted == 2


def test_cursor_final_only_and_clock(tok):
    c = cursor(tok, "ab(cd)?")
    assert not c.only_eos_left()
    c.advance(5)
    assert c.guide.is_final() and not c.only_eos_left()  # final, but "cd" may still follow
    c.advance(6)
    assert c.only_eos_left()
    assert c.clock.seconds > 0 and c.copy().clock is c.clock
    free = Cursor(None, frozenset([EOS]))
    assert free.mask() is None and free.forced() == [] and not free.only_eos_left()


def test_device_masks_copy_each_mask_once():
    mask = torch.ones(5, dtype=torch.bool)
    assert DeviceMasks(torch.device("cpu"))(mask) is mask
    on_meta = DeviceMasks(torch.device("meta"))
    assert on_meta(mask).device.type == "meta" and on_meta(mask) is on_meta(mask)
    assert on_meta(None) is None


def test_k_zero_still_offers_free_lookup_drafts_and_calls_no_assistant(tok):
    seq = [1, 6, 7, 1, 6]  # "a cd ba a cd": the tail "acd" occurred before, followed by "ba"
    assistant, lookup = one_row(tiny_llama(len(tok), seed=4, eos=EOS)), PromptLookup(tok, seq)
    draft = propose(tok, assistant, seq, Cursor(None, frozenset([EOS])), k=0, limit=10, lookup=lookup, lookup_k=3)
    assert draft.tokens and set(draft.sources) == {"lookup"} and assistant.forwards == 0
    again = propose(tok, assistant, seq, Cursor(None, frozenset([EOS])), k=0, limit=10, lookup=lookup)
    assert again.tokens == ()  # lookup_k: k by default


def test_a_drafting_assistant_goes_before_lookup_which_extends_its_draft(tok):
    seq = [1, 6, 7, 1, 6]  # "a cd ba a cd": lookup would copy "ba a cd"; this assistant drafts "ba"

    def sources(k, lookup_k):
        assistant = one_row(boost(tiny_llama(len(tok), seed=4, eos=EOS), 7, 50.0))
        return propose(tok, assistant, seq, Cursor(None, frozenset([EOS])), k=k, limit=10,
                       lookup=PromptLookup(tok, seq), lookup_k=lookup_k).sources

    assert sources(k=2, lookup_k=0) == ("assistant", "assistant")
    assert sources(k=1, lookup_k=2) == ("assistant", "lookup", "lookup")


@pytest.mark.parametrize("warp", [GREEDY, SAMPLING], ids=["greedy", "sampling"])
def test_a_cut_ends_the_draft_and_under_sampling_drops_only_its_last_token(tok, warp):
    model = tiny_llama(len(tok), seed=4, init=0.5, eos=EOS)
    asked = []

    def cut(confidence):  # after the third draft: keep none of them
        asked.append(confidence)
        return 0 if len(confidence) == 3 else None

    draft = propose(tok, one_row(model, warp), [1], cursor(tok, "[abcd]{12}"), k=5, limit=10, cut=cut,
                    generator=make_generator(CPU, 0))
    assert [len(c) for c in asked] == [1, 2, 3] and all(0 < c <= 1 for c in asked[-1])
    assert len(draft.tokens) == (2 if warp.do_sample else 0) and not draft.ends_output
    assert draft.masks.shape[0] == len(draft.tokens) + 1 and len(draft.confidence) == len(draft.tokens)
    if warp.do_sample:
        assert draft.q.shape[0] == 2


def test_the_confidence_is_the_unwarped_distributions_at_any_temperature(tok):
    """At a low temperature q is near one-hot where the assistant is unsure: the cut must still see that."""
    model = tiny_llama(len(tok), seed=4, init=0.5, eos=EOS)
    seq, mask = [1, 6, 7], torch.ones(len(tok), dtype=torch.bool)
    logits = forward(model, new_cache(), seq, 1)[0].float()  # (V,)
    expected = logits.softmax(-1).max().item()
    for warp in (GREEDY, Warp(True, temperature=0.05), Warp(True, temperature=1.5, top_k=3)):
        (drafted,) = settle([pick(logits[None], mask, warp, make_generator(CPU, 0))])
        assert drafted.confidence == pytest.approx(expected, rel=1e-5)
        if warp.temperature == 0.05:
            assert expected < 0.5 < drafted.q.max().item()  # the warped distribution would have said "sure"


def test_the_cut_is_asked_after_eos_too(tok):
    model = boost(tiny_llama(len(tok), seed=5, eos=EOS), EOS, 50.0)
    draft = propose(tok, one_row(model), [1], Cursor(None, frozenset([EOS])), k=5, limit=10, cut=lambda confidence: 0)
    assert draft.tokens == () and not draft.ends_output


def test_rows_drafted_together_draft_what_each_row_drafts_alone(tok):
    """One proposal rule for one row or many: the rows' assistant (one forward per drafting step for every asking
    row, on one batch cache) gives each row the draft it gets alone, on its own cache."""
    from drafting.batch_kv import BatchKV

    model = tiny_llama(len(tok), seed=4, init=0.5, eos=EOS)
    rows = [([1, 6, 7, 1, 6], None, 0), ([2, 5], "[abcd]{3}(ab|cd)", 3), ([3], "abcd(a|b)", 2)]  # (seq, regex, k)
    alone = [propose(tok, one_row(model), seq, cursor(tok, regex), k=k, limit=6, lookup=PromptLookup(tok, seq),
                     lookup_k=2) for seq, regex, k in rows]
    assert {s for d in alone for s in d.sources} == {"forced", "lookup", "assistant"}
    batch = Assistant(BatchKV(model), GREEDY)
    for slot, (seq, _, _) in enumerate(rows):
        batch.kv.place(slot, seq[:-1])
    proposals = [Proposal(seq, cursor(tok, regex), k=k, lookup_k=2, limit=6, lookup=PromptLookup(tok, seq))
                 for seq, regex, k in rows]
    took = batch.draft(proposals, [None] * len(rows), [None] * len(rows))
    together = [p.draft(DeviceMasks(CPU), len(tok), CPU) for p in proposals]
    assert [(d.tokens, d.sources, d.ends_output) for d in together] == \
        [(d.tokens, d.sources, d.ends_output) for d in alone]
    assert took == [d.model_drafted for d in alone] and batch.forwards == max(took)

"""drafting.heads and drafting.ranking: reduced logits equal the full head's on the kept ids, -inf elsewhere; the
full head takes over where the mask allows nothing kept; q is zero outside the kept ids; int8 assistants."""

from __future__ import annotations

import pytest
import torch

from assisted.loading import int8_copy
from drafting import heads
from drafting.assistant import AssistantDrafter
from drafting.cache import forward, new_cache
from drafting.heads import DraftHead, full_rows, hidden_state, reducible, slice_rows
from drafting.ranking import token_ranks, top_ids
from drafting.sampling import Warp
from tests.helpers_models import (
    smollm2_tokenizer,
    tiny_gpt2,
    tiny_llama,
    tiny_tokenizer,
)

pytestmark = [pytest.mark.usefixtures("one_thread")]

V = 512
PROMPT = [5, 17, 300, 42]


def models():
    llama = tiny_llama(V, seed=0, init=0.2)
    boosted = tiny_llama(V, seed=4, init=0.2)
    with torch.no_grad():
        boosted.lm_head.bias = torch.nn.Parameter(torch.randn(V))  # a head with a bias
    return {"llama": llama, "llama-bias": boosted, "gpt2-tied": tiny_gpt2(V, seed=1, init=0.2),
            "llama-int8": int8_copy(tiny_llama(V, seed=2, init=0.2))}


MODELS = models()


def full_logits(model, ids):
    with torch.inference_mode():
        return forward(model, new_cache(), ids, 1).float()  # (1, V)


def head_logits(model, ids, rows):
    with torch.inference_mode():
        return rows.logits(hidden_state(model, new_cache(), ids), V)  # (1, V)


@pytest.mark.parametrize("name", list(MODELS))
def test_reduced_logits_equal_the_full_heads_on_the_kept_ids(name):
    model = MODELS[name]
    kept = torch.tensor([0, 3, 7, 100, 299, 511])
    reduced = head_logits(model, PROMPT, slice_rows(model, kept))
    full = full_logits(model, PROMPT)
    outside = torch.ones(V, dtype=torch.bool)
    outside[kept] = False
    torch.testing.assert_close(reduced[0, kept], full[0, kept], rtol=1e-5, atol=1e-5)
    assert torch.isneginf(reduced[0, outside]).all()
    torch.testing.assert_close(head_logits(model, PROMPT, full_rows(model)), full, rtol=1e-5, atol=1e-5)


def test_heads_that_rescale_their_logits_are_refused():
    model = tiny_llama(V, seed=0)
    assert reducible(model) is None
    model.config.final_logit_softcapping = 30.0
    assert "final_logit_softcapping" in reducible(model)


def mask_of(ids):
    mask = torch.zeros(V, dtype=torch.bool)
    mask[torch.tensor(ids)] = True
    return mask


@pytest.mark.parametrize("name", ["llama", "llama-int8"])
def test_the_full_head_takes_over_where_the_mask_allows_nothing_kept(monkeypatch, name):
    monkeypatch.setattr(heads, "SPARSE_ROWS", 0)  # no mask-sparse rows: only kept vs full
    model = MODELS[name]
    head = DraftHead(model, V, torch.arange(64), extra=torch.tensor(PROMPT))
    outside = mask_of([400, 401, 402])  # none kept (the prompt adds 300, not these)
    assert head.rows(outside) is head.full
    assert head.rows(mask_of([1, 400])) is head.kept and head.rows(None) is head.kept
    assert head.fallbacks == 1
    drafter = AssistantDrafter(model, Warp(), None, head)
    token, _, _ = drafter.next(PROMPT, outside)
    assert token == 400 + int(full_logits(model, PROMPT)[0, 400:403].argmax())


@pytest.mark.parametrize("name", ["llama", "llama-int8"])
def test_a_small_mask_computes_only_its_rows(monkeypatch, name):
    monkeypatch.setattr(heads, "SPARSE_ROWS", 4)
    model = MODELS[name]
    head = DraftHead(model, V, None)
    allowed = [7, 8, 9, 450]
    rows = head.rows(mask_of(allowed))
    assert rows is not head.full and rows.ids.tolist() == allowed and head.sparse_steps == 1
    assert head.rows(mask_of(allowed + [10])) is head.full  # more than SPARSE_ROWS allowed
    reduced = head_logits(model, PROMPT, rows)
    torch.testing.assert_close(reduced[0, allowed], full_logits(model, PROMPT)[0, allowed], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("masked", [False, True])
def test_q_rows_are_zero_outside_the_kept_ids_and_a_distribution(monkeypatch, masked):
    monkeypatch.setattr(heads, "SPARSE_ROWS", 0)
    model, kept = MODELS["llama"], torch.arange(0, V, 3)  # every third id
    head = DraftHead(model, V, kept, extra=torch.tensor(PROMPT))
    drafter = AssistantDrafter(model, Warp(do_sample=True, temperature=1.5), torch.Generator().manual_seed(0), head)
    mask = mask_of(list(range(0, V, 2))) if masked else None  # even ids
    allowed = torch.zeros(V, dtype=torch.bool)
    allowed[kept] = True
    allowed[torch.tensor(PROMPT)] = True
    allowed &= torch.ones(V, dtype=torch.bool) if mask is None else mask
    drafts = []
    with torch.inference_mode():
        for _ in range(20):
            drafter.rollback(0)
            drafts.append(drafter.next(PROMPT, mask))
    for token, q, _ in drafts:
        assert q.shape == (1, V) and bool(allowed[token])
        assert float(q[0, ~allowed].abs().max()) == 0.0
        torch.testing.assert_close(q.sum(), torch.tensor(1.0))
        assert int((q[0] > 0).sum()) == int(allowed.sum())  # every kept, allowed id has mass


def test_ranking_keeps_specials_and_the_alphabet_then_merges_in_order():
    tok = tiny_tokenizer()  # <eos> a b c d, then merges ab, cd, ba
    assert token_ranks(tok, 8).tolist() == [-1, -1, -1, -1, -1, 0, 1, 2]
    assert top_ids(tok, 6, 8).tolist() == [0, 1, 2, 3, 4, 5]
    assert top_ids(tok, 2, 8).tolist() == [0, 1, 2, 3, 4]  # the always-kept ids are never cut
    big = smollm2_tokenizer()
    ranks = token_ranks(big, len(big))
    top = top_ids(big, 4096, len(big))
    assert top.numel() == 4096 and bool(ranks[top].max() < ranks[~torch.isin(torch.arange(len(big)), top)].min())
    assert big.eos_token_id in top.tolist() and big.convert_tokens_to_ids("Ġthe") in top.tolist()

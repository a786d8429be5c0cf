"""The ragged forward (`assisted.models.fused_layers.ragged_forward`, `drafting.batch_kv.BatchKV.run`'s fast path).

On a fully fused 4-bit model, B rows' feeds run packed end to end, no padding. Checked bitwise (torch.equal) on Llama
and Qwen2: each row's logits against the row run alone (a tree leaf's against `tree_forward` alone), against the padded
path (`BatchKV.forward`) on a twin cache, and each row's cached keys and values against the padded path's; rows of
feeds 1, 5 and 9 long after prompts of different lengths, a row that feeds nothing, a second step over the holes a crop
left, and a batch whose rows cached nothing yet. Negative controls: an off-by-one position or a key hidden from its
query changes the logits, so the comparison can fail. The accounting: the ragged path computes only the feeds'
positions (no padding), the padded path B rows x the longest feed, and the engine prices each forward by what it
computed. End to end, `tests/assisted/test_engine.py` runs batches on a fused int4 pair (every option, draft trees).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from transformers import DynamicCache

from assisted import generate_batch
from assisted.models.fused_layers import fused_layer_count, ragged_forward
from assisted.models.int4_models import int4_copy, quantize_int4
from assisted.policy import prices
from assisted.policy.prices import SharedPrices
from drafting.batch_kv import BatchKV
from drafting.kv_cache import forward
from drafting.tree import Branch, tree_forward
from structspec_ops import int4
from tests.assisted.test_generate_batch import PROMPTS as PROMPT_TEXTS, V, nudged
from tests.helpers_clock import pin_clock
from tests.helpers_models import smollm2_tokenizer, tiny_llama, tiny_qwen2

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.skipif(not int4.built().ok, reason=f"the kernels are unavailable: {int4.built().reason}")]

VOCAB = 300
PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12, 13, 14], [15], [16, 17, 18, 19, 20], [21, 22, 23, 24]]  # cached per row
FEEDS = [[30], [31, 32, 33, 34, 35], [36, 37, 38, 39, 40, 41, 42, 43, 44], [], [45, 46, 47, 48, 49]]
LEAF_ROW, BRANCH = 4, Branch(at=1, token=49, mask_after=None, bonus=True, confidence=0.5)  # feed: t0, c0, c1, c2, leaf


@pytest.fixture(scope="module", params=[tiny_llama, tiny_qwen2], ids=["llama", "qwen2"])
def model(request):
    fused = quantize_int4(request.param(VOCAB, seed=2, layers=2, hidden=64))
    assert fused_layer_count(fused) == (2, 2) and fused.ragged_forward is ragged_forward
    return fused


def leaves(feeds: list[list[int]], lengths: list[int]) -> list:
    """Row LEAF_ROW's feed ends in BRANCH's leaf: one uncached committed token, a chain of three, the leaf."""
    return [(lengths[r] + 1, BRANCH) if r == LEAF_ROW and f else None for r, f in enumerate(feeds)]


def placed(model, prompts: list[list[int]]) -> BatchKV:
    kv = BatchKV(model)
    with torch.inference_mode():
        for r, prompt in enumerate(prompts):
            kv.place(r, prompt)
    return kv


def alone(model, cached: list[int], feed: list[int], leaf) -> torch.Tensor:
    """The row run alone: its cached tokens, then its feed in one forward (a leaf's by `tree_forward`), (len, V)."""
    cache = DynamicCache()
    with torch.inference_mode():
        if cached:
            forward(model, cache, cached, 1)
        if leaf is not None:
            return tree_forward(model, cache, leaf[0], feed, leaf[1])
        return forward(model, cache, feed, len(feed))


def ragged_and_padded(model, prompts, feeds):
    """(ragged logits per row, the ragged BatchKV, padded logits (B, m, V), the padded BatchKV) for one step."""
    ragged, padded = placed(model, prompts), placed(model, prompts)
    assert ragged.ragged() is not None  # `run` takes the ragged path
    tree = leaves(feeds, ragged.lengths)
    with torch.inference_mode():
        logits = ragged.run(feeds, [len(f) for f in feeds], tree)
        return logits, ragged, padded.forward(feeds, tree), padded


def assert_bitwise_rows(model, prompts, feeds):
    """Each row's ragged logits equal the row alone's and the padded path's, and its cache equals the padded path's."""
    logits, ragged, wide, padded = ragged_and_padded(model, prompts, feeds)
    tree = leaves(feeds, [len(p) for p in prompts])
    assert ragged.lengths == padded.lengths == [len(p) + len(f) for p, f in zip(prompts, feeds)]
    assert ragged.width == padded.width == max(ragged.lengths)
    for r, (prompt, feed) in enumerate(zip(prompts, feeds)):
        if not feed:
            assert logits[r] is None
            continue
        assert torch.equal(logits[r], alone(model, prompt, feed, tree[r])), f"row {r} against the row alone"
        assert torch.equal(logits[r], wide[r, : len(feed)]), f"row {r} against the padded path"
    for mine, theirs in zip(ragged.cache.layers, padded.cache.layers, strict=True):
        for r, n in enumerate(ragged.lengths):
            assert torch.equal(mine.keys[r, :, :n], theirs.keys[r, :, :n]), f"row {r}'s keys"
            assert torch.equal(mine.values[r, :, :n], theirs.values[r, :, :n]), f"row {r}'s values"


def test_each_row_of_a_ragged_forward_is_bitwise_the_row_alone_and_the_padded_path(model):
    assert_bitwise_rows(model, PROMPTS, FEEDS)


def test_a_second_ragged_step_over_the_holes_a_crop_left_is_bitwise_the_row_alone(model):
    """Rows cropped below what they cached (rejected drafts), a taken leaf moved, then fed again: the new entries go
    into the holes, and every row is still what it is alone."""
    kv = placed(model, PROMPTS)
    keep = [len(f) for f in FEEDS]
    with torch.inference_mode():
        kv.run(FEEDS, keep, leaves(FEEDS, kv.lengths))
        committed = [p + f for p, f in zip(PROMPTS, FEEDS)]
        committed[0], committed[1] = committed[0][:-1], committed[1][:-3]  # row 0 and row 1 reject drafts
        leaf_at = len(PROMPTS[LEAF_ROW]) + 1 + BRANCH.at  # row LEAF_ROW takes its leaf
        kv.move(LEAF_ROW, len(committed[LEAF_ROW]) - 1, leaf_at)
        committed[LEAF_ROW] = committed[LEAF_ROW][:leaf_at] + [BRANCH.token]
        kv.crop_rows([len(c) for c in committed])
        feeds = [[60, 61, 62], [], [63], [64, 65, 66, 67, 68, 69], [70, 71]]
        logits = kv.run(feeds, [len(f) for f in feeds])
    assert kv.lengths == [len(c) + len(f) for c, f in zip(committed, feeds)] and kv.width == max(kv.lengths)
    for r, (cached, feed) in enumerate(zip(committed, feeds)):
        if feed:
            assert torch.equal(logits[r], alone(model, cached, feed, None)), f"row {r}"


def test_rows_that_cached_nothing_yet_get_their_cache_made_by_the_ragged_forward(model):
    """One-token prompts leave every row's cache empty (no layer yet): the first ragged forward makes it."""
    assert_bitwise_rows(model, [[], [], []], [[3, 4, 5], [6], [7, 8]])


def test_the_head_runs_on_the_kept_positions_only(model, monkeypatch):
    """`keep[r]` positions of each row: the head sees K = sum of them, and each row's are its last ones."""
    kv = placed(model, PROMPTS[:3])
    heads = []
    head = model.lm_head.forward
    monkeypatch.setattr(model.lm_head, "forward", lambda x: heads.append(x.shape[-2]) or head(x))
    with torch.inference_mode():
        logits = kv.run(FEEDS[:3], [1, 2, 3])
    assert heads == [6] and [x.shape[0] for x in logits] == [1, 2, 3]
    assert torch.equal(logits[2], alone(model, PROMPTS[2], FEEDS[2], None)[-3:])


@pytest.mark.parametrize("mistake", ["position off by one", "own key hidden"])
def test_the_comparison_fails_where_the_ragged_layout_is_off_by_one(model, monkeypatch, mistake):
    """Negative controls: one row's positions shifted by one, or each query kept from its own key, change logits."""
    pack = BatchKV._pack

    def wrong(self, *args):
        batch = pack(self, *args)
        if mistake == "position off by one":
            return replace(batch, positions=batch.positions + (batch.rows == 1).long())
        hidden = batch.mask.clone()
        hidden[batch.rows, 0, batch.slots, batch.columns] = False
        return replace(batch, mask=hidden)

    monkeypatch.setattr(BatchKV, "_pack", wrong)
    with pytest.raises(AssertionError, match="against the row alone"):
        assert_bitwise_rows(model, PROMPTS, FEEDS)


def test_a_partly_fused_model_is_refused_by_the_ragged_forward_not_run_wrong(model):
    layer = model.model.layers[1]
    model.model.layers[1] = layer.unfused()
    try:
        with pytest.raises(ValueError, match="1 of 2 fused"):
            ragged_forward(model, None)
    finally:
        model.model.layers[1] = layer


# ------------------------------------------------------------------------------------------------ what it computes


def test_a_forward_computes_the_feeds_positions_ragged_and_every_row_at_the_longest_padded():
    feeds = [[1], [2, 3, 4, 5, 6], [], [7, 8, 9]]
    fused = quantize_int4(tiny_llama(VOCAB, seed=0, hidden=64))
    assert BatchKV(fused).positions(feeds) == 9 and BatchKV(fused).positions([[], []]) == 0
    assert BatchKV(tiny_llama(VOCAB, seed=0)).positions(feeds) == 4 * 5  # float, sdpa: padded
    fused.set_attn_implementation("sdpa")
    assert BatchKV(fused).ragged() is None and BatchKV(fused).positions(feeds) == 4 * 5  # another attention: padded


PAIRS = {"ragged": lambda: (quantize_int4(tiny_llama(V, seed=0, hidden=64)),
                            int4_copy(nudged(tiny_llama(V, seed=0, hidden=64), 0.002))),
         "padded": lambda: (tiny_llama(V, seed=0), nudged(tiny_llama(V, seed=0), 0.002))}  # drafts, some rejected


@pytest.mark.parametrize("path", list(PAIRS))
def test_the_batch_reports_the_positions_computed_and_used_and_prices_what_was_computed(path, monkeypatch):
    """Rows of different prompts whose drafts differ in length: the ragged path computes no padding, the padded path
    some; every forward the `auto` rows' prices book is the positions it computed."""
    pin_clock(monkeypatch)
    booked = []
    observe = SharedPrices.observe
    monkeypatch.setattr(SharedPrices, "observe", lambda self, cost, rows: booked.append(cost) or observe(self, cost,
                                                                                                           rows))
    target, assistant = PAIRS[path]()
    out = generate_batch(target, assistant, tokenizer=smollm2_tokenizer(), prompts=PROMPT_TEXTS, batch_size=3,
                         max_new_tokens=16)
    batch = out[0].batch
    assert all(r.error is None for r in out) and batch.positions_used > 0 and booked
    assert batch.positions_computed == sum(c.target_tokens for c in booked)
    if path == "ragged":
        assert batch.padding == 0 and batch.padding_share == 0 and batch.positions_computed == batch.positions_used
    else:
        assert batch.padding > 0 and batch.positions_computed == batch.positions_used + batch.padding


def test_the_batch_books_what_the_assistant_computed_and_each_stage_s_seconds(monkeypatch):
    """The assistant's forwards (its lazy cache prefills nothing), the positions they computed (each row's catch-up
    included: every position the assistant was fed) and their seconds; each stage of the engine timed."""
    pin_clock(monkeypatch)
    target, assistant = PAIRS["ragged"]()
    fed = []
    assistant.ragged_forward = lambda model, batch: fed.append(batch.ids.numel()) or ragged_forward(model, batch)
    out = generate_batch(target, assistant, tokenizer=smollm2_tokenizer(), prompts=PROMPT_TEXTS, batch_size=3,
                         max_new_tokens=16)
    batch = out[0].batch
    assert all(r.error is None for r in out) and batch.assistant_forwards == len(fed) > 0
    assert batch.assistant_positions == sum(fed) and max(fed) > 3  # a row's first draft feeds its whole context
    assert 0 < batch.assistant_seconds == pytest.approx(sum(r.stats.seconds.assistant for r in out))  # rows' shares
    assert batch.assistant_seconds < batch.stage_seconds["draft"] and batch.target_seconds > 0
    assert all(batch.stage_seconds[s] > 0 for s in ("admit", "draft", "verify", "commit", "learn", "finish"))


def test_a_lazy_cache_places_only_the_shared_prefix_and_its_first_run_feeds_the_rest_bitwise(model):
    """A lazy cache (the batch's assistant) copies a shared prefix and runs nothing at `place`; the row's first `run`
    feeds its whole context beside the other rows' tokens, with logits bitwise those of a cache that prefilled it."""
    eager, lazy = placed(model, PROMPTS[:2]), BatchKV(model, lazy=True)
    assert eager.prefills and not lazy.prefills
    with torch.inference_mode():
        lazy.place(0, PROMPTS[0])
        lazy.place(1, PROMPTS[1][:3] + [99], shared=3, source=eager.row_cache(1))
        assert lazy.lengths == [0, 3]
        feeds = [PROMPTS[0] + FEEDS[0], PROMPTS[1][3:] + FEEDS[1]]
        got = lazy.run(feeds, [1, 1])
        want = eager.run([FEEDS[0], FEEDS[1]], [1, 1])
    assert lazy.lengths == eager.lengths and all(torch.equal(g, w) for g, w in zip(got, want))


def test_the_target_cache_prefills_a_row_that_shares_nothing_and_defers_the_rest_of_one_that_shares(model):
    """The batch's target cache (`defer_after_prefix`) runs a newcomer's prompt at `place` where it copies no prefix
    (rows after it copy from it), and where it copies one leaves the rest to the row's first `run`, packed beside the
    other rows' feeds: the weights read once for all the rows' rests, logits bitwise a cache that prefilled each."""
    first, second = PROMPTS[1], PROMPTS[1][:4] + [60, 61, 62]
    eager, deferring = placed(model, [first, second]), BatchKV(model, defer_after_prefix=True)
    with torch.inference_mode():
        deferring.place(0, first)
        deferring.place(1, second, shared=4, source=0)
        assert deferring.lengths == [len(first), 4] and deferring.prefills
        got = deferring.run([FEEDS[0], second[4:] + FEEDS[1]], [1, 1])
        want = eager.run([FEEDS[0], FEEDS[1]], [1, 1])
    assert deferring.lengths == eager.lengths and all(torch.equal(g, w) for g, w in zip(got, want))


def test_a_batch_whose_assistant_never_drafts_never_runs_the_assistant(monkeypatch):
    """Rows admitted into a batch leave the assistant's cache empty until they draft: where the batch's policy keeps
    to plain decoding, the assistant runs no forward at all, and the outputs are the target's; where it drafts, the
    assistant's first forwards feed the rows' contexts."""
    target, assistant = PAIRS["ragged"]()
    calls = []
    monkeypatch.setattr(assistant, "ragged_forward", lambda m, batch: calls.append(batch) or ragged_forward(m, batch))
    assistant.register_forward_pre_hook(lambda module, args: calls.append("prefill"))  # `place`'s own forwards
    kwargs = dict(tokenizer=smollm2_tokenizer(), prompts=PROMPT_TEXTS, batch_size=3, max_new_tokens=12)
    drafting = generate_batch(target, assistant, **kwargs)
    assert "prefill" not in calls and max(len(batch.ids) for batch in calls) > 1  # first drafts fed the contexts
    calls.clear()
    monkeypatch.setattr(prices, "mode", lambda *args: "plain")
    out = generate_batch(target, assistant, **kwargs)
    plain = generate_batch(target, **kwargs)
    assert not calls and out[0].batch.prefill_forwards == plain[0].batch.prefill_forwards  # the target's only
    assert [r.token_ids for r in out] == [r.token_ids for r in drafting] == [r.token_ids for r in plain]

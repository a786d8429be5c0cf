"""drafting.sampling: mask first, then transformers' warpers, exactly; seeded draws."""

import pytest
import torch
from transformers.generation.logits_process import (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from drafting.sampling import Warp, make_generator, masked, probs, sample, warped
from tests.helpers_rounding import assert_within, gamma


def hf_probs(logits, mask, temperature=1.0, top_k=None, top_p=None):
    """The reference: -inf outside the mask, then transformers' own warpers in generate()'s order."""
    scores = logits.masked_fill(~mask, float("-inf")) if mask is not None else logits
    if temperature != 1.0:
        scores = TemperatureLogitsWarper(temperature)(None, scores)
    if top_k is not None:
        scores = TopKLogitsWarper(top_k)(None, scores)
    if top_p is not None and top_p < 1.0:
        scores = TopPLogitsWarper(top_p)(None, scores)
    return scores.softmax(-1)


WARPS = [
    dict(),
    dict(temperature=0.5),
    dict(temperature=2.0),
    dict(top_k=1),
    dict(top_k=3),
    dict(top_p=0.5),
    dict(top_p=0.9),
    dict(temperature=0.7, top_k=5, top_p=0.8),
    dict(top_p=1.0),
]


@pytest.mark.parametrize("warp", WARPS, ids=str)
@pytest.mark.parametrize("with_mask", [False, True])
def test_probs_match_transformers_warpers_after_the_mask(warp, with_mask):
    torch.manual_seed(0)
    logits = torch.randn(6, 40) * 3  # (n, V)
    mask = torch.rand(6, 40) < 0.3 if with_mask else None
    if mask is not None:
        mask[:, 0] = True  # every row allows something
    got = probs(logits, mask, Warp(True, **warp))
    want = hf_probs(logits, mask, **warp)
    assert_within(got, want, 2 * gamma(logits.shape[-1] + 4), "probs")  # two softmaxes of <= V terms, each <= 1
    if mask is not None:
        assert (got[~mask] == 0).all()


def test_masked_tokens_get_zero_probability_even_when_top_k_exceeds_the_allowed_set():
    logits = torch.tensor([[5.0, 4.0, 3.0, 2.0]])
    mask = torch.tensor([[False, True, False, True]])
    p = probs(logits, mask, Warp(True, top_k=3))
    assert p[0, 0] == 0 and p[0, 2] == 0
    assert_within(p[0, [1, 3]], torch.tensor([4.0, 2.0]).softmax(-1), 2 * gamma(8), "renormalised")


def test_top_p_keeps_at_least_the_top_token():
    logits = torch.tensor([[10.0, 0.0, 0.0]])
    p = probs(logits, None, Warp(True, top_p=0.01))
    assert p.tolist() == [[1.0, 0.0, 0.0]]


def test_warpers_do_not_change_the_argmax():
    torch.manual_seed(1)
    logits = torch.randn(8, 50)
    mask = torch.rand(8, 50) < 0.5
    mask[:, 7] = True
    best = masked(logits, mask).argmax(-1)
    for warp in WARPS:
        assert torch.equal(warped(masked(logits, mask), Warp(True, **warp)).argmax(-1), best)


def test_seeded_generators_repeat_and_fresh_ones_differ():
    weights = torch.ones(4, 1000)
    draw = lambda seed: sample(weights, make_generator(torch.device("cpu"), seed)).tolist()  # noqa: E731
    assert draw(3) == draw(3)
    assert draw(3) != draw(4)
    assert draw(None) != draw(None)


def test_sample_follows_unnormalized_weights():
    weights = torch.tensor([[0.0, 3.0, 1.0]]).expand(20000, 3)
    draws = sample(weights, make_generator(torch.device("cpu"), 0))
    counts = torch.bincount(draws, minlength=3)
    assert counts[0] == 0
    assert abs(counts[1].item() / 20000 - 0.75) < 0.015

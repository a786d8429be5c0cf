"""End-to-end statistical test of sampled generate(): the first two new tokens have the reference's
joint distribution (masked, warped target; computed here with transformers' warpers), whatever the
assistant drafts. Tiny Llama models over an 8-token vocabulary; chi-square and a total-variation bound.
The heavier statistical test of the acceptance layer itself is in test_acceptance.py.
"""

from __future__ import annotations

import importlib
from collections import Counter

import pytest
import torch

import fsm
from assisted import generate
from tests.assisted.test_acceptance import compare, sampling_noise_tv, tv_bound
from tests.assisted.test_generate import Scripted
from tests.drafting.test_sampling import hf_probs
from tests.helpers_clock import pin_clock
from tests.helpers_reference import plain_distribution
from tests.helpers_models import tiny_llama, tiny_tokenizer

pytestmark = [pytest.mark.usefixtures("one_thread", "every_cache")]  # every test on every KV-cache engine

PROMPT = [1, 3]
COPYABLE = [1, 6, 7, 1, 6]  # "a cd ba a cd": the tail "acd" occurred before, followed by "ba": a lookup draft
DRAWS = 1000

CASES = {
    # name: (prompt, regex, warp kwargs, with assistant, coalesce, prompt lookup)
    "no-mask-bad-assistant-temperature-0.7": (PROMPT, None, dict(temperature=0.7), True, False, False),
    "mask-bad-assistant-top-k-top-p": (PROMPT, r"(a|b|ab)(c|d|cd|ba)+", dict(top_k=3, top_p=0.9), True, False, False),
    "mask-verified-forced-point-masses": (PROMPT, r"(a|b)cd(a|b|c)", dict(temperature=1.3, top_p=0.95), True, False,
                                          False),
    "reference-alone-mask-temperature-1.3": (PROMPT, r"(a|b|ab)(c|d|cd|ba)+", dict(temperature=1.3), False, False,
                                             False),
    "prompt-lookup-point-masses-and-assistant": (COPYABLE, None, dict(temperature=1.0), True, False, True),
}


@pytest.fixture(scope="module")
def setup():
    target = tiny_llama(8, seed=3, hidden=16, init=0.3, eos=0)
    assistant = tiny_llama(8, seed=0, hidden=16, init=0.3, eos=0)  # prefers other tokens: a bad drafter
    return tiny_tokenizer(), target, assistant


def next_probs(model, ids, guide, warp_kwargs):
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, -1:]
    mask = None if guide is None else guide.mask()[None]
    return hf_probs(logits, mask, **warp_kwargs)[0]


def reference_two_tokens(tok, model, prompt, regex, warp_kwargs) -> dict[tuple, float]:
    """Exact P(first two new tokens) under plain constrained sampling; EOS ends a sequence early."""
    guide = None if regex is None else fsm.Guide.from_regex(regex, tok)
    table = {}
    first = next_probs(model, prompt, guide, warp_kwargs)
    for t1, p1 in enumerate(first.tolist()):
        if p1 == 0:
            continue
        if t1 == tok.eos_token_id:
            table[(t1,)] = p1
            continue
        after = None if guide is None else guide.copy()
        if after is not None:
            after.advance(t1)
        second = next_probs(model, prompt + [t1], after, warp_kwargs)
        for t2, p2 in enumerate(second.tolist()):
            if p2 > 0:
                table[(t1, t2)] = p1 * p2
    return table


@pytest.mark.parametrize("case", list(CASES))
def test_sampled_generate_has_the_reference_joint_distribution(setup, case):
    tok, target, assistant = setup
    prompt, regex, warp_kwargs, with_assistant, coalesce, lookup = CASES[case]
    # with lookup: one assistant draft, then a copy where the assistant drew "ba" (a third token makes room)
    kw = dict(tokenizer=tok, input_ids=prompt, regex=regex, max_new_tokens=3 if lookup else 2, do_sample=True,
              coalesce=coalesce, num_assistant_tokens=1 if lookup else 2, prompt_lookup=lookup, **warp_kwargs)
    counts, copied = Counter(), 0
    for seed in range(DRAWS):
        out = generate(target, assistant if with_assistant else None, seed=seed, **kw)
        counts[tuple(out.token_ids[:2])] += 1
        copied += out.stats.drafted_by_source["lookup"]
    assert (copied > 0) == lookup  # the lookup case really drafts from the prompt
    expected = reference_two_tokens(tok, target, prompt, regex, warp_kwargs)
    p_value, tv = compare(counts, expected, DRAWS)
    assert p_value > 1e-3, f"chi-square p={p_value:.2g}, TV={tv:.3f}"
    assert tv < 1.5 * sampling_noise_tv(expected, DRAWS), f"TV={tv:.3f}"


class CutAtUnsure(Scripted):
    """A policy that always asks for 3 drafts and cuts every draft back before its first unsure token."""

    def __init__(self, below: float):
        super().__init__([3])
        self.below, self.cuts = below, 0

    def cut(self, confidence):
        unsure = [i for i, c in enumerate(confidence) if c < self.below]
        self.cuts += bool(unsure)
        return unsure[0] if unsure else None



@pytest.mark.parametrize("drafter", ["itself", "bad-assistant"])
def test_cutting_drafts_by_confidence_keeps_the_distribution(setup, monkeypatch, drafter):
    """The cut sees the assistant's confidence in its distribution, not in the token it drew, and under
    sampling it can only end a draft: a cut that looked at the drawn tokens would favour likely ones."""
    tok, target, assistant = setup
    policy = CutAtUnsure(below=0.5)
    monkeypatch.setattr(importlib.import_module("assisted.generate"), "make_policy", lambda *args: policy)
    helper = target if drafter == "itself" else assistant
    kw = dict(tokenizer=tok, input_ids=PROMPT, max_new_tokens=4, do_sample=True, coalesce=False, temperature=1.0)
    counts = Counter(tuple(generate(target, helper, seed=seed, **kw).token_ids[:2]) for seed in range(DRAWS))
    assert policy.cuts > DRAWS / 4  # the cut really shortens drafts
    expected = reference_two_tokens(tok, target, PROMPT, None, dict(temperature=1.0))
    p_value, tv = compare(counts, expected, DRAWS)
    assert p_value > 1e-3, f"chi-square p={p_value:.2g}, TV={tv:.3f}"
    assert tv < 1.5 * sampling_noise_tv(expected, DRAWS), f"TV={tv:.3f}"


# ------------------------------------------------------------------------ whole outputs, coalesced, default schedule

COALESCED = r"(a|b)cd(a|b|ab)cd(c|d)"  # forced "cd" spelled [cd] twice; after "a", "c" forces [d]: 20 outputs
COALESCED_DRAWS = 1500


def whole_outputs(tok, target, assistant, draws: int, schedule: str | None) -> Counter:
    """Counts of the whole outputs of `draws` seeded coalesced samples (default coalesce=True)."""
    kw = dict(tokenizer=tok, input_ids=PROMPT, regex=COALESCED, max_new_tokens=12, do_sample=True, temperature=1.0,
              schedule=schedule)
    return Counter(tuple(generate(target, assistant, seed=seed, **kw).token_ids) for seed in range(draws))


def matches(counts: Counter, expected: dict[tuple, float], draws: int, any_cpu: bool = False) -> tuple[bool, str]:
    """(the draws fit `expected`: chi-square p > 1e-3 and TV within 1.5 times its sampling noise, the numbers).

    `any_cpu`: `expected` depends on the CPU (int8 targets), so the TV is held to `tv_bound` (false failures <= 1e-4
    on any CPU) instead of 1.5 times the noise (a few percent of draws exceed it)."""
    if not set(counts) <= {s for s, p in expected.items() if p > 0}:
        return False, f"outputs outside the reference: {sorted(set(counts) - set(expected))[:3]}"
    p_value, tv = compare(counts, expected, draws)
    limit = tv_bound(expected, draws) if any_cpu else 1.5 * sampling_noise_tv(expected, draws)
    return p_value > 1e-3 and tv < limit, f"chi-square p={p_value:.2g}, TV={tv:.3f} (limit {limit:.3f})"


@pytest.fixture(scope="module")
def coalesced_reference(setup):
    """The exact distribution of whole outputs of plain coalesced sampling (tests/helpers_reference.py)."""
    tok, target, _ = setup

    def probs(logits, mask):
        return hf_probs(logits, mask, temperature=1.0)

    expected = plain_distribution(target, tok, PROMPT, 12, probs, regex=COALESCED, coalesce=True)
    verified = plain_distribution(target, tok, PROMPT, 12, probs, regex=COALESCED, coalesce=False)
    assert len(expected) == 20 and sum(expected.values()) == pytest.approx(1.0)
    # coalescing changes the distribution: a loop that verified forced text instead would be seen
    cells = set(expected) | set(verified)
    assert 0.5 * sum(abs(expected.get(c, 0) - verified.get(c, 0)) for c in cells) > 0.2
    return expected


@pytest.mark.parametrize("schedule", [None, "auto"], ids=["default", "auto"])
def test_coalesced_sampling_has_the_reference_distribution_of_whole_outputs(setup, coalesced_reference, monkeypatch,
                                                                           schedule):
    """The default call (coalesce=True, a seed: the "heuristic" schedule) and "auto" (the default without a seed) on a
    pinned clock: every output of up to six tokens, three model choices and three forced runs."""
    pin_clock(monkeypatch)
    tok, target, assistant = setup
    counts = whole_outputs(tok, target, assistant, COALESCED_DRAWS, schedule)
    ok, numbers = matches(counts, coalesced_reference, COALESCED_DRAWS)
    assert ok, numbers


def test_a_biased_acceptance_fails_the_whole_output_check(setup, coalesced_reference, monkeypatch, every_cache):
    """Negative control: an acceptance that takes every assistant token it is shown (no min(1, p/q) test) must fail
    the same check, with the same draws (once: it checks the check, not a cache engine)."""
    if every_cache != "dynamic":
        pytest.skip("the control runs on the dynamic engine only")
    pin_clock(monkeypatch)
    loop = importlib.import_module("assisted.steps")
    fair = loop.speculative_accept
    monkeypatch.setattr(loop, "speculative_accept", lambda p, q, draft, auto, gen: fair(p, q, draft, auto | True, gen))
    tok, target, assistant = setup
    counts = whole_outputs(tok, target, assistant, COALESCED_DRAWS, None)
    ok, numbers = matches(counts, coalesced_reference, COALESCED_DRAWS)
    assert not ok, f"the biased acceptance passed: {numbers}"

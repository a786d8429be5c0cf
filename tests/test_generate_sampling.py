"""End-to-end statistical test of sampled generate(): the first two new tokens have the reference's
joint distribution (masked, warped target; computed here with transformers' warpers), whatever the
assistant drafts. Tiny Llama models over an 8-token vocabulary; chi-square and a total-variation bound.
The heavier statistical test of the acceptance layer itself is in test_acceptance.py.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

import fsm
from assisted import generate
from tests.helpers_models import threads, tiny_llama, tiny_tokenizer
from tests.test_acceptance import compare, sampling_noise_tv
from tests.test_sampling import hf_probs

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


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    with threads(1):
        yield


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
    kw = dict(tokenizer=tok, input_ids=prompt, regex=regex, max_new_tokens=2, do_sample=True, coalesce=coalesce,
              num_assistant_tokens=2, prompt_lookup=lookup, **warp_kwargs)
    counts, copied = Counter(), 0
    for seed in range(DRAWS):
        out = generate(target, assistant if with_assistant else None, seed=seed, **kw)
        counts[tuple(out.token_ids)] += 1
        copied += out.stats.drafted_by_source["lookup"]
    assert (copied > 0) == lookup  # the lookup case really drafts from the prompt
    expected = reference_two_tokens(tok, target, prompt, regex, warp_kwargs)
    p_value, tv = compare(counts, expected, DRAWS)
    assert p_value > 1e-3, f"chi-square p={p_value:.2g}, TV={tv:.3f}"
    assert tv < 1.5 * sampling_noise_tv(expected, DRAWS), f"TV={tv:.3f}"

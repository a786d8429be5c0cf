"""generate(draft_vocab=N): greedy output is token-identical to plain (masked) decoding, sampled output has the
target's distribution, though the assistant can only draft a few ids; argument checks come before any model call."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from assisted import draft_vocab as draft_vocab_module
from assisted import generate
from assisted.loading import int8_copy
from tests.assisted.test_acceptance import compare, sampling_noise_tv
from tests.assisted.test_generate import CONSTRAINTS, V
from tests.assisted.test_generate_sampling import (
    COPYABLE,
    DRAWS,
    PROMPT,
    reference_two_tokens,
)
from tests.helpers_models import (
    smollm2_tokenizer,
    tiny_gpt2,
    tiny_llama,
    tiny_tokenizer,
)

pytestmark = [pytest.mark.usefixtures("one_thread")]


@pytest.fixture(scope="module")
def tok():
    return smollm2_tokenizer()


@pytest.fixture(scope="module")
def models():
    llama = tiny_llama(V, seed=0)
    return {"llama": llama, "llama-int8": int8_copy(llama), "llama-other": tiny_llama(V, seed=1, layers=2),
            "gpt2": tiny_gpt2(V, seed=2)}


@pytest.mark.parametrize("sparse", [True, False], ids=["mask-sparse", "kept-only"])
@pytest.mark.parametrize("constraint", list(CONSTRAINTS))
@pytest.mark.parametrize("pair", [("llama", "llama"), ("llama", "llama-int8"), ("llama", "llama-other"),
                                  ("gpt2", "gpt2")])
def test_greedy_output_is_plain_decodings_with_a_reduced_head(tok, models, monkeypatch, pair, constraint, sparse):
    monkeypatch.setattr(draft_vocab_module, "MASK_SPARSE", sparse)
    target, helper = models[pair[0]], models[pair[1]]
    ids = tok("Describe a hero:")["input_ids"]
    kw = dict(tokenizer=tok, input_ids=ids, max_new_tokens=40, schedule="constant", num_assistant_tokens=4, coalesce=False,
              **CONSTRAINTS[constraint])
    plain = generate(target, tokenizer=tok, input_ids=ids, max_new_tokens=40, coalesce=False, **CONSTRAINTS[constraint])
    full = generate(target, helper, **kw)
    reduced = generate(target, helper, draft_vocab=300, **kw)
    assert reduced.token_ids == full.token_ids == plain.token_ids
    if pair[1] == "llama" and pair[0] == "llama" and constraint == "none":
        # drafting from itself the full head is always right; 300 ids (plus the prompt's) must miss somewhere
        outside = set(reduced.token_ids) - set(range(300)) - set(ids)
        assert outside and reduced.stats.accepted < full.stats.accepted


CASES = {
    # name: (prompt, regex, warp kwargs, draft_vocab, mask-sparse rows)
    "no-mask-kept-5": (PROMPT, None, {"temperature": 0.7}, 5, True),
    "mask-kept-5-with-fallback": (PROMPT, r"(a|b|ab)(c|d|cd|ba)+", {"top_k": 3, "top_p": 0.9}, 5, False),
    "mask-sparse-rows": (PROMPT, r"(a|b|ab)(c|d|cd|ba)+", {"temperature": 1.3}, 5, True),
    "prompt-ids-kept": (COPYABLE, None, {"temperature": 1.0}, 5, True),  # 6 and 7 come from the prompt
}


@pytest.mark.parametrize("case", list(CASES))
def test_sampled_generate_keeps_the_targets_distribution(monkeypatch, case):
    prompt, regex, warp_kwargs, draft_vocab, sparse = CASES[case]
    monkeypatch.setattr(draft_vocab_module, "MASK_SPARSE", sparse)
    tok = tiny_tokenizer()
    target = tiny_llama(8, seed=3, hidden=16, init=0.3, eos=0)
    helper = tiny_llama(8, seed=3, hidden=16, init=0.3, eos=0)  # the target itself: only the head differs
    kw = dict(tokenizer=tok, input_ids=prompt, regex=regex, max_new_tokens=2, do_sample=True, coalesce=False,
              num_assistant_tokens=2, schedule="constant", draft_vocab=draft_vocab, **warp_kwargs)
    counts, drafted, accepted = Counter(), 0, 0
    for seed in range(DRAWS):
        out = generate(target, helper, seed=seed, **kw)
        counts[tuple(out.token_ids[:2])] += 1
        drafted, accepted = drafted + out.stats.drafted, accepted + out.stats.accepted
    expected = reference_two_tokens(tok, target, prompt, regex, warp_kwargs)
    if case == "mask-sparse-rows":  # every allowed row is computed: exactly the full head's drafts
        assert accepted == drafted
    else:  # a perfect drafter but for the head: the reduced head really changes the drafts
        assert accepted < drafted
    p_value, tv = compare(counts, expected, DRAWS)
    assert p_value > 1e-3, f"chi-square p={p_value:.2g}, TV={tv:.3f}"
    assert tv < 1.5 * sampling_noise_tv(expected, DRAWS), f"TV={tv:.3f}"


class Exploding(torch.nn.Module):
    """Stands in for a model in argument checks: any call fails the test."""


@pytest.mark.parametrize("value", [0, -3, True, 2.5, "auto"])
def test_bad_draft_vocab_is_refused_before_any_model_call(tok, models, value):
    with pytest.raises(ValueError, match="draft_vocab"):
        generate(models["llama"], models["llama"], tokenizer=tok, prompt="x", draft_vocab=value)


def test_draft_vocab_needs_an_assistant_with_a_plain_head(tok, models):
    with pytest.raises(ValueError, match="needs an assistant_model"):
        generate(models["llama"], tokenizer=tok, prompt="x", draft_vocab=100)
    capped = tiny_llama(V, seed=0)
    capped.config.final_logit_softcapping = 30.0
    with pytest.raises(ValueError, match="cannot reduce"):
        generate(models["llama"], capped, tokenizer=tok, prompt="x", draft_vocab=100)

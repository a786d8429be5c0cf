"""Sampled generate() with an assistant of another tokenizer keeps the target's exact distribution: the first two
new tokens have the reference's joint distribution (chi-square and a total-variation bound, as
tests/assisted/test_generate_sampling.py), with a good foreign drafter (the target behind a shuffled character
vocabulary) and a bad one (a random model over a BPE vocabulary with merges: its "ab" is respelled "a" "b"). A control
that accepts the point masses unverified must fail the same test.
"""

from __future__ import annotations

import importlib
from collections import Counter

import numpy as np
import pytest

from assisted import generate, generate_batch
from tests.assisted.test_acceptance import compare
from tests.assisted.test_generate_sampling import reference_two_tokens
from tests.helpers_foreign import char_tokenizer, permuted
from tests.helpers_models import tiny_llama, tiny_tokenizer

pytestmark = [pytest.mark.usefixtures("one_thread")]

DRAWS = 1000
PROMPT = [1, 3]
CASES = {
    # name: (assistant, regex, warp kwargs, coalesce)
    "copy-no-mask-temperature-0.7": ("copy", None, dict(temperature=0.7), True),
    "copy-mask-top-k-top-p": ("copy", r"[abc]+d?", dict(top_k=3, top_p=0.9), True),
    "bpe-verified-forced-temperature-1.3": ("bpe", r"(a|b)c[abcd]+", dict(temperature=1.3), False),
}


@pytest.fixture(scope="module")
def setup():
    target = tiny_llama(5, seed=3, hidden=16, init=0.3, eos=0)
    return {"target": target, "copy": permuted(target, char_tokenizer(), seed=2),
            "bpe": (tiny_llama(8, seed=4, hidden=16, init=0.3, eos=0), tiny_tokenizer())}


def null_tv(expected: dict[tuple, float], n: int, quantile: float = 0.999) -> float:
    """The `quantile` of the total-variation distance of n exact draws from `expected` (simulated with a fixed seed):
    with few cells, 1.5 times its mean is exceeded by a fifth of exact samplers."""
    p = np.array(list(expected.values()))
    drawn = np.random.default_rng(0).multinomial(n, p / p.sum(), size=20000) / n  # (20000, cells)
    return float(np.quantile(0.5 * np.abs(drawn - p).sum(axis=1), quantile))


def draw(setup, assistant, regex, warp_kwargs, coalesce) -> tuple[Counter, int]:
    """(counts of the first two new tokens over DRAWS seeds, foreign drafts accepted in all)."""
    helper, helper_tok = setup[assistant]
    kw = dict(tokenizer=char_tokenizer(), assistant_tokenizer=helper_tok, input_ids=PROMPT, regex=regex,
              max_new_tokens=3, do_sample=True, coalesce=coalesce, num_assistant_tokens=2,
              num_assistant_tokens_schedule="constant", **warp_kwargs)
    counts, accepted = Counter(), 0
    for seed in range(DRAWS):
        out = generate(setup["target"], helper, seed=seed, **kw)
        counts[tuple(out.token_ids[:2])] += 1
        accepted += out.stats.accepted_by_source["assistant"]
    return counts, accepted


@pytest.mark.parametrize("case", list(CASES))
def test_sampling_with_a_foreign_assistant_has_the_reference_distribution(setup, case):
    assistant, regex, warp_kwargs, coalesce = CASES[case]
    counts, accepted = draw(setup, assistant, regex, warp_kwargs, coalesce)
    expected = reference_two_tokens(char_tokenizer(), setup["target"], PROMPT, regex, warp_kwargs)
    p_value, tv = compare(counts, expected, DRAWS)
    assert p_value > 1e-3, f"chi-square p={p_value:.2g}, TV={tv:.3f}"
    assert tv < null_tv(expected, DRAWS), f"TV={tv:.3f}"
    assert accepted > (DRAWS / 10 if assistant == "copy" else 0)  # the drafts really were verified and taken


def test_the_test_fails_when_point_masses_are_accepted_unverified(setup, monkeypatch):
    """Control: the same check, with foreign drafts committed as if they were coalesced forced tokens."""
    steps = importlib.import_module("assisted.steps")
    real = steps.speculative_accept
    monkeypatch.setattr(steps, "speculative_accept", lambda p, q, tokens, auto, generator: real(
        p, q, tokens, auto | True, generator))
    assistant, regex, warp_kwargs, coalesce = CASES["copy-no-mask-temperature-0.7"]
    counts, _ = draw(setup, assistant, regex, warp_kwargs, coalesce)
    expected = reference_two_tokens(char_tokenizer(), setup["target"], PROMPT, regex, warp_kwargs)
    p_value, tv = compare(counts, expected, DRAWS)
    assert p_value < 1e-6 and tv > null_tv(expected, DRAWS)  # both checks of the test above fail


BATCH_ROWS = [None, r"[abc]+d?"]  # the rows' regexes, alternating, under one warp and the "copy" assistant


def batch_verdicts(setup) -> list[tuple[bool, str]]:
    """(passes, numbers) per regex of BATCH_ROWS: the first two tokens of DRAWS rows each (seeded 0, 1, ...) decoded
    together by generate_batch, 8 at a time and refilled, against that regex's reference."""
    helper, helper_tok = setup["copy"]
    warp = dict(temperature=0.7)
    rows = generate_batch(setup["target"], helper, tokenizer=char_tokenizer(), assistant_tokenizer=helper_tok,
                          input_ids=[PROMPT] * (DRAWS * len(BATCH_ROWS)), regex=BATCH_ROWS * DRAWS, batch_size=8,
                          seed=list(range(DRAWS * len(BATCH_ROWS))), max_new_tokens=3, do_sample=True,
                          num_assistant_tokens=2, num_assistant_tokens_schedule="constant", **warp)
    assert rows[0].batch.assistant_forwards < sum(r.stats.assistant_forward_passes for r in rows)  # drafted together
    verdicts = []
    for i, regex in enumerate(BATCH_ROWS):
        counts = Counter(tuple(r.token_ids[:2]) for r in rows[i::len(BATCH_ROWS)])
        expected = reference_two_tokens(char_tokenizer(), setup["target"], PROMPT, regex, warp)
        p_value, tv = compare(counts, expected, DRAWS)
        accepted = sum(r.stats.accepted_by_source["assistant"] for r in rows[i::len(BATCH_ROWS)])
        verdicts.append((p_value > 1e-3 and tv < null_tv(expected, DRAWS) and accepted > DRAWS / 10,
                         f"regex {regex}: chi-square p={p_value:.2g}, TV={tv:.3f}, accepted {accepted}"))
    return verdicts


def test_rows_sampled_together_with_a_foreign_assistant_each_have_the_reference_distribution(setup):
    for ok, numbers in batch_verdicts(setup):
        assert ok, numbers


def test_the_batched_check_fails_when_point_masses_are_accepted_unverified(setup, monkeypatch):
    steps = importlib.import_module("assisted.steps")
    real = steps.speculative_accept
    monkeypatch.setattr(steps, "speculative_accept", lambda p, q, tokens, auto, generator: real(
        p, q, tokens, auto | True, generator))
    verdicts = batch_verdicts(setup)
    assert not any(ok for ok, _ in verdicts), verdicts


def test_a_seeded_row_samples_the_same_tokens_alone_and_in_a_batch(setup):
    helper, helper_tok = setup["copy"]
    kw = dict(tokenizer=char_tokenizer(), assistant_tokenizer=helper_tok, max_new_tokens=10, do_sample=True,
              temperature=1.3, num_assistant_tokens=3)
    prompts, regexes = [PROMPT, [1, 2], PROMPT, [4]], [None, r"[abcd]+", r"(a|b)c[abcd]+", None]
    together = generate_batch(setup["target"], helper, input_ids=prompts, regex=regexes, seed=[7, 8, 9, 10],
                              batch_size=3, **kw)
    for i, (prompt, regex) in enumerate(zip(prompts, regexes)):
        alone = generate(setup["target"], helper, input_ids=prompt, regex=regex, seed=7 + i, **kw)
        assert together[i].token_ids == alone.token_ids, f"row {i}"
        assert together[i].stats.steps == alone.stats.steps, f"row {i}"
    assert len({tuple(r.token_ids) for r in together}) > 1

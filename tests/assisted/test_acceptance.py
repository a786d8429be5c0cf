"""assisted.acceptance: greedy and speculative acceptance, unit rules and a real statistical test.

The statistical tests drive `speculative_accept` with synthetic, context-dependent target and draft
distributions (logit tables keyed by the prefix), masks and warpers, through a small speculative
loop, and compare the joint distribution of the first three tokens with the exact reference
distribution (masked + warped target, computed with transformers' own warpers) by a chi-square test
and a total-variation bound. A deliberately broken acceptance rule must fail the same test.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from assisted.acceptance import greedy_accept, speculative_accept
from drafting.sampling import Warp, make_generator, probs, sample
from tests.drafting.test_sampling import hf_probs

pytestmark = [pytest.mark.usefixtures("one_thread")]


# ----------------------------------------------------------------------------- unit rules


def test_greedy_accepts_the_matching_prefix_and_takes_the_argmax_after_it():
    logits = torch.eye(5)[[1, 2, 3, 4]]  # argmax rows: 1 2 3 4, (k+1, V) with k = 3
    no_auto = torch.zeros(3, dtype=torch.bool)
    assert greedy_accept(logits, torch.tensor([1, 2, 3]), no_auto).tolist() == [3, 4]
    assert greedy_accept(logits, torch.tensor([1, 0, 3]), no_auto).tolist() == [1, 2]
    assert greedy_accept(logits, torch.tensor([0, 2, 3]), no_auto).tolist() == [0, 1]
    assert greedy_accept(logits[:1], torch.tensor([], dtype=torch.long), no_auto[:0]).tolist() == [0, 1]


def test_greedy_accepts_coalesced_tokens_without_asking_the_target():
    logits = torch.eye(5)[[1, 2, 3, 4]]
    auto = torch.tensor([False, True, False])
    assert greedy_accept(logits, torch.tensor([1, 0, 3]), auto).tolist() == [3, 4]
    assert greedy_accept(logits, torch.tensor([0, 0, 3]), auto).tolist() == [0, 1]


def test_speculative_accepts_everything_when_draft_equals_target():
    torch.manual_seed(0)
    p = torch.randn(4, 6).softmax(-1)
    gen = make_generator(torch.device("cpu"), 0)
    for _ in range(200):
        draft = sample(p[:3], gen)
        n, token = speculative_accept(p, p[:3], draft, torch.zeros(3, dtype=torch.bool), gen).tolist()
        assert n == 3 and 0 <= token < 6


def test_point_mass_on_an_impossible_token_is_rejected_and_never_emitted():
    p = torch.tensor([[0.0, 0.5, 0.5], [0.2, 0.3, 0.5]])  # (k+1, V), k = 1: p(0) = 0 at position 0
    q = torch.tensor([[1.0, 0.0, 0.0]])  # point mass on token 0
    gen = make_generator(torch.device("cpu"), 0)
    for _ in range(200):
        n, token = speculative_accept(p, q, torch.tensor([0]), torch.tensor([False]), gen).tolist()
        assert n == 0 and token in (1, 2)
    n, _ = speculative_accept(p, q, torch.tensor([0]), torch.tensor([True]), gen).tolist()
    assert n == 1  # a coalesced token is appended whatever p says


def test_point_mass_rejection_resamples_p_without_the_drafted_token():
    p = torch.tensor([[0.5, 0.3, 0.2], [1.0, 0.0, 0.0]])
    q = torch.tensor([[1.0, 0.0, 0.0]])
    gen = make_generator(torch.device("cpu"), 1)
    out = Counter(tuple(speculative_accept(p, q, torch.tensor([0]), torch.tensor([False]), gen).tolist())
                  for _ in range(6000))
    assert abs(out[(1, 0)] / 6000 - 0.5) < 0.03  # accepted with probability p(x) = 0.5
    assert abs(out[(0, 1)] / out[(0, 2)] - 1.5) < 0.25  # then p without x: 0.3 : 0.2
    assert out[(0, 0)] == 0


# ----------------------------------------------------------------------------- the statistical test

V, DEPTH = 5, 3


class Synthetic:
    """Context-dependent logits, masks and forced tokens, keyed by the prefix (lazily, seeded)."""

    def __init__(self, seed: int, scale: float, forcing: bool, masked_: bool):
        self.seed, self.scale, self.forcing, self.masked = seed, scale, forcing, masked_
        self._logits: dict[tuple, torch.Tensor] = {}
        self._rows: dict[tuple, torch.Tensor] = {}

    def logits(self, prefix: tuple) -> torch.Tensor:  # (V,)
        if prefix not in self._logits:
            g = torch.Generator().manual_seed(hash((self.seed, prefix)) % 2**31)
            self._logits[prefix] = torch.randn(V, generator=g) * self.scale
        return self._logits[prefix]

    def mask(self, prefix: tuple) -> torch.Tensor | None:  # (V,) bool
        if not self.masked:
            return None
        allowed = torch.tensor([(t + sum(prefix) + len(prefix)) % 3 != 0 for t in range(V)])
        return allowed

    def forced(self, prefix: tuple) -> int | None:
        """A deterministic draft token at some prefixes (an allowed one that p need not favour)."""
        if not self.forcing or len(prefix) % 2 == 0 or prefix[-1] % 2 == 0:
            return None  # after an odd token at an odd position: no chains of forced tokens
        mask = self.mask(prefix)
        return int(torch.nonzero(mask)[-1]) if mask is not None else V - 1

    def rows(self, prefix: tuple, warp: Warp) -> torch.Tensor:  # (V,) masked, warped probabilities
        if prefix not in self._rows:
            mask = self.mask(prefix)
            self._rows[prefix] = probs(self.logits(prefix)[None], None if mask is None else mask[None], warp)[0]
        return self._rows[prefix]


POINT_MASS = torch.eye(V)  # one-hot q rows of deterministic drafts


def speculative_run(target, draft_model, warp, k, coalesce, gen, rng, accept=speculative_accept) -> tuple:
    """First DEPTH tokens of one speculative generation with synthetic models."""
    out: list[int] = []
    while len(out) < DEPTH:
        tokens, q_rows, auto, drafted = [], [], [], 0
        while True:  # forced tokens first and free, then the assistant, until k assistant tokens
            ctx = tuple(out + tokens)
            forced = target.forced(ctx)
            if forced is not None:
                q_rows.append(POINT_MASS[forced])
                tokens.append(forced)
                auto.append(coalesce)
            elif drafted < k:
                q = draft_model.rows(ctx, warp)
                q_rows.append(q)
                tokens.append(rng.choices(range(V), weights=q.tolist())[0])  # exact draw from q
                auto.append(False)
                drafted += 1
            else:
                break
        k_all = len(tokens)
        p = torch.stack([target.rows(tuple(out + tokens[:i]), warp) for i in range(k_all + 1)])  # (k+1, V)
        n, token = accept(p, torch.stack(q_rows), torch.tensor(tokens), torch.tensor(auto), gen).tolist()
        out += tokens[:n] + [token]
    return tuple(out[:DEPTH])


def reference(target, warp_kwargs, coalesce) -> dict[tuple, float]:
    """Exact probability of every DEPTH-token prefix under plain (masked, warped) sampling."""
    table = {}
    for seq in itertools.product(range(V), repeat=DEPTH):
        prob = 1.0
        for i, token in enumerate(seq):
            prefix = seq[:i]
            forced = target.forced(prefix)
            if coalesce and forced is not None:
                prob *= float(token == forced)
                continue
            mask = target.mask(prefix)
            row = hf_probs(target.logits(prefix)[None], None if mask is None else mask[None], **warp_kwargs)[0]
            prob *= float(row[token])
        table[seq] = prob
    return table


def compare(counts: Counter, expected: dict[tuple, float], n: int) -> tuple[float, float]:
    """(chi-square p-value over cells pooled to expected >= 5, total-variation distance)."""
    assert sum(counts.values()) == n
    assert set(counts) <= {s for s, p in expected.items() if p > 0}, "a sequence with probability 0 was drawn"
    cells = sorted(expected, key=expected.get)
    obs = np.array([counts.get(c, 0) for c in cells], dtype=float)
    exp = np.array([expected[c] * n for c in cells])
    small = exp < 5
    obs = np.append(obs[~small], obs[small].sum())
    exp = np.append(exp[~small], exp[small].sum())
    keep = exp > 0
    p_value = chisquare(obs[keep], exp[keep] * obs.sum() / exp[keep].sum()).pvalue
    tv = 0.5 * sum(abs(counts.get(c, 0) / n - expected[c]) for c in cells)
    return p_value, tv


def sampling_noise_tv(expected: dict[tuple, float], n: int) -> float:
    """Expected total-variation distance of an n-draw empirical distribution from the true one."""
    return 0.5 * sum(np.sqrt(2 * p * (1 - p) / (np.pi * n)) for p in expected.values())


def tv_bound(expected: dict[tuple, float], n: int, false_failure: float = 1e-4) -> float:
    """A total-variation bound that n exact draws exceed with probability at most `false_failure`: the expected TV
    plus McDiarmid's deviation (one draw moves the TV by at most 1/n): sqrt(ln(1 / false_failure) / (2 n)).

    For models whose exact distribution depends on the CPU (int8 activations through fbgemm, whose AVX2 kernels
    saturate where VNNI's do not): a fixed seed then draws a fresh sample on each CPU, so the verdict must hold for
    every draw but a negligible fraction, not for the one a machine happened to give."""
    return sampling_noise_tv(expected, n) + float(np.sqrt(np.log(1 / false_failure) / (2 * n)))


CASES = {
    # name: (warp kwargs, masked, forced tokens, coalesce, k)
    "bad-assistant": (dict(), False, False, False, 2),
    "temperature-0.6-masked": (dict(temperature=0.6), True, False, False, 3),
    "top-k-top-p-temperature-1.3": (dict(temperature=1.3, top_k=3, top_p=0.8), False, False, False, 2),
    "masked-top-p-verified-forced": (dict(top_p=0.9), True, True, False, 3),
    "masked-coalesced-forced": (dict(temperature=0.8), True, True, True, 2),
}
DRAWS = 5000


@pytest.mark.parametrize("case", list(CASES))
def test_speculative_sampling_has_the_reference_joint_distribution(case):
    warp_kwargs, masked_, forcing, coalesce, k = CASES[case]
    target = Synthetic(seed=1, scale=1.5, forcing=forcing, masked_=masked_)
    assistant = Synthetic(seed=2, scale=2.5, forcing=forcing, masked_=masked_)  # disagrees a lot
    warp = Warp(True, **warp_kwargs)
    gen, rng = make_generator(torch.device("cpu"), 1234), random.Random(99)
    counts = Counter(speculative_run(target, assistant, warp, k, coalesce, gen, rng) for _ in range(DRAWS))
    expected = reference(target, warp_kwargs, coalesce)
    p_value, tv = compare(counts, expected, DRAWS)
    assert p_value > 1e-3, f"chi-square p={p_value:.2g}, TV={tv:.3f}"
    assert tv < 1.5 * sampling_noise_tv(expected, DRAWS), f"TV={tv:.3f}"


def test_the_statistical_test_catches_a_wrong_residual():
    """Resampling from p instead of max(p - q, 0) after a rejection is a classic bug: it must fail."""

    def wrong(p, q, draft, auto, gen):
        n, token = speculative_accept(p, q, draft, auto, gen).tolist()
        return torch.tensor([n, int(sample(p[n][None], gen))])

    target = Synthetic(seed=1, scale=1.5, forcing=False, masked_=False)
    assistant = Synthetic(seed=2, scale=2.5, forcing=False, masked_=False)
    gen, rng = make_generator(torch.device("cpu"), 1234), random.Random(99)
    draws = DRAWS // 5  # the bias is large: far fewer draws show it
    counts = Counter(speculative_run(target, assistant, Warp(True), 2, False, gen, rng, wrong) for _ in range(draws))
    p_value, tv = compare(counts, reference(target, {}, False), draws)
    assert p_value < 1e-6, f"a wrong rule passed: chi-square p={p_value:.2g}, TV={tv:.3f}"

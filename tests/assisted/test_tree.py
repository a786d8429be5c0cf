"""Draft trees: the tree forward equals chain forwards of each path, the cache keeps the committed path,
greedy tree decoding is token-identical to plain decoding (with the leaf really taken), and the
multi-candidate acceptance rule keeps the target's exact distribution (chi-square, seeded).
"""

from __future__ import annotations

from collections import Counter

from types import SimpleNamespace

import pytest
import torch

import drafting.assistant
from assisted import generate, reset_remembered_state
from assisted.policy.costs import N_MAX, CostTable, memorize
from assisted.acceptance import speculative_accept
from assisted.tree_accept import greedy_tree_accept, speculative_tree_accept
from drafting.kv_cache import crop_to, forward, new_cache
from drafting.sampling import make_generator, sample
from drafting.tree import Branch, move_leaf, tree_forward
from tests.assisted.test_acceptance import compare, sampling_noise_tv
from tests.assisted.test_generate import CONSTRAINTS, V
from tests.assisted.test_generate_sampling import reference_two_tokens
from tests.helpers_clock import pin_clock
from tests.helpers_models import boost, smollm2_tokenizer, tiny_gpt2, tiny_llama, tiny_tokenizer
from tests.helpers_rounding import assert_same_function, float64_copy

pytestmark = [pytest.mark.usefixtures("one_thread")]


# ----------------------------------------------------------------------------- the tree forward and the cache


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def small(request):
    build = tiny_llama if request.param == "llama" else tiny_gpt2
    return build(16, seed=0, layers=2, init=0.5)


def full_logits(model, ids: list[int]) -> torch.Tensor:
    """Logits of every position of `ids` from a fresh, uncached forward, (len, V)."""
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("at", [0, 1, 2])
@pytest.mark.parametrize("uncached", [1, 3])
def test_each_tree_row_equals_the_chain_forward_of_its_path(small, attn, at, uncached):
    small.config._attn_implementation = attn
    seq, chain, alt = [3, 4, 5, 6, 7], [8, 9, 10], 11
    cache = new_cache()
    with torch.no_grad():
        forward(small, cache, seq[:-uncached], 1)
        rows = tree_forward(small, cache, len(seq), seq[-uncached:] + chain + [alt], Branch(at, alt, None, True, 0.5))
    assert rows.shape == (len(chain) + 2, 16)
    exact = float64_copy(small)
    chain_rows = slice(len(seq) - 1, None)
    assert_same_function({"chain": rows[:-1]}, full_logits(exact, seq + chain)[chain_rows],
                         full_logits(small, seq + chain)[chain_rows])
    leaf = seq + chain[:at] + [alt]
    assert_same_function({"leaf": rows[-1]}, full_logits(exact, leaf)[-1], full_logits(small, leaf)[-1])
    small.config._attn_implementation = "sdpa"


@pytest.mark.parametrize("at", [0, 2])
def test_after_taking_the_leaf_the_cache_continues_like_a_fresh_forward(small, at):
    seq, chain, alt, then = [3, 4, 5, 6, 7], [8, 9, 10], 11, [12, 13]
    cache = new_cache()
    with torch.no_grad():
        forward(small, cache, seq[:-1], 1)
        tree_forward(small, cache, len(seq), seq[-1:] + chain + [alt], Branch(at, alt, None, True, 0.5))
        move_leaf(cache, len(seq) + len(chain), len(seq) + at)
        committed = seq + chain[:at] + [alt]
        crop_to(cache, len(committed))
        rows = forward(small, cache, then, 2)
    assert_same_function({"after the leaf": rows}, full_logits(float64_copy(small), committed + then)[-2:],
                         full_logits(small, committed + then)[-2:])


# ----------------------------------------------------------------------------- acceptance rules


def test_greedy_tree_takes_the_leaf_only_where_the_chain_stops_at_its_sibling():
    logits = torch.eye(6)[[1, 2, 3, 4, 5]]  # chain rows argmax 1 2 3 4 (k = 3), leaf row argmax 5
    no_auto = torch.zeros(3, dtype=torch.bool)
    assert greedy_tree_accept(logits, torch.tensor([1, 0, 3]), no_auto, at=1, alt=2).tolist() == [1, 1, 5]
    assert greedy_tree_accept(logits, torch.tensor([1, 0, 3]), no_auto, at=1, alt=4).tolist() == [1, 0, 2]
    assert greedy_tree_accept(logits, torch.tensor([0, 0, 3]), no_auto, at=1, alt=2).tolist() == [0, 0, 1]
    assert greedy_tree_accept(logits, torch.tensor([1, 2, 3]), no_auto, at=1, alt=0).tolist() == [3, 0, 4]


class Table:
    """Context-dependent next-token distributions over a tiny vocabulary: seeded random logits per prefix."""

    def __init__(self, seed: int, vocab: int, scale: float):
        self.seed, self.vocab, self.scale, self.rows = seed, vocab, scale, {}

    def __call__(self, prefix: tuple) -> torch.Tensor:
        if prefix not in self.rows:
            g = torch.Generator().manual_seed(hash((self.seed, prefix)) % 2**31)
            self.rows[prefix] = (self.scale * torch.randn(self.vocab, generator=g)).softmax(-1)
        return self.rows[prefix]


def naive_tree_accept(p, q, draft, auto, at, alt, gen):
    """A wrong rule: the leaf tested against p and q themselves, as if it were a fresh single draft."""
    k = draft.shape[0]
    n, token = speculative_accept(p[: k + 1], q, draft, auto, gen).tolist()
    if n != at:
        return torch.tensor([n, 0, token])
    if float(torch.rand((), generator=gen)) * float(q[at, alt]) < float(p[at, alt]):
        return torch.tensor([n, 1, int(sample(p[k + 1][None], gen))])
    return torch.tensor([n, 0, int(sample((p[at] - q[at]).clamp_min(0.0)[None], gen))])


def tree_run(p: Table, q: Table, k: int, at: int, gen, length: int, rule=speculative_tree_accept) -> tuple:
    """One tree step from the empty prefix (chain of k drawn from q, leaf at `at` drawn from q without the chain's
    token), completed to `length` tokens by plain sampling from p."""
    chain = []
    for _ in range(k):
        chain.append(int(sample(q(tuple(chain))[None], gen)))
    q_at = q(tuple(chain[:at])).clone()
    q_at[chain[at]] = 0.0
    alt = int(sample(q_at[None], gen))
    rows = [p(tuple(chain[:i])) for i in range(k + 1)] + [p(tuple(chain[:at]) + (alt,))]
    qs = torch.stack([q(tuple(chain[:i])) for i in range(k)])
    n, took, token = rule(torch.stack(rows), qs, torch.tensor(chain), torch.zeros(k, dtype=torch.bool),
                                             at, alt, gen).tolist()
    out = chain[:n] + ([alt] if took else []) + [token]
    while len(out) < length:
        out.append(int(sample(p(tuple(out))[None], gen)))
    return tuple(out[:length])


def reference(p: Table, length: int) -> dict[tuple, float]:
    """Exact P(first `length` tokens) of plain sampling from p."""
    table = {(): 1.0}
    for _ in range(length):
        table = {s + (t,): w * float(p(s)[t]) for s, w in table.items() for t in range(p.vocab)}
    return table


TREE_CASES = {"leaf-at-0": (1, 0), "leaf-at-1-of-2": (2, 1), "leaf-at-0-of-2": (2, 0)}
TREE_DRAWS = 12000


@pytest.mark.parametrize("case", list(TREE_CASES))
def test_multi_candidate_acceptance_keeps_the_target_distribution(case):
    k, at = TREE_CASES[case]
    p, q = Table(1, 4, 1.5), Table(2, 4, 2.0)  # the draft disagrees often: the leaf decides many steps
    gen = make_generator(torch.device("cpu"), 7)
    counts = Counter(tree_run(p, q, k, at, gen, 3) for _ in range(TREE_DRAWS))
    expected = reference(p, 3)
    p_value, tv = compare(counts, expected, TREE_DRAWS)
    assert p_value > 1e-3, f"chi-square p={p_value:.2g}, TV={tv:.3f}"
    assert tv < 1.5 * sampling_noise_tv(expected, TREE_DRAWS), f"TV={tv:.3f}"


def test_the_same_test_rejects_a_naive_second_candidate_rule():
    p, q = Table(1, 4, 1.5), Table(2, 4, 2.0)
    gen = make_generator(torch.device("cpu"), 7)
    counts = Counter(tree_run(p, q, 1, 0, gen, 3, rule=naive_tree_accept) for _ in range(TREE_DRAWS))
    p_value, _ = compare(counts, reference(p, 3), TREE_DRAWS)
    assert p_value < 1e-6


# ----------------------------------------------------------------------------- generate(tree=True)


@pytest.fixture(scope="module")
def pairs():
    target = tiny_llama(V, seed=0)
    nudged = boost(tiny_llama(V, seed=0), 42, 0.5)  # where the bias makes 42 win, the runner-up is the target's pick
    return {"nudged": (target, nudged), "other": (target, tiny_llama(V, seed=1, layers=2))}


@pytest.mark.parametrize("coalesce", [False, True], ids=["verified", "coalesced"])
@pytest.mark.parametrize("constraint", list(CONSTRAINTS))
@pytest.mark.parametrize("pair", ["nudged", "other"])
@pytest.mark.parametrize("schedule", ["constant", "auto"])
def test_greedy_tree_output_equals_the_reference(pairs, monkeypatch, plain_reference, pair, constraint, coalesce,
                                                schedule):
    pin_clock(monkeypatch)
    target, assistant = pairs[pair]
    kw = dict(tokenizer=smollm2_tokenizer(), prompt="Describe a hero:", max_new_tokens=40, coalesce=coalesce,
              schedule=schedule, **CONSTRAINTS[constraint])
    ref = plain_reference(target, **kw)
    out = generate(target, assistant, tree=True, **kw)
    assert out.token_ids == ref.token_ids and out.stop_reason == ref.stop_reason
    assert out.stats.branches + out.stats.leaves_priced_out > 0  # auto may price a leaf out (one that gains nothing)
    if pair == "nudged" and constraint == "none":
        assert out.stats.leaves_taken > 0  # the leaf, and the cache compaction after it, really ran
        chain = generate(target, assistant, **kw)
        assert out.stats.target_forward_passes < chain.stats.target_forward_passes


def fixed_costs(seconds) -> CostTable:
    """Costs a call's own (pinned) timings cannot move: target forwards over every n at a weight of 1e12."""
    return CostTable(tuple((n, seconds(n), 1e12) for n in range(1, N_MAX + 1)), draft_per_token=0.0)


ROW_COSTS = {"cheap": lambda n: 1e-3, "dear": lambda n: 1e-3 if n <= 2 else 1.0}  # dear: a third row costs 1000 steps


def priced_tree(monkeypatch, target, assistant, seconds, **kw):
    """generate(tree=True) under `auto`, starting from nothing remembered but the costs `seconds(n)` of a target
    forward over n tokens; drafts are free."""
    pin_clock(monkeypatch)
    monkeypatch.setattr(drafting.assistant, "time", SimpleNamespace(perf_counter=lambda: 0.0))
    reset_remembered_state()
    memorize(target, assistant, fixed_costs(seconds))
    return generate(target, assistant, tree=True, schedule="auto", **kw)


@pytest.mark.parametrize("rows", list(ROW_COSTS))
@pytest.mark.parametrize("coalesce", [False, True], ids=["verified", "coalesced"])
@pytest.mark.parametrize("constraint", list(CONSTRAINTS))
@pytest.mark.parametrize("pair", ["nudged", "other"])
def test_greedy_priced_tree_output_equals_the_reference(pairs, monkeypatch, plain_reference, pair, constraint, coalesce,
                                                       rows):
    target, assistant = pairs[pair]
    kw = dict(tokenizer=smollm2_tokenizer(), prompt="Describe a hero:", max_new_tokens=40, coalesce=coalesce,
              **CONSTRAINTS[constraint])
    ref = plain_reference(target, **kw)
    out = priced_tree(monkeypatch, target, assistant, ROW_COSTS[rows], **kw)
    assert out.token_ids == ref.token_ids and out.stop_reason == ref.stop_reason


def test_auto_verifies_the_leaf_where_a_row_is_cheap_and_prices_it_out_where_it_is_dear(pairs, monkeypatch):
    target, assistant = pairs["nudged"]  # the runner-up is often the target's pick
    kw = dict(tokenizer=smollm2_tokenizer(), prompt="Describe a hero:", max_new_tokens=40)
    cheap = priced_tree(monkeypatch, target, assistant, ROW_COSTS["cheap"], **kw).stats
    assert cheap.branches >= 10 and cheap.leaves_taken > 0 and cheap.leaves_priced_out == 0
    dear = priced_tree(monkeypatch, target, assistant, ROW_COSTS["dear"], **kw).stats
    assert dear.leaves_priced_out >= 10
    assert dear.branches <= 1  # at most the first step's: its forward runs the prompt too, past the dear row


def test_tree_is_validated_before_any_model_call():
    with pytest.raises(TypeError, match="tree must be a bool"):
        generate(None, tokenizer=None, prompt="x", tree="yes")
    with pytest.raises(ValueError, match="needs an assistant_model"):
        generate(None, tokenizer=None, prompt="x", tree=True)
    flash = tiny_llama(16, seed=0)
    flash.config._attn_implementation = "flash_attention_2"  # would ignore the tree's mask
    with pytest.raises(ValueError, match="needs attn_implementation"):
        generate(flash, flash, tokenizer=None, prompt="x", tree=True)


SAMPLED = {
    # name: (regex, warp kwargs)
    "no-mask-temperature-0.8": (None, dict(temperature=0.8)),
    "mask-top-p": (r"(a|b|ab)(c|d|cd|ba)+", dict(top_p=0.9)),
}
SAMPLED_DRAWS = 1000


@pytest.mark.parametrize("case", list(SAMPLED))
def test_sampled_tree_generate_has_the_reference_joint_distribution(case):
    regex, warp_kwargs = SAMPLED[case]
    tok, prompt = tiny_tokenizer(), [1, 3]
    target = tiny_llama(8, seed=3, hidden=16, init=0.3, eos=0)
    assistant = tiny_llama(8, seed=0, hidden=16, init=0.3, eos=0)
    kw = dict(tokenizer=tok, input_ids=prompt, regex=regex, max_new_tokens=2, do_sample=True, coalesce=False,
              num_assistant_tokens=2, schedule="constant", tree=True, **warp_kwargs)
    counts, taken = Counter(), 0
    for seed in range(SAMPLED_DRAWS):
        out = generate(target, assistant, seed=seed, **kw)
        counts[tuple(out.token_ids[:2])] += 1
        taken += out.stats.leaves_taken
    assert taken > SAMPLED_DRAWS // 50  # the second candidate really decides steps
    expected = reference_two_tokens(tok, target, prompt, regex, warp_kwargs)
    p_value, tv = compare(counts, expected, SAMPLED_DRAWS)
    assert p_value > 1e-3, f"chi-square p={p_value:.2g}, TV={tv:.3f}"
    assert tv < 1.5 * sampling_noise_tv(expected, SAMPLED_DRAWS), f"TV={tv:.3f}"


LEAF_ROW_PRICE = {"no-mask-temperature-0.8": 0.15, "mask-top-p": 0.36}  # in tokens: between what leaves expect


@pytest.mark.parametrize("case", list(SAMPLED))
def test_sampled_priced_tree_generate_has_the_reference_joint_distribution(case, monkeypatch):
    """Under `auto`, whether the leaf is verified depends on the chain token drawn (through the runner-up's
    confidence among the rest), never on the runner-up drawn: here a fourth row (prompt, one draft, the leaf)
    costs more than the leaf expects after some chain tokens (the assistant's top one) and less after others."""
    regex, warp_kwargs = SAMPLED[case]
    price = LEAF_ROW_PRICE[case]
    tok, prompt = tiny_tokenizer(), [1, 3]
    target = tiny_llama(8, seed=3, hidden=16, init=0.3, eos=0)
    assistant = tiny_llama(8, seed=0, hidden=16, init=0.3, eos=0)
    kw = dict(tokenizer=tok, input_ids=prompt, regex=regex, max_new_tokens=2, do_sample=True, coalesce=False,
              num_assistant_tokens=2, **warp_kwargs)
    counts, verified, priced_out = Counter(), 0, 0
    for seed in range(SAMPLED_DRAWS):
        out = priced_tree(monkeypatch, target, assistant, lambda n: 1e-3 * (1 + price * (n > 3)), seed=seed, **kw)
        counts[tuple(out.token_ids[:2])] += 1
        verified, priced_out = verified + out.stats.branches, priced_out + out.stats.leaves_priced_out
    assert verified > SAMPLED_DRAWS // 10 and priced_out > SAMPLED_DRAWS // 10  # both verdicts decide many steps
    expected = reference_two_tokens(tok, target, prompt, regex, warp_kwargs)
    p_value, tv = compare(counts, expected, SAMPLED_DRAWS)
    assert p_value > 1e-3, f"chi-square p={p_value:.2g}, TV={tv:.3f}"
    assert tv < 1.5 * sampling_noise_tv(expected, SAMPLED_DRAWS), f"TV={tv:.3f}"

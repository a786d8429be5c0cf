"""The assistant's draft vocabulary (`assisted.models.draft_vocab`, `drafting.draft_head`): the output is the
target's whatever the assistant may draft (greedy identity, sampling exactness), tokens outside the vocabulary are
never drafted, small masks outside it get the full head, and the head's rows are the full head's.

Tiny random Llamas over SmolLM2's vocabulary (49,152 ids) for the greedy tests, over an 8-token one for sampling.
"""

from __future__ import annotations

import copy
import importlib
from collections import Counter

import pytest
import torch

from assisted import generate, restrict_vocabulary
from assisted.models.draft_vocab import auto_draft_vocab_size, draft_ids, frequency_ranking, head_rows
from assisted.models.int8 import Int8Linear
from assisted.models.loading import load_pair
from drafting import draft_head as head_module
from drafting.draft_head import FLOOR, DraftHead, draft_head
from tests.assisted.test_acceptance import compare, sampling_noise_tv
from tests.assisted.test_generate_sampling import reference_two_tokens
from tests.helpers_clock import pin_clock
from tests.helpers_models import save_tiny_llama, smollm2_tokenizer, tiny_llama, tiny_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")

V = 49152
K = 512  # the tiny tests' draft vocabulary
PROMPT = "Describe a hero:"
CONSTRAINTS = {"none": {}, "regex": {"regex": r"(yes|no)\. [a-z]{2,8}!"},
               "schema": {"schema": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}},
                                     "required": ["name"], "additionalProperties": False}}}


@pytest.fixture(scope="module")
def tok():
    return smollm2_tokenizer()


@pytest.fixture(scope="module")
def target():
    return tiny_llama(V, seed=0)


@pytest.fixture
def pinned_clock(monkeypatch):
    return pin_clock(monkeypatch)


def restricted(model, size: int, ranking=()):
    """A copy of `model` with a draft vocabulary (the model itself stays whole)."""
    return restrict_vocabulary(copy.deepcopy(model), size, ranking=ranking)


def drafted_tokens(monkeypatch) -> list[int]:
    """Every token the assistant hands a proposal from now on (the list fills as generate() runs)."""
    proposal = importlib.import_module("drafting.proposal")
    seen, give = [], proposal.Proposal.give

    def recording(self, drafted):
        if drafted is not None:
            seen.append(drafted.token)
        give(self, drafted)

    monkeypatch.setattr(proposal.Proposal, "give", recording)
    return seen


# ------------------------------------------------------------------------------------------------ greedy identity

@pytest.mark.parametrize("constraint", list(CONSTRAINTS))
@pytest.mark.parametrize("vocabulary", ["covers-the-output", "misses-the-output"])
@pytest.mark.usefixtures("pinned_clock", "every_cache")
def test_greedy_output_equals_the_reference_with_a_draft_vocabulary(tok, target, plain_reference, constraint,
                                                                    vocabulary):
    """The target drafting for itself through a draft vocabulary: all accepted where the vocabulary holds its tokens,
    none where it holds none of them (no constraint), the output the reference's either way."""
    kw = dict(tokenizer=tok, prompt=PROMPT, max_new_tokens=30, **CONSTRAINTS[constraint])
    ref = plain_reference(target, **kw)
    covers = vocabulary == "covers-the-output"
    ranking = ref.token_ids if covers else [i for i in range(V) if i not in set(ref.token_ids)]
    out = generate(target, restricted(target, K, ranking), **kw)
    assert (out.token_ids, out.stop_reason, out.text) == (ref.token_ids, ref.stop_reason, ref.text)
    assert out.stats.assistant_head == f"draft vocabulary {K} of {V}"
    drafted, accepted = out.stats.drafted_by_source["assistant"], out.stats.accepted_by_source["assistant"]
    if covers:
        assert accepted == drafted > 0
    elif constraint == "none":
        assert drafted > 0 and accepted == 0  # the target's tokens lie outside: every draft is another token


def test_an_assistant_of_another_model_keeps_the_output(tok, target, plain_reference):
    kw = dict(tokenizer=tok, prompt=PROMPT, max_new_tokens=30, **CONSTRAINTS["schema"])
    ref = plain_reference(target, **kw)
    out = generate(target, restricted(tiny_llama(V, seed=1, layers=2), K), **kw)
    assert out.token_ids == ref.token_ids and out.stats.drafted_by_source["assistant"] > 0


# ------------------------------------------------------------------------------------------ never drafted outside

@pytest.mark.parametrize("do_sample", [False, True], ids=["greedy", "sampling"])
def test_tokens_outside_the_draft_vocabulary_are_never_drafted(tok, target, monkeypatch, do_sample):
    assistant = tiny_llama(V, seed=1, init=0.5)
    kw = dict(tokenizer=tok, prompt=PROMPT, max_new_tokens=30, do_sample=do_sample, seed=0,
              num_assistant_tokens_schedule="constant")
    seen = drafted_tokens(monkeypatch)
    generate(target, assistant, **kw)  # negative control: the whole head drafts outside the first K ids
    assert any(t >= K for t in seen)
    seen.clear()
    small = restricted(assistant, K)  # the first K ids (EOS, id 2, among them)
    generate(target, small, **kw)
    assert seen and all(t < K for t in seen)
    assert draft_head(small).full_forwards == 0  # no mask: the full head never ran


def test_a_small_mask_outside_the_draft_vocabulary_gets_the_full_head(tok, target, monkeypatch):
    """Where the guide allows a few tokens, none of them in the draft vocabulary, the assistant drafts what its full
    head drafts, not a blind pick among floor logits."""
    assistant = tiny_llama(V, seed=1, init=0.5)
    kw = dict(tokenizer=tok, prompt=PROMPT, max_new_tokens=12, regex=r"(Zebra|Quokka|Narwhal)s?!",
              num_assistant_tokens_schedule="constant", coalesce=False)
    seen = drafted_tokens(monkeypatch)
    generate(target, assistant, **kw)
    whole = list(seen)
    seen.clear()
    small = restricted(assistant, 64)
    generate(target, small, **kw)
    assert seen == whole and any(t >= 64 for t in seen)
    assert draft_head(small).full_forwards > 0


def test_which_masks_need_the_full_head():
    full = torch.nn.Linear(4, 100, bias=False)
    head = DraftHead(full, head_rows(full, torch.arange(10)), torch.arange(10), 100)
    mask = torch.zeros(100, dtype=torch.bool)
    few_inside, few_outside, none_inside = mask.clone(), mask.clone(), mask.clone()
    few_inside[[1, 2]] = True
    few_outside[[1, 50]] = True
    none_inside[10:] = True
    assert not head.needs_full(None) and not head.needs_full(few_inside)
    assert head.needs_full(few_outside) and head.needs_full(none_inside)
    many = torch.ones(head_module.SMALL_ALLOWED + 10, dtype=torch.bool)  # a large mask that holds the vocabulary
    big = DraftHead(torch.nn.Linear(4, len(many)), torch.nn.Linear(4, 10), torch.arange(10), len(many))
    assert not big.needs_full(many)


# ------------------------------------------------------------------------------------------------- the head itself

def test_the_head_computes_the_rows_and_floors_the_rest():
    torch.manual_seed(0)
    full = torch.nn.Linear(32, 300)
    ids = torch.tensor([0, 5, 17, 299])
    head = DraftHead(full, head_rows(full, ids), ids, 300)
    hidden = torch.randn(2, 3, 32)
    out, whole = head(hidden), full(hidden)  # (2, 3, 300)
    # the same dot products, possibly summed in another order: a bound from the float32 arithmetic
    bound = 32 * torch.finfo(torch.float32).eps * (hidden.abs() @ full.weight.abs().T + full.bias.abs())
    assert ((out[..., ids] - whole[..., ids]).abs() <= bound[..., ids]).all()
    others = torch.ones(300, dtype=torch.bool)
    others[ids] = False
    assert (out[..., others] == FLOOR).all()
    head.exact = True
    assert torch.equal(head(hidden), whole)


def test_an_int8_heads_rows_are_its_own_rows():
    torch.manual_seed(0)
    full = Int8Linear(torch.nn.Linear(64, 200))
    ids = torch.tensor([3, 7, 150])
    rows = head_rows(full, ids)
    assert isinstance(rows, Int8Linear) and torch.equal(rows.dequantized(), full.dequantized()[ids])
    hidden = torch.randn(4, 64)
    assert torch.equal(rows(hidden), full(hidden)[:, ids])  # per-row int8: each output column on its own


def test_draft_ids_keep_the_special_ones_then_the_ranking_then_the_id_order():
    assert draft_ids(10, 4, ranking=[9, 8], keep=[5]).tolist() == [0, 5, 8, 9]
    assert draft_ids(10, 3).tolist() == [0, 1, 2]
    for size, match in ((10, "in \\[1, 10\\)"), (0, "in \\[1, 10\\)"), (True, "in \\[1, 10\\)")):
        with pytest.raises(ValueError, match=match):
            draft_ids(10, size)
    with pytest.raises(ValueError, match="cannot hold the 3 special tokens"):
        draft_ids(10, 2, keep=[1, 2, 3])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        draft_ids(10, 2, ranking=[11])


def test_frequency_ranking_counts_tokens(tok):
    texts = ['{"a": 1}', '{"a": 2}', '{"b": 2}']
    counts = Counter(i for text in texts for i in tok(text, add_special_tokens=False)["input_ids"])
    ranking = frequency_ranking(tok, texts)
    assert sorted(ranking) == sorted(counts)
    assert [counts[i] for i in ranking] == sorted(counts.values(), reverse=True)


def test_restricting_again_starts_from_the_full_head(target):
    model = restricted(target, 100)
    full = draft_head(model).full
    restrict_vocabulary(model, 50)
    assert draft_head(model).full is full and draft_head(model).size == 50


def test_a_head_of_unknown_kind_is_refused(target):
    model = copy.deepcopy(target)
    model.set_output_embeddings(torch.nn.Sequential(model.get_output_embeddings()))
    with pytest.raises(ValueError, match="cannot give a Sequential output head a draft vocabulary"):
        restrict_vocabulary(model, 100)


# ----------------------------------------------------------------------------------------------------- load_pair

@pytest.fixture
def tiny_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("STRUCTSPEC_CACHE", str(tmp_path / "cache"))
    return save_tiny_llama(tmp_path / "tiny", ["a", "b", "c", "d"], hidden_size=32, intermediate_size=64,
                           eos_token_id=1)


def test_load_pair_restricts_a_copy_of_the_assistant(tiny_folder, plain_reference):
    model, tokenizer, assistant = load_pair(str(tiny_folder), str(tiny_folder), draft_vocab_size=3)
    assert assistant is not model and draft_head(model) is None and draft_head(assistant).size == 3
    assert set(draft_head(assistant).ids.tolist()) >= {1}  # EOS always kept
    ref = plain_reference(model, tokenizer=tokenizer, prompt="a", max_new_tokens=6, coalesce=False)
    assert generate(model, assistant, tokenizer=tokenizer, prompt="a", max_new_tokens=6).token_ids == ref.token_ids


def test_load_pair_leaves_the_head_whole_by_default_and_auto_only_for_large_vocabularies(tiny_folder):
    model, _, assistant = load_pair(str(tiny_folder), str(tiny_folder))
    assert assistant is model and draft_head(assistant) is None
    model, _, assistant = load_pair(str(tiny_folder), str(tiny_folder), draft_vocab_size="auto")
    assert assistant is model and draft_head(assistant) is None  # a 6-token vocabulary: nothing to gain
    assert auto_draft_vocab_size(model, on_cpu=True) is None
    assert auto_draft_vocab_size(tiny_llama(2 ** 17, seed=0, hidden=8), on_cpu=True) == 32768
    assert auto_draft_vocab_size(tiny_llama(2 ** 17, seed=0, hidden=8), on_cpu=False) is None


@pytest.mark.parametrize("kwargs, match", [
    ({"draft_vocab_size": 8}, "needs an assistant"),
    ({"assistant": "x", "draft_vocab_size": 0}, "positive int, 'auto' or None"),
    ({"assistant": "x", "draft_vocab_size": "all"}, "positive int, 'auto' or None"),
])
def test_draft_vocab_options_that_do_not_fit_fail_before_loading(kwargs, match):
    with pytest.raises(ValueError, match=match):
        load_pair("no-such-model", **kwargs)


# ------------------------------------------------------------------------------------------------------- sampling

@pytest.mark.parametrize("small_allowed", [head_module.SMALL_ALLOWED, 0], ids=["full-head-on-small-masks", "floor"])
def test_sampling_with_a_draft_vocabulary_has_the_reference_distribution(monkeypatch, small_allowed):
    """The target drafting for itself over 3 of its 8 tokens (EOS, "b", "ab") under a mask: the first two tokens keep
    the plain sampler's joint distribution, whether masks outside the vocabulary get the full head or floor logits."""
    regex = r"(a|b|ab)(c|d|cd|ba)+"
    monkeypatch.setattr(head_module, "SMALL_ALLOWED", small_allowed)
    tok = tiny_tokenizer()
    target = tiny_llama(8, seed=3, hidden=16, init=0.3, eos=0)
    assistant = restrict_vocabulary(copy.deepcopy(target), 3, tokenizer=tok, ranking=[2, 5])
    assert draft_head(assistant).ids.tolist() == [0, 2, 5]
    draws, warp = 800, dict(temperature=0.8)
    kw = dict(tokenizer=tok, input_ids=[1, 3], regex=regex, max_new_tokens=2, do_sample=True, coalesce=False,
              num_assistant_tokens=2, num_assistant_tokens_schedule="constant", **warp)
    counts = Counter(tuple(generate(target, assistant, seed=seed, **kw).token_ids[:2]) for seed in range(draws))
    expected = reference_two_tokens(tok, target, [1, 3], regex, warp)
    p_value, tv = compare(counts, expected, draws)
    assert p_value > 1e-3, f"chi-square p={p_value:.2g}, TV={tv:.3f}"
    assert tv < 1.5 * sampling_noise_tv(expected, draws), f"TV={tv:.3f}"

"""One engine for one row or many: every option of `generate` works per row in a batch, and each row of a batch equals
that row decoded alone by `generate` with the same options.

On the int8 target (row-invariant: a row's logits never depend on the other rows, their padding or their drafts) the
identity is exact, so it is checked on it first; on a float target with tiny random models rows are compared the same
way (their logits are far from ties). The int4 pair (fused layers: target and assistant batches run the ragged forward,
`assisted.models.fused_layers.ragged_forward`, no padding) is exact too. A batch with mixed rows (some taking
draft-tree leaves, some closed by the budget, some stopped by a string) equals each row alone. Shared prompt prefixes
and a prefix cache on the int8 target give each row's tokens exactly.
"""

from __future__ import annotations

import pytest
import torch

from assisted import PrefixCache, generate, generate_batch, generate_batch_iter
from assisted.models.int4_models import int4_copy, quantize_int4
from assisted.models.int8 import int8_copy, quantize_int8
from tests.assisted.test_generate_batch import POINT, REGEX, V, nudged
from tests.helpers_clock import pin_clock
from tests.helpers_models import smollm2_tokenizer, tiny_llama

pytestmark = [pytest.mark.usefixtures("one_thread")]

PROMPTS = ["Describe a hero:", "Hi", "A much longer prompt about a point, its x and its tag, in a few words:", "x",
           "Two words", "Describe a villain:"]


@pytest.fixture(scope="module")
def tok():
    return smollm2_tokenizer()


@pytest.fixture(scope="module")
def pairs():
    """(target, assistant) pairs: float, an int8 target (row-invariant) with an int8 assistant, and an int4 target
    with an int4 assistant (both fused: ragged batch forwards); each assistant drafts like its target, not always.
    Drawn the same on every CPU (`portable`), so that what the rows do (take a leaf, close, stop) does too."""
    def model(hidden=32):
        return tiny_llama(V, seed=1, hidden=hidden, portable=True)

    def near(hidden=32):
        return nudged(model(hidden), 0.002, portable=True)

    return {"float": (model(), near()), "int8": (quantize_int8(model()), int8_copy(near())),
            "int4": (quantize_int4(model(64)), int4_copy(near(64)))}


class Recording:
    """A streamer that keeps what it is given."""

    def __init__(self):
        self.prompt, self.tokens, self.ended = None, [], False

    def put(self, value):
        if self.prompt is None:
            self.prompt = value.tolist()
        else:
            self.tokens += value.tolist()

    def end(self):
        self.ended = True


class LongerThan:
    """A stopping criterion: the sequence (prompt included) has more than `n` tokens."""

    def __init__(self, n: int):
        self.n = n

    def __call__(self, input_ids, scores, **kwargs):
        return torch.tensor([input_ids.shape[1] > self.n])


class Banned:
    """A user's logits processor: never the token `token` (a function of its inputs, as processors must be)."""

    def __init__(self, token: int):
        self.token = token

    def __call__(self, input_ids, scores):
        scores = scores.clone()
        scores[:, self.token] = float("-inf")
        return scores


OPTIONS = {
    "auto": {},
    "auto-tree": {"tree": True},
    "heuristic-lookup": {"num_assistant_tokens_schedule": "heuristic", "prompt_lookup_num_tokens": 3},
    "constant-verified": {"num_assistant_tokens_schedule": "constant", "coalesce": False, "schema": POINT},
    "schema": {"schema": POINT},
    "closed": {"regex": r"[a-z]+( [a-z]+)*\.", "close_within_budget": True, "max_new_tokens": 6},
    "penalties": {"repetition_penalty": 1.3, "no_repeat_ngram_size": 2},
    "processor": {"logits_processor": [Banned(31244)]},
    "criteria": {"stopping_criteria": [LongerThan(15)]},
}


def counted_ragged_forwards(monkeypatch, model) -> list[int]:
    """[how many ragged forwards `model` ran so far] (a fused model's; none for others)."""
    count, fast = [0], getattr(model, "ragged_forward", None)
    if fast is not None:
        def counted(*args):
            count[0] += 1
            return fast(*args)
        monkeypatch.setattr(model, "ragged_forward", counted)
    return count


def alone_and_batched(pair, tok, prompts, batch_size=3, **kw):
    target, helper = pair
    kw = {"max_new_tokens": 16} | kw
    alone = [generate(target, helper, tokenizer=tok, prompt=p, **kw) for p in prompts]
    batched = generate_batch(target, helper, tokenizer=tok, prompts=prompts, batch_size=batch_size, **kw)
    return alone, batched


def same(alone, batched):
    for i, (a, b) in enumerate(zip(alone, batched, strict=True)):
        assert b.error is None, f"row {i}: {b.error}"
        assert (b.token_ids, b.stop_reason, b.value) == (a.token_ids, a.stop_reason, a.value), f"row {i}"


@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("kind", ["int8", "float", "int4"])
def test_each_row_of_a_batch_equals_the_row_alone_with_every_option(tok, pairs, kind, option, monkeypatch):
    ragged = counted_ragged_forwards(monkeypatch, pairs[kind][0])
    alone, batched = alone_and_batched(pairs[kind], tok, PROMPTS, **OPTIONS[option])
    same(alone, batched)
    if kind == "int4":  # every verification forward was ragged, with no padding
        assert ragged[0] == batched[0].batch.target_forwards and batched[0].batch.padding == 0
    drafted = sum(r.stats.drafted for r in batched)
    assert drafted > 0 or option == "criteria"  # the rows really drafted (and verified) something
    if option == "closed":
        assert {r.stop_reason for r in batched} & {"closed"}  # some rows closed within the budget
    if option == "criteria":
        lengths = [len(r.token_ids) + len(tok(p)["input_ids"]) for r, p in zip(batched, PROMPTS)]
        assert all(n == max(16, len(tok(p)["input_ids"]) + 1) for n, r, p in zip(lengths, batched, PROMPTS)
                   if r.stop_reason == "criteria")  # each row's criterion saw that row's ids
        assert {r.stop_reason for r in batched} & {"criteria"}


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_a_batch_of_mixed_rows_equals_each_row_alone(tok, pairs, kind, monkeypatch):
    """Rows with different constraints under one batch's options: some draft a tree's leaf (on the int4 target, the
    same model on every CPU, some take it; the int8 target's fbgemm sums differ by CPU, so which leaves it takes does
    too), some close within the budget, some stop at a string; each is what `generate` gives it alone, on the int8 and
    int4 targets exactly (int4: ragged forwards, a leaf row among them). A first batch call times the pair's costs
    (its warm-up drafts with one row), so that the measured one drafts with every row from its first step."""
    target, helper = pairs[kind]
    pin_clock(monkeypatch)  # every forward one tick: the batch's policy drafts whatever the machine's load
    ragged, drafting = counted_ragged_forwards(monkeypatch, target), counted_ragged_forwards(monkeypatch, helper)
    words, text, yes_no = r"[a-z]+( [a-z]+)*\.", r"[ -~]{0,200}", REGEX
    free = generate(target, helper, tokenizer=tok, prompt=PROMPTS[1], regex=text, max_new_tokens=8)
    stop = tok.decode(free.token_ids[2:4])  # a string the second row writes
    regexes = [words, text, yes_no, text, words, yes_no]
    kw = dict(tree=True, close_within_budget=True, stop_strings=[stop], max_new_tokens=8)
    alone = [generate(target, helper, tokenizer=tok, prompt=p, regex=r, **kw) for p, r in zip(PROMPTS, regexes)]
    generate_batch(target, helper, tokenizer=tok, prompts=PROMPTS, regex=regexes, batch_size=4, **kw)  # warm-up
    ragged[0] = drafting[0] = 0  # count the measured batch's forwards only
    batched = generate_batch(target, helper, tokenizer=tok, prompts=PROMPTS, regex=regexes, batch_size=4, **kw)
    same(alone, batched)
    reasons = {r.stop_reason for r in batched}
    assert {"stop_string", "closed"} <= reasons, reasons
    int4 = kind == "int4"  # the target's and the assistant's batch forwards all ragged
    assert sum(r.stats.branches for r in batched) > 0 and (sum(r.stats.leaves_taken for r in batched) > 0 or not int4)
    assert (ragged[0], drafting[0]) == ((batched[0].batch.target_forwards, batched[0].batch.assistant_forwards)
                                        if int4 else (0, 0))


def test_each_row_streams_to_its_own_streamer(tok, pairs):
    target, helper = pairs["float"]
    streamers = [Recording(), None, Recording(), Recording()]
    out = generate_batch(target, helper, tokenizer=tok, prompts=PROMPTS[:4], streamer=streamers, batch_size=2,
                         max_new_tokens=10)
    for prompt, result, streamer in zip(PROMPTS, out, streamers):
        if streamer is not None:
            assert streamer.prompt == [tok(prompt)["input_ids"]] and streamer.tokens == result.token_ids
            assert streamer.ended


@pytest.mark.parametrize("helper", [False, True])
def test_shared_prefixes_and_a_prefix_cache_give_each_row_exactly_on_the_int8_target(tok, pairs, helper):
    """Rows behind one instruction prefill it once (`share_prefix`, on by default on a row-invariant target) and a
    prefix cache serves a second batch: every row's tokens are the row's alone, bitwise."""
    target, assistant = pairs["int8"]
    assistant = assistant if helper else None
    instruction = "Extract the point as JSON with keys x and tag, nothing else. " * 3
    prompts = [f"{instruction}Doc {i}: {p}" for i, p in enumerate(PROMPTS)]
    kw = dict(tokenizer=tok, max_new_tokens=14, schema=POINT)
    alone = [generate(target, assistant, prompt=p, **kw) for p in prompts]
    shared = generate_batch(target, assistant, prompts=prompts, batch_size=3, **kw)
    same(alone, shared)
    whole = [len(tok(p)["input_ids"]) for p in prompts]
    assert shared[0].stats.prefill_tokens == whole[0]
    assert all(r.stats.prefill_tokens < w // 2 for r, w in zip(shared[1:], whole[1:]))  # the instruction: once
    cache = PrefixCache(capacity=4)
    generate_batch(target, assistant, prompts=prompts[:2], batch_size=2, prefix_cache=cache, share_prefix=False, **kw)
    again = generate_batch(target, assistant, prompts=prompts, batch_size=2, prefix_cache=cache, share_prefix=False,
                           **kw)
    same(alone, again)
    assert all(r.stats.prefill_tokens < w // 2 for r, w in zip(again, whole))  # every row reused a kept prefix


def test_a_float_target_shares_prefixes_only_when_asked(tok, pairs):
    target, _ = pairs["float"]
    prompts = ["The same long instruction, repeated. " * 3 + p for p in PROMPTS[:3]]
    off = generate_batch(target, tokenizer=tok, prompts=prompts, batch_size=3, max_new_tokens=4)
    on = generate_batch(target, tokenizer=tok, prompts=prompts, batch_size=3, max_new_tokens=4, share_prefix=True)
    whole = [len(tok(p)["input_ids"]) for p in prompts]
    assert [r.stats.prefill_tokens for r in off] == whole
    assert all(r.stats.prefill_tokens < w // 2 for r, w in zip(on[1:], whole[1:]))


def test_options_a_batch_cannot_honour_are_refused_before_any_model_call(tok):
    model = tiny_llama(V, seed=0)
    calls = []
    model.register_forward_pre_hook(lambda *a: calls.append(1))
    for bad, message in ((dict(cache_implementation="static"), "static caches"),
                         (dict(cuda_graphs=True), "cuda_graphs"), (dict(tree=True), "needs an assistant_model"),
                         (dict(tree=True, repetition_penalty=1.2), "needs an assistant_model"),
                         (dict(streamer=Recording()), "one streamer")):
        with pytest.raises((ValueError, TypeError), match=message):
            generate_batch_iter(model, tokenizer=tok, prompts=["a", "b"], max_new_tokens=4, **bad)
    with pytest.raises(ValueError, match="logits processors"):
        generate_batch_iter(model, model, tokenizer=tok, prompts=["a"], tree=True, repetition_penalty=1.2)
    assert calls == []

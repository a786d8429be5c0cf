"""The logits processor derives each row's state from its tokens: values nested 20 deep, under `{}` and a tree."""

from __future__ import annotations

import torch

from assisted import logits_processor
from tests.helpers_models import smollm2_tokenizer

DEPTH = 20
TREE = {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}}, "required": ["kids"],
        "additionalProperties": False}


def _masked(proc, prompt: list[int], generated: list[int], width: int) -> torch.Tensor:
    """(width,) True where the processor leaves a token allowed after `generated`."""
    scores = proc(torch.tensor([prompt + generated]), torch.zeros(1, width))
    return ~torch.isinf(scores[0])


def test_processor_follows_values_20_deep():
    tok = smollm2_tokenizer()
    width, prompt = len(tok), tok.encode("JSON:", add_special_tokens=False)
    for schema, opening, closing in (({}, "[" * DEPTH, "]" * DEPTH), (TREE, '{"kids":[' * DEPTH, "]}" * DEPTH)):
        proc = logits_processor(tok, schema=schema)
        _masked(proc, prompt, [], width)  # the first call takes the prompt
        opened = tok.encode(opening, add_special_tokens=False)
        allowed = _masked(proc, prompt, opened, width)
        close_one = tok.encode(closing[: len(closing) // DEPTH], add_special_tokens=False)[0]
        wrong = tok.encode("}" if schema == {} else "]]", add_special_tokens=False)[0]
        assert allowed[close_one] and not allowed[wrong] and not allowed[tok.eos_token_id]
        done = opened + tok.encode(closing, add_special_tokens=False)
        allowed = _masked(proc, prompt, done, width)
        assert allowed[tok.eos_token_id] and int(allowed.sum()) == 1

"""`structspec generate`: streaming, stop strings and repetition penalty by transformers' names (tiny models)."""

from __future__ import annotations

import json

import pytest

from assisted import generate
from assisted.cli import main
from tests.helpers_models import smollm2_tokenizer, tiny_llama

pytestmark = [pytest.mark.usefixtures("one_thread")]
V = 49152


@pytest.fixture(scope="module")
def pair():
    return tiny_llama(V, seed=0, init=0.3), smollm2_tokenizer(), tiny_llama(V, seed=1, init=0.3)


def run(pair, *extra) -> int:
    return main(["generate", "--model", "tiny", "--assistant", "tiny2", "--prompt", "Once", "--max-new-tokens", "16",
                 *extra], load=lambda args: pair)


def test_stream_prints_what_generate_writes(pair, capsys):
    model, tok, assistant = pair
    expected = generate(model, assistant, tokenizer=tok, prompt="Once", max_new_tokens=16, repetition_penalty=1.5)
    assert run(pair, "--stream", "--repetition-penalty", "1.5", "--stats") == 0
    out = capsys.readouterr()
    assert out.out == expected.text + "\n" and json.loads(out.err)["stop_reason"] == "length"


def test_stop_strings_reach_generate(pair, capsys):
    model, tok, assistant = pair
    full = generate(model, assistant, tokenizer=tok, prompt="Once", max_new_tokens=16)
    stop = tok.decode(full.token_ids[2:4])[1:]
    assert run(pair, "--stop", stop, "--stop", "never") == 0
    printed = capsys.readouterr().out
    assert printed.rstrip("\n").endswith(tok.decode(full.token_ids[3:4])) and stop in printed

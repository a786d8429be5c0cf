"""generate(): greedy equality with the reference, stops inside draft blocks, statistics, values, errors.

Tiny random Llama- and GPT-2-style models (vocabulary of SmolLM2's real tokenizer) stand in for real
ones: a different random model as assistant accepts almost nothing, the target itself accepts
everything. Every identity test compares with the `plain_reference` fixture: generate() without an assistant,
checked against the independent plain loop of tests/helpers_reference.py (full forwards, masks from
fsm.Guide alone, forced text spelled from its definition) in the same case.
"""

from __future__ import annotations

import importlib
import json
from typing import Literal

import jsonschema
import pydantic
import pytest
import torch
from pydantic import BaseModel, Field

import fsm
from assisted import generate
from drafting.kv_cache import cache_argument
from drafting.static_cache import BUCKETS
from assisted.policy.costs import forget, recall, recall_calibration
from assisted.inputs import check_options, make_cursor, parse_value
from drafting.sampling import Warp
from assisted.policy.draft_policy import Auto, AutoConfig, make_policy
from tests.helpers_clock import pin_clock
from tests.helpers_reference import plain_decode
from tests.helpers_models import boost, smollm2_tokenizer, threads, tiny_gpt2, tiny_llama

pytestmark = [pytest.mark.usefixtures("one_thread", "every_cache")]  # every test on every KV-cache engine

V = 49152


class Character(BaseModel):
    name: str = Field(max_length=10)
    age: int
    armor: Literal["leather", "chainmail", "plate"]
    strength: int


POINT = {
    "type": "object",
    "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 99}, "tag": {"enum": ["a", "bb"]}},
    "required": ["x", "tag"],
    "additionalProperties": False,
}
REGEX = r"(yes|no)\. [a-z]{2,8}!"
CONSTRAINTS = {"none": {}, "schema": {"schema": Character}, "regex": {"regex": REGEX}}


@pytest.fixture
def pinned_clock(monkeypatch):
    """Equality tests run `auto` on a pinned clock: its decisions never follow the machine's load."""
    return pin_clock(monkeypatch)


@pytest.fixture(scope="module")
def tok():
    return smollm2_tokenizer()


@pytest.fixture(scope="module")
def models():
    return {
        "llama": tiny_llama(V, seed=0),
        "llama-other": tiny_llama(V, seed=1, layers=2),
        "gpt2": tiny_gpt2(V, seed=2),
        "gpt2-other": tiny_gpt2(V, seed=3),
    }


@pytest.mark.parametrize("coalesce", [False, True], ids=["verified", "coalesced"])
@pytest.mark.parametrize("constraint", list(CONSTRAINTS))
@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_reference_is_plain_decoding(tok, models, family, constraint, coalesce):
    model, ids = models[family], tok("Describe a hero:")["input_ids"]
    out = generate(model, tokenizer=tok, input_ids=ids, max_new_tokens=30, coalesce=coalesce, **CONSTRAINTS[constraint])
    assert (out.token_ids, out.stop_reason) == plain_decode(
        model, tok, ids, 30, coalesce=coalesce, **CONSTRAINTS[constraint]
    )
    forced = out.stats.forced_tokens_appended
    assert (forced > 0) == (coalesce and constraint != "none")  # the coalesced cases do append forced text
    assert out.stats.target_forward_passes == out.stats.new_tokens - forced  # one forward per chosen token
    assert out.stats.assistant_forward_passes == 0 and out.stats.drafted == 0


@pytest.mark.parametrize("coalesce", [False, True], ids=["verified", "coalesced"])
@pytest.mark.parametrize("constraint", list(CONSTRAINTS))
@pytest.mark.parametrize("pair", [("llama", "llama-other"), ("llama", "llama"), ("gpt2", "gpt2-other"),
                                  ("gpt2", "gpt2"), ("llama", "gpt2")])
@pytest.mark.usefixtures("pinned_clock")
def test_greedy_output_equals_the_reference(tok, models, plain_reference, pair, constraint, coalesce):
    target, assistant = models[pair[0]], models[pair[1]]
    kw = dict(tokenizer=tok, prompt="Describe a hero:", max_new_tokens=40, coalesce=coalesce, **CONSTRAINTS[constraint])
    ref = plain_reference(target, **kw)
    out = generate(target, assistant, **kw)
    assert out.token_ids == ref.token_ids
    assert out.stop_reason == ref.stop_reason and out.text == ref.text
    if pair[0] == pair[1] and (coalesce or constraint == "none"):  # drafting for itself: all accepted
        assert out.stats.accepted_by_source["assistant"] == out.stats.drafted_by_source["assistant"] > 0
        assert out.stats.target_forward_passes < ref.stats.target_forward_passes


@pytest.mark.parametrize("schedule", ["heuristic", "auto"])
@pytest.mark.parametrize("constraint", ["none", "regex"])
@pytest.mark.parametrize("assistant", [None, "llama-other"])
@pytest.mark.usefixtures("pinned_clock")
def test_prompt_lookup_is_greedy_identical(tok, models, plain_reference, assistant, constraint, schedule):
    prompt = tok.encode("Describe a hero:")
    copyable = generate(models["llama"], tokenizer=tok, input_ids=prompt, max_new_tokens=30, **CONSTRAINTS[constraint])
    kw = dict(tokenizer=tok, input_ids=prompt + copyable.token_ids, max_new_tokens=30, coalesce=False,
              **CONSTRAINTS[constraint])
    ref = plain_reference(models["llama"], **kw)
    forget()
    out = generate(models["llama"], models.get(assistant), prompt_lookup=True, schedule=schedule, **kw)
    assert out.token_ids == ref.token_ids and out.stop_reason == ref.stop_reason
    if assistant is None or schedule == "auto":  # lookup only extends an assistant's k >= 1 drafts, and copies
        assert out.stats.drafted_by_source["lookup"] > 0  # rarely match after a random assistant's tokens
    if schedule == "auto":  # the assistant may be given up (k = 0); free lookup drafts are still offered
        assert make_policy("auto", 5).lookup_k == AutoConfig().k_max


def test_a_different_random_assistant_accepts_almost_nothing(tok, models):
    out = generate(models["llama"], models["llama-other"], tokenizer=tok, prompt="Hi", max_new_tokens=30,
                   coalesce=False, schedule="heuristic")
    assert out.stats.acceptance_rate < 0.2
    assert all(step.k >= 1 for step in out.stats.steps)
    assert out.stats.steps[-1].k == 1  # the heuristic backed off to a single draft token


@pytest.mark.parametrize("sampling, schedule", [({}, "auto"), ({"do_sample": True}, "auto"),
                                                ({"do_sample": True, "seed": 3}, "heuristic")])
def test_the_default_schedule_is_auto_unless_a_seeded_sample_must_repeat(sampling, schedule):
    assert check_options(8, temperature=1.0, top_k=None, top_p=None, num_assistant_tokens=5, schedule=None,
                         coalesce=True, **{"do_sample": False, "seed": None, **sampling}).schedule == schedule


@pytest.mark.parametrize("schedule, lookup, resolved", [(None, None, True), ("auto", None, True),
                                                      ("heuristic", None, False), ("constant", None, False),
                                                      ("auto", False, False), ("constant", True, True)])
def test_prompt_lookup_defaults_to_on_under_auto_only(schedule, lookup, resolved):
    opts = check_options(8, False, 1.0, None, None, None, 5, schedule, True, lookup)
    assert opts.prompt_lookup is resolved


def test_prompt_lookup_must_be_a_bool_or_none():
    with pytest.raises(TypeError, match="prompt_lookup"):
        check_options(8, False, 1.0, None, None, None, 5, None, True, "yes")


@pytest.mark.parametrize("k", [1, 3, 5])
def test_target_passes_with_a_perfect_assistant_are_new_tokens_over_k_plus_one(tok, models, k):
    model = models["llama"]
    out = generate(model, model, tokenizer=tok, prompt="Once", max_new_tokens=36, num_assistant_tokens=k,
                   schedule="constant")
    assert out.stats.new_tokens == 36 and out.stop_reason == "length"
    assert out.stats.target_forward_passes == -(-36 // (k + 1))
    assert [s.k for s in out.stats.steps] == [k] * len(out.stats.steps)
    assert out.stats.accepted == out.stats.drafted == out.stats.drafted_by_source["assistant"]
    assert out.stats.assistant_forward_passes == out.stats.drafted
    heuristic = generate(model, model, tokenizer=tok, prompt="Once", max_new_tokens=36, num_assistant_tokens=k,
                         schedule="heuristic")
    assert heuristic.stats.target_forward_passes <= out.stats.target_forward_passes
    assert [s.k for s in heuristic.stats.steps][:3] == [k, k + 2, k + 4]


def test_statistics_add_up(tok, models, every_cache):
    out = generate(models["llama"], models["llama-other"], tokenizer=tok, prompt="Go", schema=Character,
                   max_new_tokens=40, coalesce=False, schedule="heuristic")
    s = out.stats
    assert s.new_tokens == len(out.token_ids)
    assert s.drafted == sum(s.drafted_by_source.values()) == sum(step.drafted for step in s.steps)
    assert s.accepted == sum(s.accepted_by_source.values()) == sum(step.accepted for step in s.steps)
    assert s.drafted_by_source["forced"] > 0 and s.forced_tokens_appended == 0
    assert s.target_forward_passes == len(s.steps)
    assert s.new_tokens == s.accepted + len(s.steps) - (out.stop_reason == "final" and s.steps[-1].drafted == 0)
    t = s.seconds
    assert 0 < t.target < t.total and 0 <= t.assistant < t.total and 0 < t.fsm < t.total
    assert t.overhead == pytest.approx(t.total - t.target - t.assistant - t.capture)
    assert s.cache == every_cache and (t.capture > 0) == (every_cache == "static+graphs")  # first use of the models


# ----------------------------------------------------------------------------- schedule="auto" and k = 0


class Scripted:
    """A policy that plays back a fixed k sequence (k = 0 included), then repeats its last k."""

    def __init__(self, ks):
        self.ks, self.k, self.calls = list(ks), ks[0], []

    def update(self, drafted, accepted, cost=None, confidence=()):
        self.calls.append((drafted, accepted, cost))
        self.k = self.ks[min(len(self.calls), len(self.ks) - 1)]

    def cut(self, confidence):
        return None

    def assistant_behind(self, positions):
        pass

    @property
    def lookup_k(self):
        return self.k

    def estimates(self):
        return None

    def learned(self):
        return None

    def calibration(self):
        return None


class CutAfter(Scripted):
    """Drafts up to 20 tokens a step and cuts the draft after `n` model drafts, keeping them all."""

    def __init__(self, n):
        super().__init__([20])
        self.n = n

    def cut(self, confidence):
        return len(confidence) if len(confidence) >= self.n else None


@pytest.mark.parametrize("constraint", ["schema", "regex"])
@pytest.mark.parametrize("pair", [("llama", "llama"), ("llama", "llama-other"), ("gpt2", "gpt2")])
def test_coalesced_forced_tokens_are_canonical_wherever_the_draft_is_cut(
    tok, models, monkeypatch, plain_reference, pair, constraint
):
    """A cut just before a forced run still commits the forced run's canonical tokens, as the reference does:
    the ids never depend on where the policy cut (auto cuts where measured timings say)."""
    kw = dict(tokenizer=tok, prompt="Describe a hero:", max_new_tokens=40, coalesce=True, **CONSTRAINTS[constraint])
    outputs = {"reference": plain_reference(models[pair[0]], **kw).token_ids}
    for n in [None, 1, 2, 3, 4, 5]:
        policy = Scripted([20]) if n is None else CutAfter(n)
        monkeypatch.setattr(importlib.import_module("assisted.generate"), "make_policy", lambda *args: policy)
        outputs[n] = generate(models[pair[0]], models[pair[1]], **kw).token_ids
    assert len(set(map(tuple, outputs.values()))) == 1, outputs


@pytest.mark.parametrize("coalesce", [False, True], ids=["verified", "coalesced"])
@pytest.mark.parametrize("constraint", ["none", "schema"])
def test_k_zero_makes_no_assistant_call_and_changes_no_token(tok, models, monkeypatch, plain_reference, constraint,
                                                             coalesce):
    kw = dict(tokenizer=tok, prompt="Describe a hero:", max_new_tokens=40, coalesce=coalesce, **CONSTRAINTS[constraint])
    ref = plain_reference(models["llama"], **kw)
    policy = Scripted([2, 0, 0, 3, 0, 1, 0])
    monkeypatch.setattr(importlib.import_module("assisted.generate"), "make_policy", lambda *args: policy)
    out = generate(models["llama"], models["llama-other"], **kw)
    assert out.token_ids == ref.token_ids and out.stop_reason == ref.stop_reason
    steps = out.stats.steps
    assert out.stats.k_trace == tuple(policy.ks[: len(steps)]) + (0,) * (len(steps) - len(policy.ks))
    assert out.stats.assistant_forward_passes == sum(c.drafted for _, _, c in policy.calls) <= 6
    assert all(c.drafted == 0 for (_, _, c), s in zip(policy.calls, steps) if s.k == 0)  # no assistant call
    timed = [c for _, _, c in policy.calls if c.target_tokens]
    assert len(timed) == out.stats.target_forward_passes and all(c.target_seconds > 0 for c in timed)
    assert sum(c.target_seconds for c in timed) == pytest.approx(out.stats.seconds.target)


@pytest.mark.parametrize("pair", [("llama", "llama-other"), ("llama", "llama"), ("gpt2", "gpt2-other")])
@pytest.mark.parametrize("constraint", ["none", "schema"])
@pytest.mark.usefixtures("pinned_clock")
def test_auto_schedule_is_greedy_identical_and_reports_its_decisions(tok, models, plain_reference, pair, constraint):
    kw = dict(tokenizer=tok, prompt="Describe a hero:", max_new_tokens=40, coalesce=False, **CONSTRAINTS[constraint])
    ref = plain_reference(models[pair[0]], **kw)
    forget()
    out = generate(models[pair[0]], models[pair[1]], schedule="auto", **kw)
    assert out.token_ids == ref.token_ids and out.stop_reason == ref.stop_reason
    s, est = out.stats, out.stats.estimates
    assert len(s.k_trace) == len(s.steps) and s.k_trace[:3] == (5, 5, 0)  # warm-up: a step with drafts, one without
    assert all(0 <= k <= AutoConfig().k_max for k in s.k_trace)
    assert est.target_seconds[1] > 0 and est.draft_per_token > 0
    assert est.target_seconds[0] == 0 and all(t > 0 for t in est.target_seconds[1:])
    assert 0 <= est.acceptance <= 1
    if pair[0] == pair[1]:  # drafting for itself: everything accepted
        assert est.acceptance > 0.6 and s.target_forward_passes < ref.stats.target_forward_passes
    with pytest.raises(AttributeError):
        est.acceptance = 0.5  # frozen, like the rest of the stats


@pytest.mark.usefixtures("pinned_clock")  # every forward takes one tick: the assistant costs what the target does
def test_auto_stops_drafting_when_nothing_is_accepted(tok, models, plain_reference):
    target, bad = models["llama"], models["llama-other"]  # accepts almost nothing; costs what the target costs
    kw = dict(tokenizer=tok, prompt="Hi", max_new_tokens=60, coalesce=False)
    forget()
    out = generate(target, bad, schedule="auto", **kw)
    assert out.token_ids == plain_reference(target, **kw).token_ids
    trace, cfg = out.stats.k_trace, AutoConfig()
    assert trace[:3] == (5, 5, 0) and trace[3:].count(0) >= 0.8 * len(trace[3:])  # probes between plain steps ...
    assert max(trace[3:]) <= 5  # ... drafting at most the window (k0; probes explore, at most `safe_drafts`)
    assert sum(step.drafted for step in out.stats.steps[3:]) <= 3  # probes: unsure drafts cut before verification
    assert out.stats.estimates.acceptance < cfg.acceptance_prior


@pytest.mark.usefixtures("pinned_clock")
def test_auto_remembers_costs_per_model_pair_for_the_next_call(tok, models, plain_reference):
    target, helper = models["llama"], models["llama-other"]
    kw = dict(tokenizer=tok, prompt="Hi", max_new_tokens=30, coalesce=False, schedule="auto")
    forget()
    first = generate(target, helper, **kw)
    costs = recall(target, helper, first.stats.cache)
    assert first.stats.k_trace[:3] == (5, 5, 0) and 1 in costs.measured()
    assert recall(target, None) is None and recall(helper, target) is None  # per ordered pair
    assert recall(target, helper, "an engine never measured") is None  # captured steps cost less than eager ones
    second = generate(target, helper, **kw)
    assert second.token_ids == first.token_ids
    assert second.stats.k_trace[0] == Auto(5, costs=costs).k  # starts from the costs the first call measured
    with threads(torch.get_num_threads() + 1):
        # timings on other threads (or device, dtype) do not carry
        assert recall(target, helper, first.stats.cache) is None
    assert first.token_ids == plain_reference(target, **kw).token_ids  # (its own call remembers the target's costs)
    forget()
    assert recall(target, helper, first.stats.cache) is None


@pytest.mark.usefixtures("pinned_clock")  # how far a call drafts, and so what it judges, follows its timings
def test_auto_remembers_its_calibration_per_pair_and_sampling_setting(tok, models, plain_reference):
    target, helper = models["llama"], models["llama"]  # drafting for itself: every draft is accepted
    kw = dict(tokenizer=tok, prompt="Hi", max_new_tokens=30, coalesce=False, schedule="auto")
    forget()
    greedy = generate(target, helper, **kw)
    assert greedy.token_ids == plain_reference(target, **kw).token_ids
    learned = recall_calibration(target, helper, Warp())
    assert learned is not None and sum(learned.judged) > 0  # the drafts the target judged, per confidence bin
    assert learned == greedy.stats.estimates.calibration
    assert recall_calibration(target, helper, Warp(do_sample=True, temperature=0.7)) is None  # other sampling
    sampled = generate(target, helper, do_sample=True, temperature=0.7, seed=0, **kw)
    assert recall_calibration(target, helper, Warp()) == learned  # each setting keeps its own
    assert (
        recall_calibration(target, helper, Warp(do_sample=True, temperature=0.7)) == sampled.stats.estimates.calibration
    )
    second = generate(target, helper, **kw)
    assert second.token_ids == greedy.token_ids  # still lossless
    # it started from the first call's counts: a fresh start ends with at most the drafts it judged itself
    assert sum(second.stats.estimates.calibration.judged) > second.stats.drafted_by_source["assistant"] + 1
    forget()
    assert recall_calibration(target, helper, Warp()) is None


def test_heuristic_and_constant_report_no_estimates(tok, models):
    out = generate(models["llama"], models["llama"], tokenizer=tok, prompt="Hi", max_new_tokens=8, schedule="heuristic")
    assert out.stats.estimates is None and out.stats.k_trace[:2] == (5, 7)


def test_coalesced_forced_tokens_cost_no_forward(tok, models):
    model = models["llama"]
    out = generate(model, tokenizer=tok, prompt="Go", schema=Character, max_new_tokens=60, coalesce=True)
    verified = generate(model, tokenizer=tok, prompt="Go", schema=Character, max_new_tokens=60, coalesce=False)
    assert out.stats.forced_tokens_appended > 0 and out.stats.drafted == 0
    assert out.stats.target_forward_passes == out.stats.new_tokens - out.stats.forced_tokens_appended
    assert verified.stats.target_forward_passes == verified.stats.new_tokens


# ----------------------------------------------------------------------------- outputs and values


def test_schema_outputs_validate_and_value_is_the_pydantic_instance(tok, models):
    complete = 0
    for seed in range(6):
        out = generate(models["llama"], models["llama-other"], tokenizer=tok, prompt="Hero:", schema=Character,
                       max_new_tokens=48, do_sample=True, seed=seed, coalesce=seed % 2 == 0)
        assert out.text == tok.decode(out.token_ids, skip_special_tokens=True)
        if out.stop_reason == "length":
            continue
        complete += 1
        assert out.stop_reason == "final"
        jsonschema.validate(json.loads(out.text), Character.model_json_schema())
        assert isinstance(out.value, Character) and out.value == Character.model_validate_json(out.text)
    assert complete >= 3


def test_json_schema_dict_gives_parsed_json(tok, models):
    out = generate(models["gpt2"], models["gpt2-other"], tokenizer=tok, prompt="P:", schema=POINT, max_new_tokens=30)
    assert out.stop_reason == "final"
    jsonschema.validate(out.value, POINT)
    assert out.value == json.loads(out.text)
    as_string = generate(models["gpt2"], tokenizer=tok, prompt="P:", schema=json.dumps(POINT), max_new_tokens=30)
    assert as_string.value == json.loads(as_string.text)


def test_value_is_none_for_regex_and_for_json_cut_by_the_budget(tok, models):
    regex = generate(models["llama"], tokenizer=tok, prompt="Q:", regex=REGEX, max_new_tokens=20)
    assert regex.value is None and regex.stop_reason == "final"
    cut = generate(models["llama"], tokenizer=tok, prompt="Q:", schema=Character, max_new_tokens=4)
    assert cut.stop_reason == "length" and cut.value is None and len(cut.token_ids) == 4


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "integer", "minimum": 1000},
        json.dumps({"type": "integer", "minimum": 1000}),
        {"type": "array", "items": {"type": "integer"}, "minItems": 3},
    ],
)
@pytest.mark.parametrize("budget", [1, 2])
def test_a_text_cut_by_the_budget_gives_no_value_even_when_its_prefix_parses(tok, models, schema, budget):
    out = generate(models["llama"], tokenizer=tok, prompt="Q:", schema=schema, max_new_tokens=budget)
    assert out.stop_reason == "length" and len(out.token_ids) == budget
    assert out.value is None


def test_value_is_checked_by_the_schemas_own_validator():
    schema = {"type": "integer", "minimum": 1000}
    assert parse_value(schema, "1234", complete=True) == 1234
    assert parse_value(schema, "1", complete=False) is None
    with pytest.raises(ValueError, match=r"the guide accepted '1', which the schema rejects at \$: 1 is less than"):
        parse_value(schema, "1", complete=True)  # a guide bug would surface, never pass as a value
    with pytest.raises(pydantic.ValidationError):
        parse_value(Character, '{"name": "x"}', complete=True)


def test_prompt_forms_agree(tok, models, plain_reference):
    model = models["llama"]
    ids = tok("Tell me")["input_ids"]
    outs = [generate(model, tokenizer=tok, max_new_tokens=5, **kw).token_ids
            for kw in (dict(prompt="Tell me"), dict(input_ids=ids), dict(input_ids=torch.tensor([ids])),
                       dict(input_ids=torch.tensor(ids)))]
    assert all(o == outs[0] for o in outs)
    assert outs[0] == plain_reference(model, tokenizer=tok, prompt="Tell me", max_new_tokens=5).token_ids
    messages = [{"role": "user", "content": "Tell me"}]
    chat = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    by_messages = generate(model, tokenizer=tok, messages=messages, max_new_tokens=5)
    by_text = generate(model, tokenizer=tok, input_ids=tok(chat, add_special_tokens=False)["input_ids"],
                       max_new_tokens=5)
    assert by_messages.token_ids == by_text.token_ids
    assert by_messages.token_ids == plain_reference(model, tokenizer=tok, messages=messages, max_new_tokens=5).token_ids


def test_sampling_is_reproducible_with_a_seed(tok, models):
    kw = dict(tokenizer=tok, prompt="Go", max_new_tokens=12, do_sample=True, temperature=0.7, top_k=50, top_p=0.9)
    a = generate(models["llama"], models["llama-other"], seed=7, **kw)
    b = generate(models["llama"], models["llama-other"], seed=7, **kw)
    c = generate(models["llama"], models["llama-other"], seed=8, **kw)
    assert a.token_ids == b.token_ids != c.token_ids


# ----------------------------------------------------------------------------- stops inside a draft block


def test_eos_inside_a_draft_block_ends_the_output_there(tok, plain_reference):
    model = boost(tiny_llama(V, seed=10), tok.eos_token_id, 30.0)  # EOS wherever it is allowed
    kw = dict(tokenizer=tok, prompt="x", regex=r"[a-z]{3,12}", max_new_tokens=30, coalesce=False)
    ref = plain_reference(model, **kw)
    out = generate(model, model, **kw)
    assert out.token_ids == ref.token_ids and out.stop_reason == "eos"
    assert out.token_ids[-1] == tok.eos_token_id and tok.eos_token_id not in out.token_ids[:-1]
    assert out.stats.target_forward_passes == 1  # [letters..., EOS] drafted and verified at once
    assert out.stats.steps[0].drafted == len(out.token_ids)  # EOS was the last draft token: no bonus after it


def test_final_state_inside_a_draft_block_ends_the_output_there(tok, models, plain_reference):
    model = models["llama"]
    kw = dict(tokenizer=tok, prompt="x", regex=REGEX, max_new_tokens=40, coalesce=False, num_assistant_tokens=20,
              schedule="constant")
    ref = plain_reference(model, **kw)
    out = generate(model, model, **kw)
    assert out.token_ids == ref.token_ids and out.stop_reason == ref.stop_reason == "final"
    assert out.text.endswith("!") and out.stats.target_forward_passes == 1
    assert tok.eos_token_id not in out.token_ids


@pytest.mark.parametrize("coalesce", [False, True])
@pytest.mark.parametrize("budget", [1, 2, 3, 7, 8])
def test_the_budget_inside_a_draft_block_is_never_exceeded(tok, models, plain_reference, budget, coalesce):
    model = models["llama"]
    for constraint in ({}, {"schema": Character}):
        kw = dict(tokenizer=tok, prompt="x", max_new_tokens=budget, coalesce=coalesce, **constraint)
        ref = plain_reference(model, **kw)
        out = generate(model, model, **kw)
        assert out.token_ids == ref.token_ids
        assert len(out.token_ids) == budget and out.stop_reason == "length"


def test_a_constraint_that_is_complete_at_once_stops_before_any_forward(tok, models):
    out = generate(models["llama"], tokenizer=tok, prompt="x", regex="", max_new_tokens=5)
    assert out.token_ids == [] and out.stop_reason == "final" and out.stats.target_forward_passes == 0


def test_coalesced_forced_run_to_the_end_needs_no_verification(tok, models):
    out = generate(models["llama"], tokenizer=tok, prompt="x", regex="(yes|no), thank you", max_new_tokens=20)
    assert out.stop_reason == "final" and out.text.endswith(", thank you")
    assert out.stats.target_forward_passes == 1  # the choice; the forced tail is appended for free


# ----------------------------------------------------------------------------- bad input


def count_calls(model):
    calls = []
    handle = model.register_forward_pre_hook(lambda *_: calls.append(1))
    return calls, handle


BAD = [
    (dict(schema=Character, regex="a"), ValueError, "at most one of schema and regex"),
    (dict(prompt=None), ValueError, "exactly one of prompt, messages, input_ids; got none"),
    (dict(input_ids=[1, 2]), ValueError, "exactly one of prompt, messages, input_ids; got prompt, input_ids"),
    (dict(prompt=None, input_ids=torch.ones(2, 3, dtype=torch.long)), ValueError, "batch size 2 is not supported"),
    (dict(prompt=["a", "b"]), ValueError, "batch size 2 is not supported"),
    (dict(prompt=None, input_ids=[[1], [2]]), ValueError, "batch size 2 is not supported"),
    (dict(prompt=None, messages=[[{"role": "user", "content": "a"}]] * 2), ValueError, "batch size 2"),
    (dict(max_new_tokens=0), ValueError, "max_new_tokens must be >= 1, got 0"),
    (dict(max_new_tokens=2.5), TypeError, "max_new_tokens must be an int"),
    (dict(do_sample=True, temperature=0), ValueError, "temperature must be > 0 when do_sample=True"),
    (dict(do_sample=True, temperature=-1.0), ValueError, "temperature must be > 0"),
    (dict(top_p=0.0), ValueError, "top_p must be in (0, 1], got 0.0"),
    (dict(top_p=1.5), ValueError, "top_p must be in (0, 1], got 1.5"),
    (dict(top_k=-1), ValueError, "top_k must be >= 0, got -1"),  # 0: no top-k, as in transformers
    (dict(schedule="adaptive"), ValueError, "unknown schedule 'adaptive'"),
    (dict(num_assistant_tokens=0), ValueError, "num_assistant_tokens must be >= 1"),
    (dict(prompt=None, input_ids=[]), ValueError, "input_ids is empty"),
    (dict(prompt=None, input_ids=[V + 5]), ValueError, "outside the vocabulary"),
    (dict(schema={"type": "array", "items": {"type": "string"}, "uniqueItems": True}), fsm.SchemaError, "uniqueItems"),
    (dict(regex=r"(a)\1"), fsm.RegexError, ""),
    (dict(do_sample=True, temperature=float("nan")), ValueError, "temperature must be a finite number, got nan"),
    (dict(temperature=float("inf")), ValueError, "temperature must be a finite number, got inf"),
    (dict(top_p=float("nan")), ValueError, "top_p must be a finite number"),
    (dict(seed=2**70), ValueError, f"seed must be <= {2**64 - 2}, got {2**70}"),
    (
        dict(schema={"type": 5}),
        fsm.SchemaError,
        "must be a type name or a non-empty list of them, not 5 (keyword 'type' at #)",
    ),
    (
        dict(assistant_model="gpt2"),
        TypeError,
        "assistant_model must be a loaded causal LM (a torch.nn.Module), got str",
    ),
    (dict(tokenizer=None), TypeError, "tokenizer must be the model's transformers tokenizer, got NoneType"),
    (dict(prompt=None, messages=[{"role": "user", "content": None}]), TypeError, "messages[0] needs a str 'role' and"),
    (
        dict(prompt=None, input_ids=torch.tensor([5.7, 6.2])),
        TypeError,
        "input_ids must be a tensor of integer ids, got dtype torch.float32",
    ),
    (dict(do_sample="no"), TypeError, "do_sample must be True or False, got str 'no'"),
    (dict(coalesce=None), TypeError, "coalesce must be True or False"),
    (
        dict(prompt=None, input_ids=[5] * 2048),
        ValueError,
        "the prompt has 2048 tokens but model takes at most 2048 positions",
    ),
    (
        dict(
            schema={
                "type": "object",
                "properties": {"q": {"type": "string", "pattern": '^say \\"hi\\"$'}},
                "required": ["q"],
            }
        ),
        fsm.SchemaError,
        "character JSON must escape ('\"', '\\' or a control character); patterns over escaped characters "
        "are not supported (keyword 'pattern' at #/properties/q)",
    ),
    (
        dict(schema=Character, guide_options={"policy": "lenient"}),
        fsm.SchemaError,
        "policy must be one of 'compact', 'spec'",
    ),
    (dict(schema=Character, guide_options={"strict": True}), ValueError, "'strict' is not an option of a schema guide"),
    (dict(regex="a+", guide_options={"policy": "spec"}), ValueError, "'policy' is not an option of a regex guide"),
    (dict(guide_options={"policy": "spec"}), ValueError, "guide_options need a schema or a regex"),
    (dict(schema=Character, guide_options=["spec"]), TypeError, "guide_options must be a dict, got list"),
]


@pytest.mark.parametrize("kwargs, error, message", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_input_is_refused_before_any_model_call(tok, models, kwargs, error, message):
    target, assistant = models["llama"], models["llama-other"]
    (t_calls, t_hook), (a_calls, a_hook) = count_calls(target), count_calls(assistant)
    try:
        with pytest.raises(error) as raised:
            generate(target, **{"assistant_model": assistant, "tokenizer": tok, "prompt": "hi", **kwargs})
        assert message in str(raised.value)
        assert t_calls == [] and a_calls == []
    finally:
        t_hook.remove()
        a_hook.remove()


@pytest.mark.parametrize("assistant", [None, "gpt2-other"])
def test_a_budget_past_the_position_limit_stops_there_keeping_the_output(tok, models, plain_reference, assistant):
    target, helper = models["gpt2"], models.get(assistant)  # learned positions: 512 of them
    ids = (tok("Describe a hero:")["input_ids"] * 512)[: 512 - 12]
    out = generate(target, helper, tokenizer=tok, input_ids=ids, max_new_tokens=40)
    assert out.stop_reason == "length" and len(out.token_ids) == 12
    assert out.token_ids == plain_reference(target, tokenizer=tok, input_ids=ids, max_new_tokens=12).token_ids


def test_an_assistant_with_another_vocabulary_is_refused(tok, models):
    other = tiny_llama(V + 64, seed=11)
    calls, hook = count_calls(models["llama"])
    with pytest.raises(ValueError, match="assistant_model's vocabulary differs from the model's: logits of size"):
        generate(models["llama"], other, tokenizer=tok, prompt="hi")
    hook.remove()
    assert calls == []


def test_a_tokenizer_larger_than_the_model_is_refused(tok):
    small = tiny_llama(1000, seed=12)
    with pytest.raises(ValueError, match="tokenizer has 49152 tokens but the model's logits only 1000"):
        generate(small, tokenizer=tok, prompt="hi")


# ----------------------------------------------------------------------------- caches and devices


def test_one_cache_per_model_cropped_to_the_committed_length(tok, models, every_cache):
    """Every target forward sees the same cache holding exactly the committed tokens but the last (a captured step
    is fed its tokens padded to its width)."""
    target, assistant = models["llama"], models["llama-other"]
    seen = {"target": [], "assistant": []}

    def spy(name):
        def hook(module, args, kwargs):
            cache = kwargs[cache_argument(type(module))]
            seen[name].append((id(cache), int(cache.get_seq_length()), kwargs["input_ids"].shape[1]))
        return hook

    hooks = [target.register_forward_pre_hook(spy("target"), with_kwargs=True),
             assistant.register_forward_pre_hook(spy("assistant"), with_kwargs=True)]
    try:
        ids = tok("Describe a hero:")["input_ids"]
        out = generate(target, assistant, tokenizer=tok, input_ids=ids, schema=Character, max_new_tokens=30,
                       coalesce=False)
    finally:
        for hook in hooks:
            hook.remove()
    for name in seen:
        assert len({cache for cache, _, _ in seen[name]}) == 1, f"the {name} cache was rebuilt"
    committed = len(ids)
    for i, ((_, cached, fed), step) in enumerate(zip(seen["target"], out.stats.steps)):
        assert cached == (0 if i == 0 else committed - 1)  # prefill, then all committed tokens but the last
        new = committed - cached + step.drafted
        assert fed == (next(b for b in BUCKETS if b >= new) if every_cache == "static+graphs" and new <= 32 else new)
        committed += step.accepted + 1
    assert seen["assistant"][0][1] == 0 and seen["assistant"][0][2] >= len(ids)  # prompt (+ forced run) once
    assert all(cached > len(ids) for _, cached, _ in seen["assistant"][1:])  # then only what it has not seen


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_target_and_assistant_on_different_devices(tok, models, plain_reference):
    target = tiny_llama(V, seed=0).to("cuda")
    kw = dict(tokenizer=tok, prompt="Describe a hero:", schema=Character, max_new_tokens=30, coalesce=False)
    ref = plain_reference(target, **kw)
    for do_sample in (False, True):
        out = generate(target, models["llama-other"], do_sample=do_sample, seed=0, **kw)
        if not do_sample:
            assert out.token_ids == ref.token_ids
        assert out.stop_reason in ("final", "length")


def test_guide_options_reach_the_guide(tok, models):
    """policy="spec" reads objects as validators do: after "{" a key of any spelling may start, not only '"a'."""
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}
    compact = make_cursor(schema, None, tok, V, frozenset({0}))
    spec = make_cursor(schema, None, tok, V, frozenset({0}), {"policy": "spec"})
    for cursor in (compact, spec):
        cursor.advance(tok.convert_tokens_to_ids("{"))
    assert bool((spec.mask() | ~compact.mask()).all())  # spec allows all that compact allows after "{" ...
    assert int(spec.mask().sum()) > int(compact.mask().sum()) == 2  # ... and more: compact allows only '"' and '}'
    out = generate(models["llama"], tokenizer=tok, prompt="hi", schema=schema, max_new_tokens=30,
                   guide_options={"policy": "spec"})
    assert out.stop_reason == "final" and out.value == json.loads(out.text)  # complete, and its value validates
    jsonschema.validate(out.value, schema)

"""generate_batch(): every row decoded as if alone, whatever shares its batch.

Greedy rows equal the `plain_reference` of that row alone (tiny random models made decisive: a random
assistant accepts almost nothing, the target itself everything), for batch sizes 1, 2, 3 and 5, mixed prompt
lengths, refills and EOS mid-batch; sampled rows have the reference distribution of their own prompt and
constraint while the other rows accept and reject differently; a seeded row gives the same tokens alone and in
a batch. Bad rows get their own error; bad batch arguments are refused before any model call.
"""

from __future__ import annotations

import importlib
import json
from collections import Counter

import numpy as np
import pytest
import torch

import assisted
from assisted import GenerationResult, generate, generate_batch, generate_batch_iter
from assisted.cli import main
from tests.assisted.test_acceptance import compare, sampling_noise_tv
from tests.assisted.test_generate_sampling import COPYABLE, PROMPT, reference_two_tokens
from tests.helpers_models import boost, portable_normal, smollm2_tokenizer, tiny_gpt2, tiny_llama, tiny_tokenizer

pytestmark = [pytest.mark.usefixtures("one_thread")]

V = 49152
POINT = {"type": "object",
         "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 99}, "tag": {"enum": ["a", "bb"]}},
         "required": ["x", "tag"], "additionalProperties": False}
REGEX = r"(yes|no)\. [a-z]{2,8}!"
PROMPTS = ["Describe a hero:", "Hi", "A much longer prompt about a point, its x and its tag, in a few words:", "x",
           "Two words"]


@pytest.fixture(scope="module")
def tok():
    return smollm2_tokenizer()


@pytest.fixture(scope="module")
def models():
    eager = tiny_llama(V, seed=0)
    eager.set_attn_implementation("eager")
    return {"llama": tiny_llama(V, seed=0), "llama-other": tiny_llama(V, seed=1, layers=2), "llama-eager": eager,
            "gpt2": tiny_gpt2(V, seed=2), "gpt2-other": tiny_gpt2(V, seed=3),
            "llama-eos": boost(tiny_llama(V, seed=0), 2, 0.35),  # stops with EOS after 4 to 14 tokens
            "llama-near": nudged(tiny_llama(V, seed=0), 0.002)}  # accepts about half of its drafts


def nudged(model, noise: float, portable: bool = False):
    """`model` with seeded Gaussian noise on every weight: an assistant that drafts like it, not always
    (`portable`: the same noise on every CPU, `tests.helpers_models.portable_normal`)."""
    generator, rng = torch.Generator().manual_seed(5), np.random.default_rng(5)
    with torch.no_grad():
        for weight in model.parameters():
            sample = portable_normal(rng, weight.shape) if portable else torch.randn(weight.shape, generator=generator)
            weight.add_(sample * noise)
    return model


def references(plain_reference, model, tok, prompts, **kw) -> list[GenerationResult]:
    schemas = kw.pop("schema", None)
    schemas = schemas if isinstance(schemas, list) else [schemas] * len(prompts)
    return [plain_reference(model, tokenizer=tok, prompt=p, schema=s, **kw) for p, s in zip(prompts, schemas)]


def same_rows(results, refs) -> None:
    for i, (out, ref) in enumerate(zip(results, refs, strict=True)):
        assert out.error is None, f"row {i}: {out.error}"
        assert (out.token_ids, out.stop_reason, out.text) == (ref.token_ids, ref.stop_reason, ref.text), f"row {i}"
        assert out.value == ref.value


CONSTRAINTS = {"none": {}, "schema": {"schema": POINT}, "schema-verified": {"schema": POINT, "coalesce": False},
               "regex": {"regex": REGEX}}
PAIRS = {"plain": ("llama", None), "accepted": ("llama", "llama"), "rejected": ("llama", "llama-other"),
         "gpt2-rejected": ("gpt2", "gpt2-other"), "eager-accepted": ("llama-eager", "llama-eager")}


SIZES = [(pair, constraint, 3) for pair in PAIRS for constraint in CONSTRAINTS] + [
    (pair, constraint, size) for pair, constraint in (("accepted", "none"), ("rejected", "schema"))
    for size in (1, 2, 5)]


@pytest.mark.parametrize("pair, constraint, batch_size", SIZES)
def test_greedy_rows_equal_plain_decoding_alone(tok, models, plain_reference, pair, constraint, batch_size):
    target, helper = (models[name] if name else None for name in PAIRS[pair])
    kw = dict(max_new_tokens=24, **CONSTRAINTS[constraint])
    refs = references(plain_reference, target, tok, PROMPTS, **kw)
    out = generate_batch(target, helper, tokenizer=tok, prompts=PROMPTS, batch_size=batch_size, **kw)
    same_rows(out, refs)
    batch = out[0].batch
    assert all(r.batch is batch for r in out) and batch.rows == len(PROMPTS)
    assert batch.refills == max(0, len(PROMPTS) - batch_size)
    if batch_size > 1:
        assert batch.rows_per_forward > 1
    drafted = sum(r.stats.drafted_by_source["assistant"] for r in out)
    accepted = sum(r.stats.accepted_by_source["assistant"] for r in out)
    if pair in ("accepted", "eager-accepted") and constraint in ("none", "schema"):
        assert accepted == drafted > 0  # drafting for itself: every draft accepted
    if "rejected" in pair and constraint == "none":
        assert accepted < 0.3 * drafted
    if constraint == "schema":
        assert all(r.stats.forced_tokens_appended > 0 for r in out)  # forced runs coalesced in every row


@pytest.mark.parametrize("constraint, schedule", [("none", "constant"), ("schema-verified", "heuristic")])
def test_each_row_drafts_and_accepts_as_generate_alone(tok, models, constraint, schedule):
    """Greedy identity cannot see a drafter that drafts from a wrong context (say, an assistant cache left
    uncropped after a rejection): only what it drafts can. With an assistant that accepts about half, each
    row's drafted / accepted counts per source and its draft-length trace equal single-row `generate`'s."""
    kw = dict(tokenizer=tok, max_new_tokens=24, num_assistant_tokens=3, num_assistant_tokens_schedule=schedule,
              **CONSTRAINTS[constraint])
    out = generate_batch(models["llama"], models["llama-near"], prompts=PROMPTS, batch_size=2, **kw)
    for i, prompt in enumerate(PROMPTS):
        alone = generate(models["llama"], models["llama-near"], prompt=prompt, **kw)
        mine, theirs = out[i].stats, alone.stats
        assert out[i].token_ids == alone.token_ids, f"row {i}"
        assert mine.drafted_by_source == theirs.drafted_by_source, f"row {i}"
        assert mine.accepted_by_source == theirs.accepted_by_source, f"row {i}"
        assert mine.steps == theirs.steps, f"row {i}: k trace {mine.k_trace} != {theirs.k_trace}"
    drafted = sum(r.stats.drafted_by_source["assistant"] for r in out)
    accepted = sum(r.stats.accepted_by_source["assistant"] for r in out)
    assert 0.2 * drafted < accepted < 0.8 * drafted  # a pair that accepts partially


@pytest.mark.parametrize("helper", [None, "llama-other", "llama-eos"])
def test_rows_that_stop_with_eos_mid_batch_leave_and_are_refilled(tok, models, plain_reference, helper):
    prompts = PROMPTS * 2
    refs = references(plain_reference, models["llama-eos"], tok, prompts, max_new_tokens=30)
    assert {r.stop_reason for r in refs} == {"eos"} and len({len(r.token_ids) for r in refs}) > 2
    finished = list(generate_batch_iter(models["llama-eos"], models.get(helper), tokenizer=tok, prompts=prompts,
                                        batch_size=3, max_new_tokens=30))
    order = [i for i, _ in finished]
    assert sorted(order) == list(range(len(prompts))) and order != sorted(order)  # yielded as rows finish
    same_rows([dict(finished)[i] for i in range(len(prompts))], refs)
    assert finished[0][1].batch.refills == len(prompts) - 3


def test_rows_read_from_an_iterator_with_texts_and_chats_mixed_equal_the_same_rows_as_lists(tok, models):
    """The `structspec batch` form: rows read as they are admitted, a prompt entry that is a chat read as messages."""
    chat = [{"role": "user", "content": "A point, please."}]
    rows = [PROMPTS[0], chat, PROMPTS[1]]
    consumed = []

    def lazily():
        for row in rows:
            consumed.append(row)
            yield row

    found = generate_batch_iter(models["llama"], tokenizer=tok, prompts=lazily(), batch_size=2, max_new_tokens=8,
                                schema=POINT)
    assert consumed == []  # checked at the call, read as rows are admitted
    found = dict(found)
    texts = generate_batch(models["llama"], tokenizer=tok, prompts=[PROMPTS[0], PROMPTS[1]], max_new_tokens=8,
                           schema=POINT)
    (alone,) = generate_batch(models["llama"], tokenizer=tok, messages=[chat], max_new_tokens=8, schema=POINT)
    assert [found[i].token_ids for i in range(3)] == [texts[0].token_ids, alone.token_ids, texts[1].token_ids]
    with pytest.raises(ValueError, match="seed is a list but the rows are an iterator"):
        generate_batch_iter(models["llama"], tokenizer=tok, prompts=iter(PROMPTS), seed=[1] * len(PROMPTS))


def test_a_row_does_not_depend_on_its_neighbours_or_their_order(tok, models, plain_reference):
    refs = references(plain_reference, models["llama"], tok, PROMPTS, max_new_tokens=20, schema=POINT)
    order = [3, 0, 4, 1, 2]
    out = generate_batch(models["llama"], models["llama-other"], tokenizer=tok, prompts=[PROMPTS[i] for i in order],
                         batch_size=2, max_new_tokens=20, schema=POINT)
    same_rows(out, [refs[i] for i in order])


def test_rows_with_different_schemas_share_compiled_guides(tok, models, plain_reference, monkeypatch):
    import assisted.rows.row_inputs as rows

    built, real = [], rows.make_cursor
    monkeypatch.setattr(rows, "make_cursor", lambda schema, *args: built.append(schema) or real(schema, *args))
    other = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    schemas = [POINT, other, None, dict(POINT), other]
    refs = references(plain_reference, models["llama"], tok, PROMPTS, max_new_tokens=30, schema=schemas)
    built.clear()
    out = generate_batch(models["llama"], models["llama"], tokenizer=tok, prompts=PROMPTS, schema=schemas,
                         batch_size=3, max_new_tokens=30)
    same_rows(out, refs)
    assert len(built) == 3  # POINT, other, no constraint: each compiled once


def test_bad_rows_get_their_own_error_and_the_others_finish(tok, models, plain_reference):
    ok = tok("Describe a hero:")["input_ids"]
    rows = [ok, [], [5] * 600, ok[:2], [V + 3]]  # fine, empty, too long for GPT-2's 512 positions, fine, not an id
    schemas = [POINT, POINT, POINT, {"type": "nonsense"}, POINT]
    out = generate_batch(models["gpt2"], models["gpt2-other"], tokenizer=tok, input_ids=rows, schema=schemas,
                         batch_size=2, max_new_tokens=20)
    assert [r.error is None for r in out] == [True, False, False, False, False]
    assert "empty" in out[1].error and "512" in out[2].error and "nonsense" in out[3].error
    assert "outside the vocabulary" in out[4].error
    assert all(r.stop_reason == "error" and r.token_ids == [] and "\n" not in r.error for r in out[1:])
    same_rows(out[:1], [plain_reference(models["gpt2"], tokenizer=tok, input_ids=ok, schema=POINT, max_new_tokens=20)])
    assert out[0].batch.errors == 4


@pytest.mark.parametrize("bad, error", [
    (dict(batch_size=0), "batch_size"), (dict(prompts="one string"), "must be a list"),
    (dict(schema=[POINT]), "schema is a list of 1"), (dict(regex="a+", schema=POINT), "at most one"),
    (dict(streamer=object()), "streamer"), (dict(streamer=[object(), None]), "streamer"),
    (dict(prefix_cache=object()), "prefix_cache"), (dict(tree="yes"), "tree"), (dict(share_prefix=1), "share_prefix"),
    (dict(cache_implementation="static"), "static"), (dict(cuda_graphs=True), "cuda_graphs"),
    (dict(seed=[1, -1]), "seed"), (dict(do_sample=True, temperature=0.0), "temperature"),
    (dict(top_p=2.0), "top_p"), (dict(guide_options={"policy": "spec"}), "need a schema"),
    (dict(not_an_option=1), "not_an_option"), (dict(attention="flash_attention_2"), "attn_implementation"),
])
def test_bad_batch_arguments_are_refused_before_any_model_call(tok, bad, error):
    model, helper = tiny_llama(V, seed=0), tiny_llama(V, seed=1)
    if "attention" in bad:
        model.config._attn_implementation = bad.pop("attention")
    calls = []
    for m in (model, helper):
        m.register_forward_pre_hook(lambda *a: calls.append(1))
    kw = dict(tokenizer=tok, prompts=["a", "b"], max_new_tokens=4) | bad
    with pytest.raises((ValueError, TypeError), match=error):
        generate_batch_iter(model, helper, **kw)  # checked at the call, not at the first row
    assert calls == []


def test_the_cache_never_holds_more_than_batch_size_rows(tok, models):
    widths = []
    hook = models["llama-eos"].register_forward_pre_hook(lambda m, args, kw: widths.append(kw["input_ids"].shape[0]),
                                                         with_kwargs=True)
    try:
        out = generate_batch(models["llama-eos"], tokenizer=tok, prompts=PROMPTS * 3, batch_size=4, max_new_tokens=30)
    finally:
        hook.remove()
    assert max(widths) == 4 and all(r.error is None for r in out)
    assert out[0].batch.padding_share >= 0 and out[0].stats.latency_seconds > 0


# ---- sampling


@pytest.fixture(scope="module")
def small():
    target = tiny_llama(8, seed=3, hidden=16, init=0.3, eos=0)
    helper = tiny_llama(8, seed=0, hidden=16, init=0.3, eos=0)  # prefers other tokens: a bad drafter
    return tiny_tokenizer(), target, helper


SAMPLED_ROWS = [(PROMPT, r"(a|b|ab)(c|d|cd|ba)+"), (COPYABLE, None), (PROMPT, r"(a|b)cd(a|b|c)")]
WARP = dict(temperature=1.3, top_p=0.95)
DRAWS = 1000


def sampled_rows(small) -> list[tuple[bool, str]]:
    """(passes, numbers) per row of SAMPLED_ROWS: its first two tokens over DRAWS batched draws against its own
    reference (chi-square p > 1e-3 and TV within 1.5x the sampling noise)."""
    tok, target, helper = small
    counts = [Counter() for _ in SAMPLED_ROWS]
    for draw in range(DRAWS):
        out = generate_batch(target, helper, tokenizer=tok, input_ids=[p for p, _ in SAMPLED_ROWS],
                             regex=[r for _, r in SAMPLED_ROWS], batch_size=3, max_new_tokens=2, do_sample=True,
                             coalesce=False, num_assistant_tokens=2, seed=[3 * draw + r for r in range(3)], **WARP)
        for row, result in enumerate(out):
            counts[row][tuple(result.token_ids[:2])] += 1
    verdicts = []
    for row, (prompt, regex) in enumerate(SAMPLED_ROWS):
        expected = reference_two_tokens(tok, target, prompt, regex, WARP)
        try:
            p_value, tv = compare(counts[row], expected, DRAWS)
        except AssertionError as error:  # an output the reference gives probability 0
            verdicts.append((False, f"row {row}: {error}".splitlines()[0]))
            continue
        ok = p_value > 1e-3 and tv < 1.5 * sampling_noise_tv(expected, DRAWS)
        verdicts.append((ok, f"row {row}: chi-square p={p_value:.2g}, TV={tv:.3f}"))
    return verdicts


def test_each_sampled_row_has_its_own_reference_distribution(small):
    for ok, numbers in sampled_rows(small):
        assert ok, numbers


def test_a_biased_acceptance_fails_the_batched_distribution_check(small, monkeypatch):
    """Negative control: rows that take every assistant token they are shown (no min(1, p/q) test) must fail
    the same check with the same draws."""
    steps = importlib.import_module("assisted.steps")  # where the step rules of both loops call the acceptance
    fair = steps.speculative_accept
    monkeypatch.setattr(steps, "speculative_accept", lambda p, q, draft, auto, gen: fair(p, q, draft, auto | True, gen))
    verdicts = sampled_rows(small)
    assert not all(ok for ok, _ in verdicts), f"the biased acceptance passed: {verdicts}"


def test_a_seeded_row_gives_the_same_tokens_alone_and_in_any_batch(small):
    tok, target, helper = small
    kw = dict(tokenizer=tok, do_sample=True, coalesce=False, max_new_tokens=12, num_assistant_tokens=3,
              num_assistant_tokens_schedule="constant", **WARP)
    prompts, regexes = [PROMPT, COPYABLE, PROMPT, [1, 2]], [None, None, r"(a|b)cd(a|b|c)+", r"[abcd]+"]
    together = generate_batch(target, helper, input_ids=prompts, regex=regexes, seed=[7, 8, 9, 10], batch_size=2, **kw)
    for i, (prompt, regex) in enumerate(zip(prompts, regexes)):
        alone = generate_batch(target, helper, input_ids=[prompt], regex=regex, seed=7 + i, **kw)[0]
        single = generate(target, helper, input_ids=prompt, regex=regex, seed=7 + i, **kw)
        assert together[i].token_ids == alone.token_ids == single.token_ids, f"row {i}"
    assert len({tuple(r.token_ids) for r in together}) > 1


# ---- the command line


def test_structspec_batch_with_a_batch_size_writes_what_one_at_a_time_writes(tmp_path, models, tok, monkeypatch):
    schema, docs = tmp_path / "point.json", tmp_path / "docs.jsonl"
    schema.write_text(json.dumps(POINT))
    lines = [{"id": i, "prompt": p} for i, p in enumerate(PROMPTS)] + [{"id": "empty", "prompt": ""}]
    docs.write_text("".join(json.dumps(line) + "\n" for line in lines) + "{not json\n")
    pair = models["llama-eos"], tok, models["llama-other"]

    def run(out, *extra):
        args = ["batch", "--model", "t", "--assistant", "a", "--schema", str(schema), "--input", str(docs),
                "--output", str(out), "--max-new-tokens", "24", "--no-progress", *extra]
        return main(args, load=lambda args: pair)

    assert run(tmp_path / "one.jsonl", "--batch-size", "1") == 0
    writes, real = [], assisted.jobs.run.write_line

    def crash_on_the_fourth_line(out, record):
        writes.append(record)
        if len(writes) == 4:
            raise KeyboardInterrupt
        real(out, record)

    monkeypatch.setattr(assisted.jobs.run, "write_line", crash_on_the_fourth_line)
    assert run(tmp_path / "three.jsonl", "--batch-size", "3") == 130  # interrupted after three lines
    monkeypatch.setattr(assisted.jobs.run, "write_line", real)
    assert run(tmp_path / "three.jsonl", "--batch-size", "3") == 0  # resumed
    one, three = ([json.loads(x) for x in (tmp_path / name).read_text().splitlines()] for name in
                  ("one.jsonl", "three.jsonl"))
    assert len(three) == len(one) == len(lines) + 1
    key = lambda r: json.dumps(r["id"])  # noqa: E731
    assert ({key(r): r.get("text") for r in one} == {key(r): r.get("text") for r in three})
    errors = {key(r): r["error"] for r in three if "error" in r}
    assert "empty" in errors['"empty"'] and "not JSON" in errors["null"]
    assert run(tmp_path / "bad.jsonl", "--batch-size", "0") == 2


@pytest.mark.parametrize("helper", [None, "llama-other"])
def test_the_cli_engine_prefills_newcomers_from_a_row_sharing_their_prefix(tok, models, plain_reference, helper):
    from assisted.generate_batch import make_engine
    from assisted.rows.row_inputs import Item, prepared

    instruction = "Extract the point as JSON with keys x and tag, nothing else. " * 3
    prompts = [f"{instruction}Doc {i}: {p}" for i, p in enumerate(PROMPTS)]
    refs = references(plain_reference, models["llama-eos"], tok, prompts, max_new_tokens=20, schema=POINT)
    engine = make_engine(models["llama-eos"], models.get(helper), tokenizer=tok, batch_size=2, share_prefix=True,
                         max_new_tokens=20)
    found = dict(engine.run(prepared((Item(i, "prompt", p, POINT, None, None) for i, p in enumerate(prompts)),
                                     engine.prepare)))
    same_rows([found[i] for i in range(len(prompts))], refs)
    prefilled = [found[i].stats.prefill_tokens for i in range(len(prompts))]
    whole = [len(tok(p)["input_ids"]) for p in prompts]
    assert prefilled[0] == whole[0] and all(n < w // 2 for n, w in zip(prefilled[1:], whole[1:]))  # all but the first

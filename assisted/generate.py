"""generate(): draft -> one target forward -> accept -> commit -> crop -> adapt k.

The loop keeps three things in step: `seq` (prompt + committed tokens), the target's KV cache
(always `seq[:-1]` after a step: the last committed token is fed with the next draft) and the
guide cursor (the state after `seq`). Drafts run ahead on a copy of the cursor.
"""

from __future__ import annotations

import time
from dataclasses import replace

import torch

import fsm
from assisted.caching import Held, plan_caches, static_caches
from assisted.closing import outcome, within_budget
from assisted.config import options, resolve
from assisted.policy.costs import StepCost, memorize, recall, recall_calibration
from assisted.policy.draft_policy import Policy, make_policy
from assisted.eos import eos_ids
from assisted.foreign import foreign_drafter, is_foreign
from assisted.inputs import Options, check_models, fit_positions, make_cursor, parse_value, prompt_ids
from assisted.prefix import PrefixCache
from assisted.result import GenerationResult, Recorder
from assisted.steps import accept, commit, judge, needs_forward
from assisted.stopping import Sink, Stops
from drafting.assistant import AssistantDrafter
from drafting.base import Cursor, Draft
from drafting.combined import CombinedSource
from drafting.foreign import ForeignSource
from drafting.kv_cache import KV, DynamicKV, input_device, output_device
from drafting.lookup import PromptLookup
from drafting.sampling import make_generator
from drafting.tree import Branch, check_tree_attention, move_leaf, tree_forward


def generate(
    model,
    assistant_model=None,
    *,
    tokenizer,
    assistant_tokenizer=None,
    prompt=None,
    messages=None,
    input_ids=None,
    schema=None,
    regex=None,
    generation_config=None,
    logits_processor=None,
    stopping_criteria=None,
    streamer=None,
    prefix_cache: PrefixCache | None = None,
    guide_options: dict | None = None,
    **kwargs,
) -> GenerationResult:
    """Generate from `model`, optionally drafted by `assistant_model` and constrained by a schema/regex.

    Greedy output is token-identical to plain (constrained) decoding of `model` with the same logits processors,
    and sampled output has exactly its distribution, whatever the assistant proposes (speculative sampling). Forced
    tokens of the constraint are appended without a model call (`coalesce=True`) or drafted as point masses that the
    target verifies (`coalesce=False`, exactly lossless).

    Parameters
    ----------
    model : transformers causal LM
        The target. Batch size 1; may be spread over devices with ``device_map``.
    assistant_model : transformers causal LM, optional
        A smaller model; it drafts under the constraint's mask. With the target's vocabulary it drafts target tokens;
        with its own (`assistant_tokenizer`) it drafts text under a guide compiled for its tokenizer, and the text,
        spelled in the target's tokens, is verified as point masses (`drafting.foreign`).
    tokenizer : transformers tokenizer
        The target's (shared by both models unless `assistant_tokenizer` is given).
    assistant_tokenizer : transformers tokenizer, optional
        The assistant's own tokenizer, as in transformers' universal assisted generation. When its vocabulary differs
        from the target's, the assistant drafts text: its drafts are the assistant's argmax (also when sampling),
        the logits processors apply to the target only, and `tree` and `generate_batch` are refused; with the same
        vocabulary it changes nothing.
    prompt, messages, input_ids : str | list[dict] | list[int] or tensor, exactly one
        A text, chat messages (formatted with the chat template), or token ids (shape (n,) or (1, n)).
    schema : pydantic class | dict | str, optional
        JSON Schema the output must satisfy (compact JSON).
    regex : str, optional
        Regex the output must fully match. At most one of `schema` and `regex`.
    generation_config : transformers.GenerationConfig, optional
        Options by transformers' names; default: ``model.generation_config`` (a hub model's sampling defaults and
        repetition penalty apply, as in ``model.generate``). Keyword arguments override it. A field set to something
        this function cannot honour raises ValueError naming it (see `assisted.config`).
    logits_processor : list of transformers.LogitsProcessor, optional
        Applied at every scored position with that position's prefix (prompt included), for the target and the
        assistant's drafts, before the constraint's mask and the warpers. They must be functions of their inputs.
    stopping_criteria : list of transformers.StoppingCriteria, optional
        Asked after every committed token with the ids so far and ``scores=None``; stop reason "criteria".
    streamer : transformers streamer, optional
        Gets the prompt, then each step's committed tokens as they are committed (never a token later rolled back),
        then ``end()``: `TextStreamer`, `TextIteratorStreamer`, or any object with ``put`` and ``end``.
    prefix_cache : assisted.PrefixCache, optional
        Reuse the target's and the assistant's KV caches for the longest token prefix this prompt shares with a kept
        earlier call, and keep this call's caches there (``stats.prefill_tokens`` counts what ran).
    guide_options : dict, optional
        How the schema is read, passed to `fsm.Guide.from_schema`: ``policy`` ("compact", the default: closed
        objects in schema order; "spec": any order, open objects, as validators read them), ``whitespace``,
        ``additional_properties``, ``property_order``, ``max_recursion_depth``, ``budget`` (`fsm.Budget`; the only
        option of a regex guide).
    **kwargs
        Generation options, by transformers' names where transformers has the concept (`assisted.config.DEFAULTS`
        lists where unset values differ from transformers' defaults):

        - ``max_new_tokens`` (256; or a config's ``max_length`` minus the prompt): budget of new tokens, EOS
          included; cut to what the models' position limits leave after the prompt (stop reason "length").
        - ``close_within_budget`` (False): with a schema or regex, allow a token only if, after it, a valid
          completion still fits in the tokens left (its shortest completion in bytes, one token each), so the
          output always ends complete within ``max_new_tokens``; stop reason "closed" where the budget tightened
          the mask (``stats.budget_tightened`` counts those positions). Lossless relative to plain constrained
          decoding with the same budget-aware mask. ValueError when even the shortest output does not fit. Stop
          strings and stopping criteria may still end an output before it closes.
        - ``do_sample``, ``temperature``, ``top_k`` (0 or None: none), ``top_p``: greedy or sampling; warpers apply
          after the mask, to target and assistant alike.
        - ``repetition_penalty``, ``no_repeat_ngram_size``: transformers' processors, applied like
          `logits_processor`.
        - ``num_assistant_tokens`` (5): model-drafted tokens per step at the start (forced tokens do not count).
        - ``num_assistant_tokens_schedule``: "auto" (default; "heuristic" when sampling with a `seed`, so that the
          seed reproduces the sample), "heuristic" (+2 after a fully accepted draft, -1 otherwise; each call starts
          afresh, as transformers' "heuristic_transient"), "constant". "auto" cuts drafts (up to 20) after each token
          where the expected time saved over plain decoding is largest, from measured costs and the assistant's
          calibrated confidence, and decodes plainly while that is faster (`assisted.policy.auto`); costs are kept per
          model pair and engine, calibration per pair and sampling setting (`assisted.reset_remembered_state()`).
        - ``prompt_lookup_num_tokens``: also draft copies of the prompt (what followed the latest occurrence of the
          text just written; free, verified), at most this many per step; 0: off. Default: on under "auto", which
          verifies a copy only where its measured acceptance pays for its row; off under fixed schedules.
        - ``eos_token_id`` (int or list; default: the tokenizer's and the model config's), ``stop_strings`` (str or
          list: generation ends at the token completing one, stop reason "stop_string").
        - ``cache_implementation`` ("dynamic" | "static") and ``cuda_graphs`` (bool): the KV caches; default static
          caches with steps replayed from CUDA graphs captured once per model and width (1, 2, 4, 8, 16, 32) on a CUDA
          target where possible (not with `tree` or `prefix_cache`, nor for sliding-window models), else dynamic;
          ``stats.cache_note`` says why a CUDA target fell back, ``stats.seconds.capture`` what capture cost.
        - ``seed``: seeds the sampling generators; None draws fresh entropy. Under "auto" the draft lengths follow
          measured timings, so a seeded sample can differ from run to run (its distribution does not).
        - ``coalesce`` (True): append forced tokens unverified (fast, the documented default) or verify them.
        - ``tree`` (False): also draft the assistant's runner-up where it is unsure (`drafting.tree.BRANCH_BELOW`),
          verified in the same forward; lossless like a chain. Needs `assistant_model`; not with logits processors.
          Under "auto" the leaf is verified only where its expected extra token pays for its row.
        - ``schedule``, ``prompt_lookup`` (bool): deprecated aliases of the two transformers names above.

    Returns
    -------
    GenerationResult
        ``text``, ``token_ids``, ``value``, ``stop_reason`` ("eos" | "final" | "length" | "closed" |
        "stop_string" | "criteria") and ``stats``. ``value`` is a validated instance of `schema` (pydantic, or
        `jsonschema` for a dict) or None: never a parsed prefix of a text the budget cut.

    Raises
    ------
    ValueError, TypeError
        For bad arguments, before any model call (fsm.SchemaError / fsm.RegexError for constraints).
    """
    settings = resolve(model, generation_config, kwargs)
    foreign = is_foreign(model, assistant_model, tokenizer, assistant_tokenizer)
    same = None if foreign else assistant_model  # an assistant that drafts target tokens
    _check_tree(settings.tree, model, assistant_model, foreign)
    vocab_size = check_models(model, same, tokenizer)
    ids = prompt_ids(tokenizer, prompt, messages, input_ids, vocab_size)
    opts = options(settings, len(ids), logits_processor)
    _check_tree_processors(settings.tree, opts)
    plan = plan_caches(model, same, settings.cache_implementation, settings.cuda_graphs, settings.tree, prefix_cache)
    opts = fit_positions(opts, len(ids), model, same)
    eos = eos_ids(model, tokenizer, settings.eos_token_id)
    cursor = within_budget(make_cursor(schema, regex, tokenizer, vocab_size, eos, guide_options), opts.max_new_tokens,
                           opts.close_within_budget)
    start = cursor.copy()
    stops = Stops(settings.stop_strings, stopping_criteria,
                  fsm.vocabulary_from_tokenizer(tokenizer, vocab_size).token_bytes, input_device(model))
    recorder = Recorder()
    assistant = None
    if same is not None:
        seed2 = None if opts.seed is None else opts.seed + 1
        assistant = AssistantDrafter(same, opts.warp, make_generator(output_device(same), seed2), opts.processors)
    lookup = PromptLookup(tokenizer, ids) if opts.prompt_lookup else None
    if foreign:  # drafts text, verified as the target's tokens (point masses)
        assistant = foreign_drafter(assistant_model, assistant_tokenizer, tokenizer, vocab_size, ids, prompt, messages,
                                    schema, regex, guide_options)
        source = ForeignSource(assistant, vocab_size, opts.warp.do_sample, lookup, output_device(model), opts.coalesce)
    else:
        source = CombinedSource(assistant, assistant is not None or opts.coalesce, vocab_size, opts.warp.do_sample,
                                lookup, output_device(model), coalesced=opts.coalesce)
    policy = make_policy(opts.schedule, opts.num_assistant_tokens, recall(model, assistant_model, plan.engine),
                         recall_calibration(model, assistant_model, opts.warp))
    sink = Sink(stops, streamer, ids)
    with torch.inference_mode(), static_caches(plan, model, same, len(ids) + opts.max_new_tokens) as held, sink:
        recorder.caches(plan.engine, plan.note, held.capture_seconds)
        cache, cached = _start_caches(prefix_cache, model, same, assistant, ids, held)
        new, stop = _decode(model, source, policy, cursor, ids, opts, recorder, cache, cached, settings.tree, sink)
        if prefix_cache is not None:
            prefix_cache.put(model, same, ids + new, cache.cache, assistant and assistant.cache)
    memorize(model, assistant_model, policy.learned(), policy.calibration(), opts.warp, plan.engine)
    text = tokenizer.decode(new, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    value = parse_value(schema, text, cursor.accepting())
    calls, seconds = (assistant.calls, assistant.seconds) if assistant else (0, 0.0)
    stats = recorder.freeze(len(new), calls, seconds, cursor.clock.seconds, policy.estimates(), len(ids) - cached)
    if foreign:
        stats = replace(stats, seconds=replace(stats.seconds, assistant_tokenizer=assistant.tokenizer_seconds))
    tightened, stop = outcome(start, new, stop)
    return GenerationResult(text, new, value, stop, replace(stats, budget_tightened=tightened))


def _start_caches(prefix_cache: PrefixCache | None, model, assistant_model, drafter, ids: list[int], held: Held
                  ) -> tuple[KV, int]:
    """(target cache, tokens it holds): the `held` static caches, empty ones, or a kept prefix of `ids` (the drafter
    gets its own too)."""
    if drafter is not None and held.assistant is not None:
        drafter.kv = held.assistant
    if held.target is not None:
        return held.target, 0
    if prefix_cache is None:
        return DynamicKV(model), 0
    if not isinstance(prefix_cache, PrefixCache):
        raise TypeError(f"prefix_cache must be an assisted.PrefixCache, got {type(prefix_cache).__name__}")
    cache, cached, helper_cache, helper_cached = prefix_cache.take(model, assistant_model, ids)
    if drafter is not None and helper_cache is not None:
        drafter.kv, drafter.cached = DynamicKV(assistant_model, helper_cache), helper_cached
    return DynamicKV(model, cache), cached


def _decode(model, source: CombinedSource, policy: Policy, cursor: Cursor, prompt: list[int], opts: Options,
            rec: Recorder, cache: KV, cached: int, tree: bool, sink: Sink):
    """The decode loop from a target cache holding `prompt[:cached]`; returns (new token ids, stop reason)."""
    generator = make_generator(output_device(model), opts.seed)
    seq, end = list(prompt), len(prompt) + opts.max_new_tokens  # target cache holds seq[:cached]
    if cursor.only_eos_left():
        return [], "final"
    while True:
        # 1. draft: forced runs (free) and up to k assistant tokens (k = 0: none), leaving room for the target's
        k, spent = policy.k, (rec.target_seconds, source.calls, source.seconds)
        lookup_k = min(policy.lookup_k, opts.lookup_tokens)
        draft = source.propose(seq, cursor.copy(), k, end - len(seq) - 1, policy.cut, lookup_k)
        # 2. verify: one target forward over [uncached committed tokens, *draft(, leaf)] -> (k+1 (+1), V)
        ids = seq[cached:] + list(draft.tokens)
        branch = source.branch(draft, cursor) if tree else None  # the runner-up where the assistant is unsure
        leaf = branch if branch is not None and policy.leaf_pays(draft, branch, len(ids)) else None  # if its row pays
        ids += [] if leaf is None else [leaf.token]
        if needs_forward(draft, len(seq), end, opts.coalesce):
            n, took, after = _verify(model, cache, ids, seq, draft, leaf, opts, generator, rec)
        else:  # only coalesced tokens up to the end: no forward
            n, took, after, ids = len(draft.tokens), False, [], []
        # 3. commit the accepted prefix, the taken leaf and the target's token; crop both caches to what was committed
        valid, before = len(seq) + n, len(seq)
        stop = commit(seq, cursor, [*draft.tokens[:n], *after], end, sink)
        sink.put(seq[before:])
        cached = min(valid + took, len(seq) - 1)
        cache.crop(cached)
        source.rollback(valid)
        # 4. adapt k on the judged model drafts and the step's timings, and record the step
        cost = StepCost(len(ids), rec.target_seconds - spent[0], source.calls - spent[1], source.seconds - spent[2])
        policy.update(*judge(draft.forced, n), cost, draft.model_confidence)
        _judge_runner_up(policy, branch, n, after)
        rec.step(k, draft.sources, n, opts.coalesce)
        rec.branch(leaf is not None, took, priced_out=branch is not None and leaf is None)
        if stop is not None:
            return seq[len(prompt) :], stop


def _verify(model, cache: KV, ids: list[int], seq: list[int], draft: Draft, leaf: Branch | None, opts: Options,
            generator, rec: Recorder) -> tuple[int, bool, list[int]]:
    """One timed target forward over `ids` (the chain, then the leaf if any) and the acceptance test:
    (accepted draft tokens, leaf taken, the tokens to commit after them).

    The tokens after them are the target's token, or a taken leaf and the target's token after it (unless the
    leaf ends in EOS or a forced run); a taken leaf's cache entries move to its committed position (the caller
    crops as usual). The clock stops after the acceptance's host sync, so on a GPU it times the forward's
    kernels, not their launch.
    """
    start, k = time.perf_counter(), len(draft.tokens)
    if leaf is None:
        logits = cache.run(ids, k + 1)  # (k+1, V)
    else:  # trees run on dynamic caches only (`assisted.caching.plan_caches`)
        logits = tree_forward(model, cache.cache, len(seq), ids, leaf)  # (k+2, V): row k+1 is the leaf's
    found = accept(logits, seq, draft, leaf, opts, generator).tolist()  # the step's one host sync
    n, took, token = found if leaf is not None else (found[0], 0, found[1])  # [n, token] on a chain
    rec.target_passes += 1
    rec.target_seconds += time.perf_counter() - start
    if not took:
        return n, False, [token]
    move_leaf(cache.cache, len(seq) + k, len(seq) + leaf.at)
    return n, True, [leaf.token, *([token] if leaf.bonus else [])]


def _check_tree_processors(tree: bool, opts: Options) -> None:
    if tree and opts.processors:
        raise ValueError("tree=True cannot apply logits processors (repetition_penalty, logits_processor=...): "
                         "a leaf's row has another prefix than its chain row")


def _check_tree(tree, model, assistant_model, foreign: bool = False) -> None:
    """`tree` is a bool, and True only with an assistant of the target's vocabulary and a target whose attention
    takes a tree mask."""
    if not isinstance(tree, bool):
        raise TypeError(f"tree must be a bool, got {type(tree).__name__} {tree!r}")
    if tree and assistant_model is None:
        raise ValueError("tree=True needs an assistant_model: the branch is the assistant's runner-up")
    if tree and foreign:
        raise ValueError("tree=True needs an assistant with the target's vocabulary: the branch is the runner-up of "
                         "the assistant's distribution over the target's tokens")
    if tree:
        check_tree_attention(model)


def _judge_runner_up(policy: Policy, branch: Branch | None, n: int, after: list[int]) -> None:
    """Tell the policy whether the target, rejecting the branch's sibling, picked the runner-up (verified or not)."""
    if branch is not None and n == branch.at:
        policy.observe_leaf(branch.confidence, after[0] == branch.token)

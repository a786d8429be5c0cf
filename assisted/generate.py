"""generate(): the decode engine (`assisted.rows.engine`) with one row.

Every argument is checked before any model call, by the setup every entry point shares (`assisted.call`); then the
row is set up as every row of a batch is (`assisted.rows.row_inputs.prepare_row`) and decoded on this call's caches:
dynamic, a kept prefix (`PrefixCache`), or static caches whose steps may be replayed from captured CUDA graphs
(`assisted.caching`). The loop keeps three things in step: the row's sequence (prompt + committed tokens), the
target's KV cache (`seq[:-1]` after a step: the last committed token is fed with the next draft) and the guide cursor
(the state after the sequence); drafts run ahead on a copy of the cursor.
"""

from __future__ import annotations

import torch

from assisted.caching import plan_caches, static_caches
from assisted.call import prepare_call
from assisted.inputs import one_prompt
from assisted.policy.draft_policy import make_policy  # a row's policy; a test scripts it here
from assisted.prefix import PrefixCache
from assisted.result import GenerationResult
from assisted.rows.engine import verify as _verify  # the step's verification; a test injects a failure here
from assisted.rows.row_inputs import Item
from assisted.stopping import check_streamer
from drafting.row_kv import OneRow


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
        spelled in the target's tokens, is verified as point masses (`drafting.foreign_drafter`).
    tokenizer : transformers tokenizer
        The target's (shared by both models unless `assistant_tokenizer` is given).
    assistant_tokenizer : transformers tokenizer, optional
        The assistant's own tokenizer, as in transformers' universal assisted generation. When its vocabulary differs
        from the target's, the assistant drafts text: its drafts are the assistant's argmax (also when sampling), the
        logits processors apply to the target only, and `tree` is refused; with the same vocabulary it changes
        nothing.
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
    call = prepare_call(model, assistant_model, tokenizer=tokenizer, assistant_tokenizer=assistant_tokenizer,
                        generation_config=generation_config, kwargs=kwargs, logits_processor=logits_processor,
                        stopping_criteria=stopping_criteria, guide_options=guide_options, prefix_cache=prefix_cache)
    settings, same = call.settings, call.same
    item = Item(0, *one_prompt(prompt, messages, input_ids), schema, regex, settings.seed, streamer)
    check_streamer(streamer)
    plan = plan_caches(model, same, settings.cache_implementation, settings.cuda_graphs, settings.tree, prefix_cache)
    inp = call.prepare(item)
    with torch.inference_mode(), static_caches(plan, model, same, len(inp.ids) + inp.opts.max_new_tokens) as held:
        helper = None if call.helper is None else OneRow(call.helper, held.assistant)
        engine = call.engine(OneRow(model, held.target), helper, batch_size=1, memory=plan.engine,
                             caches=(plan.engine, plan.note, held.capture_seconds), prefix_cache=prefix_cache,
                             verify=_verify, batch=False, make_policy=make_policy)
        ((_, result),) = engine.run([inp])
    return result

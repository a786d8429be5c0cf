"""generate(): the decode engine (`assisted.rows.engine`) with one row.

Every argument is checked here, before any model call; then the row is set up as every row of a batch is
(`assisted.rows.row_inputs.prepare_row`) and decoded on this call's caches: dynamic, a kept prefix (`PrefixCache`), or
static caches whose steps may be replayed from captured CUDA graphs (`assisted.caching`). The loop keeps three things
in step: the row's sequence (prompt + committed tokens), the target's KV cache (`seq[:-1]` after a step: the last
committed token is fed with the next draft) and the guide cursor (the state after the sequence); drafts run ahead on a
copy of the cursor.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from assisted.caching import plan_caches, static_caches
from assisted.config import resolve
from assisted.eos import eos_ids
from assisted.foreign import foreign_setup, is_foreign
from assisted.inputs import Options, check_models, one_prompt
from assisted.policy.auto import AutoConfig
from assisted.policy.costs import recall, recall_calibration
from assisted.policy.draft_policy import make_policy
from assisted.policy.prices import SharedPrices
from assisted.prefix import PrefixCache
from assisted.result import GenerationResult
from assisted.rows.engine import Engine
from assisted.rows.engine import verify as _verify  # the step's verification; a test injects a failure here
from assisted.rows.row import Setup
from assisted.rows.row_inputs import Guides, Item, prepare_row, token_bytes
from assisted.stopping import Stops, check_streamer
from drafting.kv_cache import input_device
from drafting.row_kv import OneRow
from drafting.tree import check_tree_attention


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
    settings = resolve(model, generation_config, kwargs)
    foreign = is_foreign(model, assistant_model, tokenizer, assistant_tokenizer)
    same = None if foreign else assistant_model  # an assistant that drafts target tokens (the engine's)
    check_tree(settings.tree, model, assistant_model, foreign)
    vocab_size = check_models(model, same, tokenizer)
    item = Item(0, *one_prompt(prompt, messages, input_ids), schema, regex, settings.seed, streamer)
    plan = plan_caches(model, same, settings.cache_implementation, settings.cuda_graphs, settings.tree, prefix_cache)
    guides = Guides(tokenizer, vocab_size, eos_ids(model, tokenizer, settings.eos_token_id), guide_options)
    helper = foreign_setup(assistant_model, assistant_tokenizer, tokenizer, vocab_size, guide_options) if foreign \
        else None
    inp = prepare_row(item, model, same, tokenizer, vocab_size, settings, logits_processor, guides, helper)
    check_tree_processors(settings.tree, inp.opts)
    stops = Stops(settings.stop_strings, stopping_criteria, token_bytes(tokenizer, vocab_size), input_device(model))
    check_streamer(streamer)
    if prefix_cache is not None and not isinstance(prefix_cache, PrefixCache):
        raise TypeError(f"prefix_cache must be an assisted.PrefixCache, got {type(prefix_cache).__name__}")
    prices = SharedPrices(AutoConfig(), recall(model, assistant_model, plan.engine)) if inp.opts.schedule == "auto" \
        else None

    def policy_for(opts: Options):
        return make_policy(opts.schedule, opts.num_assistant_tokens, recall(model, assistant_model, plan.engine),
                           recall_calibration(model, assistant_model, opts.warp), prices)

    setup = Setup(model, assistant_model, tokenizer, vocab_size, inp.opts.warp, stops, settings.tree,
                  memory=plan.engine)
    with torch.inference_mode(), static_caches(plan, model, same, len(inp.ids) + inp.opts.max_new_tokens) as held:
        setup = replace(setup, caches=(plan.engine, plan.note, held.capture_seconds))
        helper = None if same is None else OneRow(same, held.assistant)
        engine = Engine(setup, OneRow(model, held.target), helper, 1, policy_for, prices, prefix_cache, verify=_verify,
                        batch=False)
        ((_, result),) = engine.run([inp])
    return result


def check_tree_processors(tree: bool, opts: Options) -> None:
    if tree and opts.processors:
        raise ValueError("tree=True cannot apply logits processors (repetition_penalty, logits_processor=...): "
                         "a leaf's row has another prefix than its chain row")


def check_tree(tree, model, assistant_model, foreign: bool = False) -> None:
    """`tree` is a bool, and True only with an assistant of the target's vocabulary (not `foreign`) and a target whose
    attention takes a tree mask."""
    if not isinstance(tree, bool):
        raise TypeError(f"tree must be a bool, got {type(tree).__name__} {tree!r}")
    if tree and assistant_model is None:
        raise ValueError("tree=True needs an assistant_model: the branch is the assistant's runner-up")
    if tree and foreign:
        raise ValueError("tree=True needs an assistant with the target's vocabulary: the branch is the runner-up of "
                         "the assistant's distribution over the target's tokens")
    if tree:
        check_tree_attention(model)

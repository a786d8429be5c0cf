"""generate_batch(): B rows decoded at once, each exactly as generate() would decode it alone.

The arguments of the whole batch are checked here, before any model call; each row's own inputs (prompt,
budget, constraint) when it is admitted, so that a bad row gets its own error (`assisted.rows.batch_rows`). The loop
is `assisted.rows.batch_engine`; the caches `drafting.batch_kv`; drafting `drafting.batch_draft`.
"""

from __future__ import annotations

from collections.abc import Iterator

from assisted.rows.batch_engine import Engine
from assisted.rows.batch_rows import Guides, batch_eos, check_batch_size, check_settings, items_of, refuse_unsupported
from assisted.config import Settings, options, resolve
from assisted.foreign import is_foreign
from assisted.inputs import MAX_SEED, check_int, check_guide_options, check_models
from assisted.result import GenerationResult
from drafting.batch_kv import check_batch_model


def generate_batch(model, assistant_model=None, *, tokenizer, prompts=None, messages=None, input_ids=None,
                   schema=None, regex=None, batch_size: int = 8, generation_config=None, logits_processor=None,
                   guide_options: dict | None = None, **kwargs) -> list[GenerationResult]:
    """Generate for every row of a batch; one GenerationResult per row, in input order.

    Each row's output is what `assisted.generate` gives for that row alone with the same options: greedy
    token-identical to plain (constrained) decoding of `model`, sampled with exactly its distribution, whatever
    the other rows in the batch draft, accept, or when they finish. Rows are decoded `batch_size` at a time; a
    row that stops leaves the batch and the next waiting row takes its slot.

    Parameters
    ----------
    model, assistant_model, tokenizer
        As for `assisted.generate` (an `assistant_tokenizer` with another vocabulary is refused). Both models need an
        attention that applies a custom 4D mask ("sdpa" or "eager") and no sliding-window layers.
    prompts, messages, input_ids : list, exactly one
        One entry per row: texts, chat-message lists, or token-id lists (or 1-D tensors).
    schema, regex : one, or a list with one per row (None: unconstrained), at most one of the two
        Rows with the same constraint share one compiled guide.
    batch_size : int
        The most rows decoded at once (the rows of KV cache held); default 8.
    generation_config, logits_processor, guide_options, **kwargs
        As for `assisted.generate`, for every row. ``seed`` may also be a list (one per row); a row seeded with s
        samples as ``generate(..., seed=s)`` draws (target s, assistant s + 1), alone or in any batch. The
        schedule is "heuristic" (default) or "constant"; "auto", `tree`, `streamer`, `prefix_cache`,
        `stopping_criteria`, static caches and CUDA graphs are refused with a ValueError.

    Returns
    -------
    list of GenerationResult
        In input order. A row that could not be generated (empty prompt, too long for the models' positions,
        a schema that does not compile, ...) has ``error`` set and ``stop_reason == "error"``; the others go on.
        ``result.stats`` is the row's own (``target_forward_passes`` counts the batched forwards it took part
        in; ``stats.latency_seconds`` is the wall time from its admission to its finish); ``result.batch`` is the
        run's `BatchStats`, shared by all rows.

    Raises
    ------
    ValueError, TypeError
        For a bad batch-level argument, before any model call.
    """
    found = dict(generate_batch_iter(model, assistant_model, tokenizer=tokenizer, prompts=prompts, messages=messages,
                                     input_ids=input_ids, schema=schema, regex=regex, batch_size=batch_size,
                                     generation_config=generation_config, logits_processor=logits_processor,
                                     guide_options=guide_options, **kwargs))
    results = [found[i] for i in range(len(found))]
    return results


def generate_batch_iter(model, assistant_model=None, *, tokenizer, prompts=None, messages=None, input_ids=None,
                        schema=None, regex=None, batch_size: int = 8, generation_config=None, logits_processor=None,
                        guide_options: dict | None = None, **kwargs) -> Iterator[tuple[int, GenerationResult]]:
    """`generate_batch` as an iterator of ``(index, result)`` in the order rows finish (every index once).

    The arguments are checked when this is called, before any model call; decoding starts at the first `next`.
    """
    seed = kwargs.pop("seed", None)
    items = items_of(prompts, messages, input_ids, schema, regex, seed)
    for item in items:
        if item.seed is not None:
            check_int("seed", item.seed, low=0, high=MAX_SEED)
    engine = make_engine(model, assistant_model, tokenizer=tokenizer, batch_size=batch_size,
                         generation_config=generation_config, logits_processor=logits_processor,
                         guide_options=guide_options, constrained=any(i.schema is not None or i.regex is not None
                                                                      for i in items), **kwargs)
    return engine.run(items)


def make_engine(model, assistant_model=None, *, tokenizer, batch_size: int = 8, generation_config=None,
                logits_processor=None, guide_options: dict | None = None, constrained: bool = True,
                share_prefix: bool = False, assistant_tokenizer=None, **kwargs) -> Engine:
    """The batch engine after every batch-level check (the CLI feeds it `Item`s as it reads documents).

    `share_prefix` (the CLI's default): a newcomer copies the KV entries of the longest prompt prefix a row in the
    batch caches and prefills only the rest, like `PrefixCache` for one row at a time. Its entries then come from
    another chunking of the same forward, equal up to float rounding: off in `generate_batch`, whose rows are
    decoded exactly as alone. An `assistant_tokenizer` whose vocabulary differs from the target's is refused: the rows
    engine drafts target tokens only (`generate` drafts with such an assistant).
    """
    if is_foreign(model, assistant_model, tokenizer, assistant_tokenizer):
        raise ValueError("generate_batch cannot draft with an assistant of another vocabulary yet (its rows engine "
                         "drafts target tokens): call generate() per row, or pass an assistant with the target's "
                         "tokenizer")
    kwargs.pop("seed", None)  # per row, on the items
    batch_size = check_batch_size(batch_size)
    refuse_unsupported(kwargs)
    vocab_size = check_models(model, assistant_model, tokenizer)
    settings = resolve(model, generation_config, kwargs)
    schedule = check_settings(settings)
    settings = Settings(settings.values | {"num_assistant_tokens_schedule": schedule, "seed": None},
                        settings.max_length)
    options(settings, 0, logits_processor)  # every option checked once, before any model call
    check_batch_model(model)
    if assistant_model is not None:
        check_batch_model(assistant_model, "assistant_model")
    if guide_options is not None:
        if not constrained:
            raise ValueError("guide_options need a schema or a regex")
        check_guide_options(guide_options, True)
    guides = Guides(tokenizer, vocab_size, batch_eos(model, tokenizer, settings), guide_options)
    return Engine(model, assistant_model, tokenizer, settings, logits_processor, guides, batch_size, vocab_size,
                  share_prefix)



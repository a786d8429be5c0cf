"""generate_batch(): the decode engine (`assisted.rows.engine`) with B rows and refill, each row decoded exactly as
generate() decodes it alone.

The arguments of the whole batch are checked before any model call, by the setup every entry point shares
(`assisted.call`) and the batch's own checks here; each row's own inputs (prompt, budget, constraint) when it is
admitted, so that a bad row gets its own error (`assisted.rows.row_inputs`). The caches are `drafting.batch_kv.BatchKV`.
"""

from __future__ import annotations

from collections.abc import Iterator

from assisted.call import prepare_call
from assisted.inputs import check_guide_options
from structspec_ops.attention import ATTENTION
from assisted.prefix import PrefixCache
from assisted.result import GenerationResult
from assisted.rows.engine import Engine
from assisted.rows.row_inputs import check_batch_size, items_of, prepared
from drafting.batch_kv import BatchKV, check_batch_model

ENGINE = "batch"  # the name costs learned on batch caches are kept under (`assisted.policy.costs.memorize`)


def generate_batch(model, assistant_model=None, *, tokenizer, prompts=None, messages=None, input_ids=None,
                   schema=None, regex=None, batch_size: int = 8, generation_config=None, logits_processor=None,
                   stopping_criteria=None, streamer=None, prefix_cache: PrefixCache | None = None,
                   share_prefix: bool | None = None, guide_options: dict | None = None,
                   **kwargs) -> list[GenerationResult]:
    """Generate for every row of a batch; one GenerationResult per row, in input order.

    Each row's output is what `assisted.generate` gives for that row alone with the same options: greedy
    token-identical to plain (constrained) decoding of `model`, sampled with exactly its distribution, whatever
    the other rows in the batch draft, accept, or when they finish. Rows are decoded `batch_size` at a time; a
    row that stops leaves the batch and the next waiting row takes its slot.

    Parameters
    ----------
    model, assistant_model, tokenizer
        As for `assisted.generate`. Both models need an attention that applies a custom 4D mask ("sdpa", "eager" or
        the int8 target's "row_invariant") and no sliding-window layers; ``assistant_tokenizer=`` as there (an
        assistant with another vocabulary keeps each row's text in its own tokens, and the rows that need its next
        token at once get it from one batched forward, as with the target's vocabulary).
    prompts, messages, input_ids : list, exactly one
        One entry per row: texts, chat-message lists, or token-id lists (or 1-D tensors).
    schema, regex : one, or a list with one per row (None: unconstrained), at most one of the two
        Rows with the same constraint share one compiled guide.
    batch_size : int
        The most rows decoded at once (the rows of KV cache held); default 8.
    streamer : list, optional
        One streamer (or None) per row: each gets its row's prompt, committed tokens and ``end()``.
    stopping_criteria : list of transformers.StoppingCriteria, optional
        Asked after every committed token of every row with that row's ids (1, L) and ``scores=None``.
    prefix_cache : assisted.PrefixCache, optional
        A newcomer reuses the longest prompt prefix a kept generation holds, and each finished row's caches are kept
        (as for `generate`; equal to a fresh prefill up to float rounding, bitwise on the int4 and int8 targets).
    share_prefix : bool, optional
        A newcomer copies the KV entries of the longest prompt prefix a row in the batch caches (a shared system
        prompt or few-shot block is prefilled once) and prefills only the rest. Those entries come from another
        chunking of the same forward: equal up to float rounding on a float target, bitwise on a row-invariant one
        (the int4 and int8 targets). Default: on where that is exact (a row-invariant target), else off.
    generation_config, logits_processor, guide_options, **kwargs
        As for `assisted.generate`, for every row: the schedule ("auto" by default, priced for the batch: drafts are
        worth their positions in the shared forward, `assisted.policy.prices`), prompt lookup, coalescing, `tree`,
        `close_within_budget`, processors and penalties, stop strings. ``seed`` may also be a list (one per row); a
        row seeded with s samples as ``generate(..., seed=s)`` draws (target s, assistant s + 1), alone or in any
        batch (a seeded sampling row takes the "heuristic" schedule by default, as alone). Static caches and CUDA
        graphs serve one row: ``cache_implementation="static"`` and ``cuda_graphs=True`` raise ValueError.

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
                                     stopping_criteria=stopping_criteria, streamer=streamer, prefix_cache=prefix_cache,
                                     share_prefix=share_prefix, guide_options=guide_options, **kwargs))
    return [found[i] for i in range(len(found))]


def generate_batch_iter(model, assistant_model=None, *, tokenizer, prompts=None, messages=None, input_ids=None,
                        schema=None, regex=None, batch_size: int = 8, streamer=None, **kwargs
                        ) -> Iterator[tuple[int, GenerationResult]]:
    """`generate_batch` as an iterator of ``(index, result)`` in the order rows finish (every index once).

    The arguments are checked when this is called, before any model call; decoding starts at the first `next`.
    `prompts` / `messages` / `input_ids` may also be an iterator, read as rows are admitted (the `structspec batch`
    command's documents; its rows then share one schema / regex / seed and no streamer), and a `prompts` entry may be
    a chat (a list of {role, content} messages), as transformers' text-generation pipeline takes them.
    """
    items = items_of(prompts, messages, input_ids, schema, regex, kwargs.pop("seed", None), streamer)
    constrained = any(c is not None for c in (*_listed(schema), *_listed(regex)))
    engine = make_engine(model, assistant_model, tokenizer=tokenizer, batch_size=batch_size, constrained=constrained,
                         **kwargs)
    return engine.run(prepared(items, engine.prepare))


def _listed(value) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def make_engine(model, assistant_model=None, *, tokenizer, batch_size: int = 8, generation_config=None,
                logits_processor=None, stopping_criteria=None, prefix_cache: PrefixCache | None = None,
                share_prefix: bool | None = None, guide_options: dict | None = None, constrained: bool = True,
                assistant_tokenizer=None, **kwargs) -> Engine:
    """The batch engine after every batch-level check (`generate_batch_iter`'s); `engine.run(prepared(items,
    engine.prepare))` decodes `assisted.rows.row_inputs.Item`s. An assistant with another tokenizer
    (`assistant_tokenizer`) drafts on batch caches too, every asking row's token in one forward."""
    kwargs.pop("seed", None)  # per row, on the items
    batch_size = check_batch_size(batch_size)
    if "prompt" in kwargs:
        raise ValueError("generate_batch() does not take prompt=: pass prompts= (a list)")
    call = prepare_call(model, assistant_model, tokenizer=tokenizer, assistant_tokenizer=assistant_tokenizer,
                        generation_config=generation_config, kwargs=kwargs, logits_processor=logits_processor,
                        stopping_criteria=stopping_criteria, guide_options=guide_options, prefix_cache=prefix_cache)
    settings = call.settings
    if settings.cache_implementation not in (None, "dynamic") or settings.cuda_graphs:
        raise ValueError("generate_batch() decodes on dynamic batch caches (rows of different lengths): static caches "
                         f"and captured steps serve one row (cache_implementation={settings.cache_implementation!r}, "
                         f"cuda_graphs={settings.cuda_graphs!r}); call generate() per row for them")
    for name, m in (("model", model), ("assistant_model", call.helper)):
        if m is not None:
            check_batch_model(m, name)
    if guide_options is not None:
        if not constrained:
            raise ValueError("guide_options need a schema or a regex")
        check_guide_options(guide_options, True)
    if share_prefix is not None and not isinstance(share_prefix, bool):
        raise TypeError(f"share_prefix must be True, False or None, got {share_prefix!r}")
    exact = getattr(model.config, "_attn_implementation", None) == ATTENTION  # row-invariant: a shared prefix is exact
    helper = None if call.helper is None else BatchKV(call.helper, lazy=True)  # a row's context fed at its first draft
    target = BatchKV(model, defer_after_prefix=True)  # rows sharing a prefix feed their rests in their first forward
    return call.engine(target, helper, batch_size=batch_size, memory=ENGINE, prefix_cache=prefix_cache,
                       share_prefix=exact if share_prefix is None else share_prefix)

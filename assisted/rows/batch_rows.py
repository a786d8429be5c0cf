"""The user boundary of generate_batch(): batch-level arguments checked before any model call, and each row's
own inputs (prompt, budget, constraint) checked when the row is admitted, so that a bad row gets its own error.

Guides are compiled once per distinct schema (or regex) and copied per row; a schema that fails to compile
fails every row that names it, with the same message, and is not compiled again.
"""

from __future__ import annotations

import json
import numbers
from dataclasses import dataclass, replace
from typing import Any

import fsm
from assisted.config import Settings, options
from assisted.eos import eos_ids
from assisted.closing import within_budget
from assisted.inputs import Options, fit_positions, make_cursor, prompt_ids
from drafting.base import Cursor

UNSUPPORTED = {  # generate() arguments a batch cannot honour, and why
    "streamer": "one streamer cannot follow several rows; use generate_batch_iter to get rows as they finish",
    "prefix_cache": "rows are prefilled on the batch's own caches",
    "stopping_criteria": "criteria see one sequence; pass stop_strings",
    "prompt": "pass prompts= (a list)",
}


@dataclass(frozen=True)
class Item:
    """One input row as given: its form ("prompt", "messages" or "input_ids") and value."""

    index: int
    form: str
    value: Any
    schema: Any
    regex: str | None
    seed: int | None


@dataclass(frozen=True)
class RowInput:
    """A row ready to decode: prompt ids, its options and a fresh cursor over its (shared) guide."""

    item: Item
    ids: list[int]
    opts: Options
    cursor: Cursor


def refuse_unsupported(kwargs: dict) -> None:
    """ValueError for options generate() takes but a batch cannot honour (before `resolve` reads the rest)."""
    for name, why in UNSUPPORTED.items():
        if name in kwargs:
            raise ValueError(f"generate_batch() does not take {name}=: {why}")
    if kwargs.get("tree"):
        raise ValueError("generate_batch() does not draft trees: tree=True is single-row only")
    if kwargs.get("cuda_graphs"):
        raise ValueError("generate_batch() runs dynamic batch caches: cuda_graphs=True is single-row only")
    for name in ("tree", "cuda_graphs"):
        kwargs.pop(name, None)


def check_settings(settings: Settings) -> str:
    """The batch's schedule (default "heuristic"); ValueError for options the batched loop cannot honour."""
    if settings.cache_implementation not in (None, "dynamic"):
        raise ValueError(f"generate_batch() runs on its own dynamic batch caches, not cache_implementation="
                         f"{settings.cache_implementation!r}")
    if not isinstance(settings.close_within_budget, bool):
        raise TypeError(f"close_within_budget must be a bool, got {settings.close_within_budget!r}")
    schedule = settings.num_assistant_tokens_schedule
    if schedule == "auto":
        raise ValueError("generate_batch() does not run the 'auto' schedule (its cost model prices one row per "
                         "forward); pass num_assistant_tokens_schedule='heuristic' or 'constant'")
    return schedule or "heuristic"


def items_of(prompts, messages, input_ids, schema, regex, seed) -> list[Item]:
    """The rows as given, with one schema / regex / seed each; ValueError/TypeError for batch-level mistakes."""
    forms = [(name, value) for name, value in (("prompt", prompts), ("messages", messages),
                                                ("input_ids", input_ids)) if value is not None]
    if len(forms) != 1:
        raise ValueError(f"pass exactly one of prompts, messages, input_ids; got "
                         f"{', '.join(n + 's' if n == 'prompt' else n for n, _ in forms) or 'none'}")
    form, values = forms[0]
    if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__len__"):
        raise TypeError(f"{form if form != 'prompt' else 'prompts'} must be a list (one entry per row), "
                        f"got {type(values).__name__}")
    values = list(values)
    if schema is not None and regex is not None:
        raise ValueError("pass at most one of schema and regex, not both")
    schemas = _per_row("schema", schema, len(values))
    regexes = _per_row("regex", regex, len(values))
    seeds = _per_row("seed", seed, len(values))
    return [Item(i, form, v, s, r, d) for i, (v, s, r, d) in enumerate(zip(values, schemas, regexes, seeds))]


def _per_row(name: str, value, rows: int) -> list:
    if not isinstance(value, (list, tuple)):
        return [value] * rows
    if len(value) != rows:
        raise ValueError(f"{name} is a list of {len(value)} but there are {rows} rows: pass one, or one per row")
    return list(value)


def check_batch_size(batch_size) -> int:
    if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    return int(batch_size)


class Guides:
    """One compiled cursor per distinct constraint; rows get copies with their own clocks."""

    def __init__(self, tokenizer, vocab_size: int, eos: frozenset[int], guide_options: dict | None):
        self.tokenizer, self.vocab_size, self.eos, self.guide_options = tokenizer, vocab_size, eos, guide_options
        self.built: dict = {}  # key -> Cursor, or the exception its compilation raised
        self.compiled = 0  # constraints compiled (each at most once)

    def cursor(self, schema, regex) -> Cursor:
        key = _key(schema, regex)
        if key not in self.built:
            try:
                self.built[key] = make_cursor(schema, regex, self.tokenizer, self.vocab_size, self.eos,
                                              self.guide_options)
                self.compiled += schema is not None or regex is not None
            except (ValueError, TypeError) as error:
                self.built[key] = error
        found = self.built[key]
        if isinstance(found, Exception):
            raise found
        return Cursor(None if found.guide is None else found.guide.copy(), found.eos)


def _key(schema, regex):
    if isinstance(schema, dict):
        return "schema", json.dumps(schema, sort_keys=True, default=repr)
    try:
        hash(schema)
    except TypeError:
        return "id", id(schema)
    return ("schema", schema) if schema is not None else ("regex", regex)


def prepare_row(item: Item, model, assistant_model, tokenizer, vocab_size: int, settings: Settings,
                logits_processor, guides: Guides) -> RowInput:
    """The row's ids, options and cursor; ValueError/TypeError (this row's error) when it cannot be generated."""
    kwargs = {item.form: item.value}
    ids = prompt_ids(tokenizer, kwargs.get("prompt"), kwargs.get("messages"), kwargs.get("input_ids"), vocab_size)
    opts = replace(options(settings, len(ids), logits_processor), seed=item.seed)
    opts = fit_positions(opts, len(ids), model, assistant_model)
    cursor = within_budget(guides.cursor(item.schema, item.regex), opts.max_new_tokens, opts.close_within_budget)
    return RowInput(item, ids, opts, cursor)


def batch_eos(model, tokenizer, settings: Settings) -> frozenset[int]:
    return eos_ids(model, tokenizer, settings.eos_token_id)


def token_bytes(tokenizer, vocab_size: int) -> tuple[bytes, ...]:
    return fsm.vocabulary_from_tokenizer(tokenizer, vocab_size).token_bytes

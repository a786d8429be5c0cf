"""Each row's inputs, set up one way for `generate` (one row) and `generate_batch` (each row at its admission): the
prompt's ids, the options (with the row's own seed), the budget cut to the models' positions and the constraint's
cursor, closed within the budget where asked. A bad row raises here, before any model call: `generate` passes the
error on, a batch gives that row its own error and goes on.

Guides are compiled once per distinct schema (or regex) and copied per row; a schema that fails to compile
fails every row that names it, with the same message, and is not compiled again.
"""

from __future__ import annotations

import json
import numbers
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import fsm
from assisted.close_within_budget import within_budget
from assisted.config import Settings, options
from assisted.inputs import MAX_SEED, Options, check_int, fit_positions, make_cursor, prompt_ids
from assisted.stopping import check_streamer
from drafting.base import Cursor


@dataclass(frozen=True)
class Item:
    """One input row as given: its form ("prompt", "messages" or "input_ids") and value."""

    index: int
    form: str
    value: Any
    schema: Any
    regex: str | None
    seed: int | None
    streamer: Any = None  # gets this row's prompt, its committed tokens, then end() (transformers' streamer API)


@dataclass(frozen=True)
class RowInput:
    """A row ready to decode: prompt ids, its options and a fresh cursor over its (shared) guide."""

    item: Item
    ids: list[int]
    opts: Options
    cursor: Cursor
    began: float  # perf_counter when it was set up: its stats' wall time starts there
    foreign: Any = None  # an assistant with another tokenizer: its prompt and guide (`assisted.foreign.ForeignRow`)


@dataclass(frozen=True)
class RowError:
    """A row that could not be set up, and why (one line)."""

    index: int
    message: str


def prepare_row(item: Item, model, assistant_model, tokenizer, vocab_size: int, settings: Settings,
                logits_processor, guides: Guides, foreign=None) -> RowInput:
    """The row's ids, options and cursor (and with `foreign`, an `assisted.foreign.Foreign`, the assistant's prompt and
    guide); ValueError/TypeError (this row's error) when it cannot be generated."""
    began = time.perf_counter()
    kwargs = {item.form: item.value}
    ids = prompt_ids(tokenizer, kwargs.get("prompt"), kwargs.get("messages"), kwargs.get("input_ids"), vocab_size)
    opts = options(Settings(settings.values | {"seed": item.seed}, settings.max_length), len(ids), logits_processor)
    opts = fit_positions(opts, len(ids), model, assistant_model)
    cursor = within_budget(guides.cursor(item.schema, item.regex), opts.max_new_tokens, opts.close_within_budget)
    return RowInput(item, ids, opts, cursor, began, None if foreign is None else foreign.row(item, ids, tokenizer))


def prepared(items, prepare) -> Any:
    """`prepare(item)` for each item, as the engine admits it (lazily): a `RowInput`, or a `RowError` for a bad row."""
    for item in items:
        try:
            yield prepare(item)
        except (ValueError, TypeError) as error:
            yield RowError(item.index, " ".join(str(error).split("\n")))


def items_of(prompts, messages, input_ids, schema, regex, seed, streamer=None) -> Iterable[Item]:
    """The rows as given, with one schema / regex / seed / streamer each; ValueError/TypeError for batch-level
    mistakes.

    Rows given as a list are checked here at once; rows given as an iterator (the `structspec` command's documents) are
    read as the engine admits them, and then share one schema / regex / seed and no streamer. A `prompts` entry that is
    a list of {role, content} messages is read as a chat (as transformers' text-generation pipeline reads its inputs).
    """
    forms = [(name, value) for name, value in (("prompt", prompts), ("messages", messages),
                                                ("input_ids", input_ids)) if value is not None]
    if len(forms) != 1:
        raise ValueError(f"pass exactly one of prompts, messages, input_ids; got "
                         f"{', '.join(n + 's' if n == 'prompt' else n for n, _ in forms) or 'none'}")
    form, values = forms[0]
    if isinstance(values, (str, bytes, dict)) or not isinstance(values, Iterable):
        raise TypeError(f"{form if form != 'prompt' else 'prompts'} must be a list (one entry per row), "
                        f"got {type(values).__name__}")
    if schema is not None and regex is not None:
        raise ValueError("pass at most one of schema and regex, not both")
    if streamer is not None and not isinstance(streamer, (list, tuple)):
        raise ValueError("streamer= in a batch is a list with one streamer (or None) per row: one streamer cannot "
                         "follow several rows (generate_batch_iter yields rows as they finish)")
    if not hasattr(values, "__len__"):
        return _lazy_items(form, values, schema, regex, seed, streamer)
    values = list(values)
    schemas = _per_row("schema", schema, len(values))
    regexes = _per_row("regex", regex, len(values))
    seeds = [_seed(s) for s in _per_row("seed", seed, len(values))]
    streamers = [_streamer(s) for s in _per_row("streamer", streamer, len(values))]
    return [Item(i, _form(form, row[0]), *row) for i, row in enumerate(zip(values, schemas, regexes, seeds, streamers))]


def _lazy_items(form: str, values: Iterable, schema, regex, seed, streamer) -> Iterator[Item]:
    for name, value in (("schema", schema), ("regex", regex), ("seed", seed), ("streamer", streamer)):
        if isinstance(value, (list, tuple)):
            raise ValueError(f"{name} is a list but the rows are an iterator: pass one {name} for every row, or the "
                             "rows as a list")
    seed = _seed(seed)
    return (Item(i, _form(form, value), value, schema, regex, seed) for i, value in enumerate(values))


def _seed(seed):
    if seed is not None:
        check_int("seed", seed, low=0, high=MAX_SEED)
    return seed


def _streamer(streamer):
    check_streamer(streamer)
    return streamer


def _form(form: str, value) -> str:
    """A prompt that is a list of messages is a chat."""
    chat = isinstance(value, (list, tuple)) and value and all(isinstance(m, dict) for m in value)
    return "messages" if form == "prompt" and chat else form


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


def token_bytes(tokenizer, vocab_size: int) -> tuple[bytes, ...]:
    return fsm.vocabulary_from_tokenizer(tokenizer, vocab_size).token_bytes

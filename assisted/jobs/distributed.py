"""`structspec batch`'s work as a callable class for Ray Data: one actor per worker, models loaded once per actor.

    import ray
    from assisted.jobs.distributed import BatchGenerator, map_batches_options

    docs = ray.data.read_json("docs.jsonl")  # rows: {"id", "prompt"} or {"id", "messages"}
    out = docs.map_batches(BatchGenerator, fn_constructor_kwargs={"model": "smollm2-135m", "schema": schema,
                           "options": {"max_new_tokens": 64}}, **map_batches_options(workers=4))
    # or by hand: compute=ray.data.ActorPoolStrategy(size=4) (or concurrency=4), batch_size=1, batch_format="pandas"
    out.write_json("out/")

Each output row holds the columns of a `structspec batch` output line (`OUTPUT_COLUMNS`): a result has `error`
None, an error row (a row that is not a usable document, or whose generation failed) has `text`, `value`,
`stop_reason` and `stats` None; `output_record(row)` gives back exactly the line `structspec batch` writes. Ray
is imported by the caller, never here: this module works (and is tested) without it.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from assisted.jobs.run import BadLine, Document, document_record, error_record
from assisted.jobs.input import parse_line

OUTPUT_COLUMNS = ("id", "text", "value", "stop_reason", "stats", "line", "error")
RESULT_KEYS = ("id", "text", "value", "stop_reason", "stats")
ERROR_KEYS = ("id", "line", "error")


class LoadError(RuntimeError):
    """A worker could not load its models; the message is the loader's, on one line."""


def recommended_load_options(device: str, assistant) -> dict:
    """`load_pair`'s options for `device`: packed float32 target and a 4-bit assistant on a CPU, bfloat16 on a GPU.

    Parameters
    ----------
    device : str
        ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
    assistant : str or None
        The assistant's source; None: no quantized copy to make.
    """
    if device.startswith("cuda"):
        return {"device": device, "dtype": "bfloat16"}
    return {"device": "cpu", "dtype": "float32", "pack": True,
            "quantize_assistant": "int4" if assistant is not None else None}


def map_batches_options(*, workers: int, threads_per_worker: int = 1, gpus_per_worker: float = 0) -> dict:
    """Keyword arguments for ``Dataset.map_batches(BatchGenerator, ...)`` (imports Ray).

    A pool of `workers` actors, each reserving `threads_per_worker` CPUs (and `gpus_per_worker` GPUs: 1 for one
    actor per GPU); one document per batch; pandas batches (values and statistics stay Python objects). Ray Data
    restarts an actor whose process dies and retries its task (its defaults for actor pools: ``max_restarts=-1``,
    ``max_task_retries=-1``).
    """
    import ray

    options = {"compute": ray.data.ActorPoolStrategy(size=workers), "num_cpus": threads_per_worker,
               "batch_size": 1, "batch_format": "pandas"}
    return options | ({"num_gpus": gpus_per_worker} if gpus_per_worker else {})


def one_line(error: BaseException) -> str:
    """An exception as `structspec` reports it: OSError's own message, other types named; first line only."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return text if isinstance(error, OSError) and text else f"{type(error).__name__}: {text}".rstrip(": ")


class BatchGenerator:
    """Turn batches of documents into `structspec batch` output rows; a Ray Data actor (see the module's example).

    Parameters
    ----------
    model : str or PathLike
        The target's source (hub id, folder, .gguf file or named offline source; see `assisted.models.loading`).
    assistant : str or PathLike, optional
        The drafting model's source.
    schema, regex : optional
        The constraint, as for `assisted.generate` (at most one).
    options : dict, optional
        `generate`'s options by transformers' names (``max_new_tokens``, ``do_sample``, ``temperature``, ...).
    chat : bool
        Format a ``prompt`` as one user chat message (``messages`` are always formatted).
    threads : int, optional
        torch CPU threads in this worker (None: torch's default).
    device : str
        ``"auto"``: the GPU Ray gave this actor if any (``num_gpus=1``), else the CPU.
    load_options : dict, optional
        `load_pair`'s options; default `recommended_load_options` for the device.
    prefix_cache : bool
        Reuse the KV cache of the prompt prefix shared with the previous document (`assisted.PrefixCache`).
    loader : callable, optional
        ``loader(model, assistant, **load_options) -> (model, tokenizer, assistant[, the assistant's own
        tokenizer])``; default `assisted.models.loading.load_pair`, with the assistant's own tokenizer loaded from
        its source as `structspec batch` does (an assistant of another vocabulary drafts text, as with
        `generate(assistant_tokenizer=)`).

    Raises
    ------
    LoadError
        If the models cannot be loaded, with the loader's one-line error.
    """

    def __init__(self, model, assistant=None, *, schema=None, regex=None, options: dict | None = None,
                 chat: bool = False, threads: int | None = None, device: str = "auto",
                 load_options: dict | None = None, prefix_cache: bool = True, loader: Callable | None = None):
        import torch

        from assisted.prefix import PrefixCache
        if threads:
            torch.set_num_threads(threads)
        device = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
        load_options = recommended_load_options(device, assistant) if load_options is None else load_options
        self.target, self.tokenizer, self.assistant, self.assistant_tokenizer = _load(loader, model, assistant,
                                                                                     load_options)
        self.constraint = {"schema": schema} if schema is not None else {"regex": regex} if regex is not None else {}
        self.options, self.chat = dict(options or {}), chat
        self.prefix_cache = PrefixCache() if prefix_cache else None

    def __call__(self, batch) -> Any:
        """A batch (pandas DataFrame, dict of arrays or pyarrow Table) of rows with ``id`` and ``prompt`` or
        ``messages`` (and an optional ``line``) -> a pandas DataFrame of output rows (`OUTPUT_COLUMNS`)."""
        import pandas

        records = self.records([document_of(row) for row in rows_of(batch)])
        return pandas.DataFrame({name: pandas.Series([r.get(name) for r in records], dtype=object)
                                 for name in OUTPUT_COLUMNS})

    def records(self, documents: list[Document | BadLine]) -> list[dict]:
        """Output lines for a batch of documents, in order: the single-row loop (a batched engine replaces this)."""
        return [error_record(d.id, d.line, d.error) if isinstance(d, BadLine) else document_record(d, self.generate_one)
                for d in documents]

    def generate_one(self, document: Document):
        """`assisted.generate` for one document."""
        from assisted.generate import generate
        prompt = ({"messages": [{"role": "user", "content": document.prompt}]} if self.chat else
                  {"prompt": document.prompt}) if document.prompt is not None else {"messages": document.messages}
        return generate(self.target, self.assistant, tokenizer=self.tokenizer,
                        assistant_tokenizer=self.assistant_tokenizer, **self.constraint, **self.options,
                        prefix_cache=self.prefix_cache, **prompt)


def _load(loader: Callable | None, model, assistant, load_options: dict) -> tuple:
    """(target, tokenizer, assistant or None, the assistant's own tokenizer or None)."""
    from assisted.models.loading import assistant_tokenizer, load_pair
    try:
        target, tokenizer, helper, *own = (loader or load_pair)(model, assistant, **load_options)
        if loader is None:
            own = [assistant_tokenizer(model, assistant, helper)]
        return target, tokenizer, helper, own[0] if own else None
    except Exception as error:  # noqa: BLE001  whatever the loader raises, the run stops with its one line
        raise LoadError(f"cannot load --model {model}" + (f" / --assistant {assistant}" if assistant else "")
                        + f": {one_line(error)}") from None


def rows_of(batch) -> list[dict]:
    """The rows of a Ray Data batch as plain Python dicts: numpy values made Python ones, and a field that is None
    or NaN dropped (Arrow gives every row every column, and every message every key, that any of them has)."""
    if hasattr(batch, "to_pylist"):  # pyarrow Table
        rows = batch.to_pylist()
    elif hasattr(batch, "to_dict") and hasattr(batch, "columns"):  # pandas DataFrame
        rows = batch.to_dict(orient="records")
    else:  # dict of numpy arrays
        columns = {name: list(values) for name, values in batch.items()}
        rows = [dict(zip(columns, values)) for values in zip(*columns.values())]
    return [_plain(row, drop_missing=True) for row in rows]


def _plain(value, drop_missing: bool = False):
    """numpy values -> Python ones, in dicts and lists too; with `drop_missing`, dict fields None or NaN dropped."""
    if isinstance(value, dict):
        return {k: _plain(v, drop_missing) for k, v in value.items() if not (drop_missing and _missing(v))}
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return [_plain(v, drop_missing) for v in value]
    return value


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and value != value)


def document_of(row: dict) -> Document | BadLine:
    """One input row checked by `structspec batch`'s rules (`line` defaults to None when the row has none)."""
    line = row.get("line")
    fields = {k: v for k, v in row.items() if k in ("id", "prompt", "messages")}
    try:
        text = json.dumps(fields)
    except (TypeError, ValueError) as error:
        return BadLine(line, None, f"not JSON ({error})")
    return parse_line(line, text)


def output_record(row) -> dict:
    """An output row (a dict or pandas row) -> exactly the line `structspec batch` writes for it."""
    row = {name: row[name] for name in OUTPUT_COLUMNS if name in row}
    keys = ERROR_KEYS if not _missing(row.get("error")) else RESULT_KEYS
    return {key: _plain_value(row.get(key)) for key in keys}


def _plain_value(value):
    return None if _missing(value) else _plain(value)

"""The `structspec` command: generate once, over a JSONL batch, or prepare the named offline models.

    structspec generate --model smollm2-135m --schema person.json --prompt "Ada, 36, engineer:" --stats
    structspec batch --model M --assistant A --schema s.json --input docs.jsonl --output out.jsonl
    structspec batch ... --ray [ADDRESS] --workers 4         (on Ray: a local instance, or the cluster at ADDRESS)
    structspec prepare qwen2.5-coder-1.5b          structspec list

Every argument and file is checked before a model is loaded; a problem that stops the run is one line on
stderr and a non-zero exit status. In a batch, a bad input line is reported and written as an error line,
and the batch goes on.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path
from typing import Callable

from assisted.config import LOOKUP_UNBOUNDED
from assisted.jobs.run import BatchError, read_input, read_output, stats_record
from assisted.jobs.lock import output_lock
from assisted.jobs.ray import add_ray_options

EXIT_ERROR = 2
DEFAULT_BATCH_SIZE = 8  # `structspec batch --batch-size`: the fastest measured on these CPUs, with newcomers
# prefilled from a row sharing their prompt prefix (docs/design.md, "Batched rows")


class CliError(ValueError):
    """A one-line error that stops the run."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="structspec", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    one = commands.add_parser("generate", help="generate once and print the output")
    _model_options(one)
    prompt = one.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", help="the prompt text (see --chat)")
    prompt.add_argument("--messages", type=Path, help="a JSON file with a list of {role, content} chat messages")
    one.add_argument("--stats", action="store_true",
                     help="also print the run's statistics (JSON, on stderr), with what loading cost (seconds, peak "
                          "memory)")
    one.add_argument("--stream", action="store_true", help="print the text as it is committed")
    many = commands.add_parser("batch", help="generate for every line of a JSONL file, resumable")
    _model_options(many)
    many.add_argument("--input", type=Path, required=True, help='JSONL: {"id", "prompt"} or {"id", "messages"}')
    many.add_argument("--output", type=Path, required=True, help="JSONL, appended to; a rerun skips ids done")
    many.add_argument("--no-progress", action="store_true", help="no progress bar")
    many.add_argument("--batch-size", type=int, default=None,
                      help=f"documents decoded at once, lines written as documents finish (default "
                           f"{DEFAULT_BATCH_SIZE}; 1: one at a time, in input order)")
    many.add_argument("--no-prefix-cache", action="store_true",
                      help="prefill every prompt in full (default: reuse the KV cache of the prompt prefix shared "
                           "with the previous document, or with a document in the batch)")
    add_ray_options(many)
    prep = commands.add_parser("prepare", help="fetch, verify and convert named offline sources once")
    prep.add_argument("names", nargs="+")
    prep.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    prep.add_argument("--force", action="store_true", help="rebuild an existing cache")
    commands.add_parser("list", help="show the named offline sources and whether they are ready")
    return parser.parse_args(argv)


def _model_options(parser: argparse.ArgumentParser) -> None:
    models = parser.add_argument_group("models")
    models.add_argument("--model", required=True, help="hub id, local folder, .gguf file or named offline source")
    models.add_argument("--assistant", help="drafting model (same forms as --model); one with another vocabulary "
                        "drafts text with its own tokenizer")
    models.add_argument("--device", default="cpu")
    models.add_argument("--dtype", default="float32", help="float32, bfloat16, float16 or auto")
    models.add_argument("--quantize-assistant", choices=("int4", "int8"),
                        help="draft with a quantized copy of the assistant (CPU; int4 is faster and closer)")
    models.add_argument("--draft-vocab-size", type=_draft_vocab_size, default=None,
                        help="give the assistant a draft vocabulary: a number of tokens, 'auto' (32768 on the CPU for "
                             "vocabularies of 65536 or more) or 'none' (its full head, the default)")
    models.add_argument("--quantize-target", choices=("int4", "int8"),
                        help="row-invariant quantized target (CPU, float32; speculation over it stays exactly "
                             "lossless): int4 keeps a GGUF's own 4-bit groups (others int8), int8 every Linear")
    models.add_argument("--pack", action="store_true", help="pack the target's Linear weights (CPU)")
    models.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    constraint = parser.add_mutually_exclusive_group()
    constraint.add_argument("--schema", type=Path, help="a JSON Schema file")
    constraint.add_argument("--pydantic", help="a pydantic model class, module:Class")
    constraint.add_argument("--regex", help="a regex the output must fully match")
    decoding = parser.add_argument_group("decoding")
    decoding.add_argument("--chat", action="store_true", help="format --prompt / prompts as one user chat message")
    decoding.add_argument("--max-new-tokens", type=int, default=512)
    decoding.add_argument("--close-within-budget", action="store_true",
                          help="with a constraint: allow only tokens after which a valid completion still fits in "
                               "--max-new-tokens, so every output closes complete (stop reason 'closed')")
    decoding.add_argument(
        "--temperature",
        type=float,
        help="0: greedy; > 0: sample (default: the model's generation config, greedy if it says none)",
    )
    decoding.add_argument("--repetition-penalty", type=float, help="transformers' repetition penalty (> 1 penalizes)")
    decoding.add_argument("--stop", action="append", help="a stop string (repeatable)")
    decoding.add_argument("--top-k", type=int)
    decoding.add_argument("--top-p", type=float)
    decoding.add_argument("--seed", type=int)
    decoding.add_argument("--num-assistant-tokens", type=int, default=5)
    decoding.add_argument("--schedule", choices=["auto", "heuristic", "constant"])
    decoding.add_argument("--lossless", action="store_true", help="verify forced tokens too (coalesce=False)")
    decoding.add_argument("--prompt-lookup", action=argparse.BooleanOptionalAction, default=None,
                          help="also draft by copying from the prompt (default: on under the auto schedule)")


def constraint_of(args: argparse.Namespace) -> dict:
    """{"schema": ...} / {"regex": ...} / {} from the arguments, compiled once to fail early (CliError)."""
    import fsm
    try:
        if args.regex is not None:
            fsm.compile_regex(args.regex)
            return {"regex": args.regex}
        if args.schema is not None:
            schema = _schema_file(args.schema)
        elif args.pydantic is not None:
            schema = _pydantic_class(args.pydantic)
        else:
            return {}
        fsm.compile_schema(schema)
    except (fsm.SchemaError, fsm.RegexError) as error:
        where = "--regex" if args.regex is not None else f"--schema {args.schema}" if args.schema else "--pydantic"
        raise CliError(f"{where}: {error}") from error
    return {"schema": schema}


def _schema_file(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise CliError(f"--schema {path}: cannot read it ({error.strerror or error})") from error
    except ValueError as error:
        raise CliError(f"--schema {path}: not JSON ({error})") from error


def _pydantic_class(spec: str):
    import pydantic
    module_name, _, name = spec.partition(":")
    if not module_name or not name:
        raise CliError(f"--pydantic {spec!r}: expected module:Class")
    sys.path.insert(0, os.getcwd())  # as `python -m` would: modules next to the data
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # noqa: BLE001  any import failure is the user's module's, reported as such
        raise CliError(
            f"--pydantic {spec!r}: cannot import {module_name!r} ({type(error).__name__}: {error})"
        ) from error
    finally:
        sys.path.remove(os.getcwd())
    found = getattr(module, name, None)
    if not (isinstance(found, type) and issubclass(found, pydantic.BaseModel)):
        raise CliError(f"--pydantic {spec!r}: {module_name} has no pydantic model class {name!r}")
    return found


def decoding_of(args: argparse.Namespace) -> dict:
    """generate()'s options (transformers' names) from the arguments given; the model's generation config fills
    the rest."""
    given = {"max_new_tokens": args.max_new_tokens, "top_k": args.top_k, "top_p": args.top_p, "seed": args.seed,
             "num_assistant_tokens": args.num_assistant_tokens, "num_assistant_tokens_schedule": args.schedule,
             "coalesce": not args.lossless, "repetition_penalty": args.repetition_penalty, "stop_strings": args.stop,
             "close_within_budget": args.close_within_budget or None,
             "prompt_lookup_num_tokens": None if args.prompt_lookup is None else (LOOKUP_UNBOUNDED if args.prompt_lookup
                                                                                 else 0)}
    if args.temperature is not None:
        sample = args.temperature > 0
        given |= {"do_sample": sample, "temperature": args.temperature if sample else 1.0}
    return {name: value for name, value in given.items() if value is not None}


def _draft_vocab_size(text: str) -> int | str | None:
    """--draft-vocab-size: a positive int, "auto" or "none"."""
    if text in ("auto", "none"):
        return None if text == "none" else text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of tokens, 'auto' or 'none', not {text!r}") from None


def load_models(args: argparse.Namespace):
    """(model, tokenizer, assistant or None, the assistant's own tokenizer or None) by
    `assisted.models.loading.load_pair`; `generate` drafts across vocabularies with the fourth."""
    from assisted.models.loading import assistant_tokenizer, load_pair
    model, tokenizer, assistant = load_pair(args.model, args.assistant, dtype=args.dtype, device=args.device,
                                            quantize_assistant=args.quantize_assistant,
                                            quantize_target=args.quantize_target, pack=args.pack,
                                            draft_vocab_size=getattr(args, "draft_vocab_size", None),
                                            freeze_gc=True)  # the CLI's process is its own: no collection over models
    return model, tokenizer, assistant, assistant_tokenizer(args.model, args.assistant, assistant)


def _loaded(load: Callable, args) -> tuple:
    """`load(args)` as (model, tokenizer, assistant, assistant_tokenizer): a loader may leave out the fourth."""
    model, tokenizer, assistant, *own = load(args)
    return model, tokenizer, assistant, (own[0] if own else None)


def _messages_file(path: Path) -> list:
    try:
        messages = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise CliError(f"--messages {path}: cannot read it ({error.strerror or error})") from error
    except ValueError as error:
        raise CliError(f"--messages {path}: not JSON ({error})") from error
    if not (isinstance(messages, list) and messages and all(isinstance(m, dict) for m in messages)):
        raise CliError(f"--messages {path}: expected a non-empty list of {{role, content}} objects")
    return messages


def _prompt_of(prompt: str | None, messages: list | None, chat: bool) -> dict:
    if prompt is not None and chat:
        return {"messages": [{"role": "user", "content": prompt}]}
    return {"prompt": prompt} if prompt is not None else {"messages": messages}


def command_generate(args, load: Callable) -> int:
    from assisted import generate
    constraint, decoding = constraint_of(args), decoding_of(args)
    messages = None if args.messages is None else _messages_file(args.messages)
    model, tokenizer, assistant, own = _loaded(load, args)
    streamer = _printer(tokenizer) if args.stream else None
    result = generate(model, assistant, tokenizer=tokenizer, assistant_tokenizer=own,
                      **_prompt_of(args.prompt, messages, args.chat),
                      **constraint, **decoding, streamer=streamer)
    if streamer is None:
        print(result.text)
    if args.stats:
        print(json.dumps({"stop_reason": result.stop_reason, **stats_record(result.stats), **_load_record()}),
              file=sys.stderr)
    return 0


def _load_record() -> dict:
    """What loading the models cost (`assisted.models.loading.last_load`), for --stats: {"load": {...}} or {}."""
    from assisted.models.loading import last_load
    load = last_load()
    if not load:
        return {}
    return {"load": {"seconds": round(load["seconds"], 2), "peak_memory_gb": round(load["peak_bytes"] / 1e9, 3),
                     "target": load["target"], "assistant": load["assistant"]}}


def _printer(tokenizer):
    """transformers' TextStreamer: the new text on stdout as it is committed (the prompt not repeated)."""
    from transformers import TextStreamer
    return TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)


def command_batch(args, load: Callable) -> int:
    note = lambda message: print(f"structspec: note: {message}", file=sys.stderr)  # noqa: E731
    with output_lock(args.output, note):  # a second run on this output stops here, at once
        return _batch_locked(args, load)


def _batch_locked(args, load: Callable) -> int:
    from assisted import generate_batch_iter
    from assisted.jobs.run import run_batch_rows
    constraint, decoding = constraint_of(args), decoding_of(args)
    inputs = read_input(args.input)
    read_output(args.output)  # not ours: refuse before loading anything
    if args.ray is not None:
        if args.batch_size not in (None, 1):
            raise CliError("--ray runs one document at a time per worker: leave --batch-size out")
        return command_ray_batch(args, constraint, decoding, inputs)
    model, tokenizer, assistant, own = _loaded(load, args)
    documents = Documents(args.chat)
    rows = generate_batch_iter(model, assistant, tokenizer=tokenizer, assistant_tokenizer=own,
                               prompts=documents.prompts(), share_prefix=not args.no_prefix_cache,
                               batch_size=DEFAULT_BATCH_SIZE if args.batch_size is None else args.batch_size,
                               **constraint, **decoding)  # every argument checked here, before the output is opened
    report = lambda message: print(f"{args.input}: {message}", file=sys.stderr)  # noqa: E731
    summary = run_batch_rows(inputs, args.output, documents.results(rows), report, progress=not args.no_progress)
    _print_summary(args, summary)
    return 0


class Documents:
    """`structspec batch`'s documents as `generate_batch_iter`'s prompts, read as the engine admits rows, and its
    results back as (document, result): documents are decoded B at a time (`--batch-size`), refilled as they finish,
    and with `--batch-size 1` one at a time in input order."""

    def __init__(self, chat: bool):
        self.chat, self.documents, self.waiting = chat, iter(()), {}

    def prompts(self):
        """Each document's prompt text or chat messages, as `run_batch_rows` hands the documents over."""
        for index, document in enumerate(self.documents):
            self.waiting[index] = document
            (value,) = _prompt_of(document.prompt, document.messages, self.chat).values()
            yield value

    def results(self, rows) -> Callable:
        """`run_batch_rows`'s ``generate_rows(documents)`` over the `(index, result)` pairs `rows` yields."""
        def generate_rows(documents):
            self.documents = documents
            for index, result in rows:
                yield self.waiting.pop(index), result

        return generate_rows


def command_ray_batch(args, constraint: dict, decoding: dict, inputs) -> int:
    """`batch --ray`: the same documents and lines, generated by Ray workers (`assisted.jobs.ray`); the caller
    holds the output's lock on this driver."""
    from assisted.jobs.ray import ray_settings, run_ray_batch
    report = lambda message: print(f"{args.input}: {message}", file=sys.stderr)  # noqa: E731
    summary = run_ray_batch(inputs, args.output, ray_settings(args, constraint, decoding), report,
                            progress=not args.no_progress)
    _print_summary(args, summary)
    return 0


def _print_summary(args, summary) -> None:
    print(f"{args.output}: {summary.written} written, {summary.skipped} already done, {summary.bad} bad input "
          f"lines, {summary.failed} failed, {summary.tokens} new tokens", file=sys.stderr)


def command_sources(args) -> int:
    from assisted.models import sources
    if args.command == "list":
        print(f"cache: {sources.cache_root()}")
        for name, source in sources.SOURCES.items():
            print(f"{name:20} {sources.status(name)}\n{'':20} {source.description}")
        return 0
    unknown = [n for n in args.names if n not in sources.SOURCES]
    if unknown:
        raise CliError(f"unknown source {unknown[0]!r}; named sources: {', '.join(sources.SOURCES)}")
    for name in args.names:
        print(f"{name}: ready in {sources.prepare(name, dtype=args.dtype, force=args.force)}")
    return 0


def main(argv: list[str] | None = None, *, load: Callable | None = None) -> int:
    """Run the command line; returns the exit status. `load(args)` -> (model, tokenizer, assistant[, the assistant's
    own tokenizer]) for tests."""
    args = parse_args(argv)
    try:
        if args.command in ("prepare", "list"):
            return command_sources(args)
        _check_numbers(args)
        if args.threads:
            import torch
            torch.set_num_threads(args.threads)
        command = command_generate if args.command == "generate" else command_batch
        return command(args, load or load_models)
    except (CliError, BatchError) as error:
        print(f"structspec: error: {error}", file=sys.stderr)
        return EXIT_ERROR
    except OSError as error:  # a model that cannot be found or loaded (NotPreparedError is a RuntimeError)
        print(f"structspec: error: {error}", file=sys.stderr)
        return EXIT_ERROR
    except (RuntimeError, ValueError, TypeError) as error:
        print(f"structspec: error: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}",
              file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("structspec: interrupted; every line written is kept, rerun the same command to resume",
              file=sys.stderr)
        return 130


def _check_numbers(args) -> None:
    """The numeric options generate() would refuse, refused before loading a model."""
    from assisted.inputs import check_options
    temperature = args.temperature or 0.0
    check_options(args.max_new_tokens, temperature > 0, temperature if temperature > 0 else 1.0,
                  args.top_k or None, args.top_p, args.seed, args.num_assistant_tokens, args.schedule, True)
    if temperature < 0:
        raise CliError(f"--temperature must be >= 0, got {args.temperature}")
    if getattr(args, "batch_size", None) is not None and args.batch_size < 1:
        raise CliError(f"--batch-size must be >= 1, got {args.batch_size}")


if __name__ == "__main__":
    sys.exit(main())

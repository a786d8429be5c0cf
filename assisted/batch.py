"""Generate over a JSONL file of documents, one output line per input, resumable.

Input lines are ``{"id": ..., "prompt": "..."}`` or ``{"id": ..., "messages": [...]}``. Output lines are
``{"id", "text", "value", "stop_reason", "stats"}`` for a document done, and ``{"id", "line", "error"}`` for
a line that could not be used (not JSON, no id, a duplicate id, ...) or whose generation failed. Each line is
flushed as it is written, and the output file is only ever appended to: a rerun skips every id already done
and every bad line already reported, so a crash or Ctrl-C loses nothing that was written.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pydantic


class BatchError(ValueError):
    """A problem that stops the whole run (unreadable input, an output file that is not ours)."""


@dataclass(frozen=True)
class Document:
    """A usable input line."""

    line: int  # 1-based line number in the input file
    id: Any  # str or int, as given
    prompt: str | None
    messages: list | None


@dataclass(frozen=True)
class BadLine:
    """An input line that cannot be used, and why."""

    line: int
    id: Any  # None when the line has no usable id
    error: str


@dataclass
class Done:
    """What an existing output file already holds."""

    ids: set = field(default_factory=set)  # keys of ids with a result line
    bad_lines: set = field(default_factory=set)  # line numbers already reported as bad input
    ends_cut: bool = False  # the last line has no newline: a write cut short by a crash


def id_key(value) -> str:
    """Ids compare by JSON text: 1 and "1" are different ids."""
    return json.dumps(value)


def read_input(path: Path) -> tuple[list[Document], list[BadLine]]:
    """Every line of `path` as a Document or a BadLine (blank lines are skipped); duplicates are bad lines."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise BatchError(f"--input {path}: cannot read it ({error})") from error
    documents, bad, first = [], [], {}
    for number, text in enumerate(lines, 1):
        if not text.strip():
            continue
        item = _parse_line(number, text)
        if isinstance(item, Document) and id_key(item.id) in first:
            item = BadLine(number, item.id, f"duplicate id {item.id!r} (first on line {first[id_key(item.id)]})")
        if isinstance(item, Document):
            first[id_key(item.id)] = number
            documents.append(item)
        else:
            bad.append(item)
    return documents, bad


def _parse_line(number: int, text: str) -> Document | BadLine:
    try:
        record = json.loads(text)
    except ValueError as error:
        return BadLine(number, None, f"not JSON ({error})")
    if not isinstance(record, dict):
        return BadLine(number, None, f"not a JSON object but {type(record).__name__}")
    ident = record.get("id")
    if isinstance(ident, bool) or not isinstance(ident, (str, int)):
        return BadLine(number, None, 'no "id" (a string or an integer)')
    prompt, messages = record.get("prompt"), record.get("messages")
    if (prompt is None) == (messages is None):
        return BadLine(number, ident, 'needs exactly one of "prompt" and "messages"')
    if prompt is not None and not isinstance(prompt, str):
        return BadLine(number, ident, f'"prompt" must be a string, got {type(prompt).__name__}')
    if messages is not None and not (
        isinstance(messages, list) and messages
        and all(isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in messages)):
        return BadLine(number, ident, '"messages" must be a non-empty list of {"role": str, "content": str}')
    return Document(number, ident, prompt, messages)


def read_output(path: Path) -> Done:
    """The ids and bad lines an existing output already holds; BatchError if a line is not one of ours."""
    done = Done()
    if not path.exists():
        return done
    try:
        data = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise BatchError(f"--output {path}: cannot read it ({error})") from error
    lines = data.split("\n")
    done.ends_cut = lines[-1] != ""
    for number, text in enumerate(lines if done.ends_cut else lines[:-1], 1):
        if not text.strip():
            continue
        record = _our_record(text)
        if record is None:
            if text.startswith(CUT_PREFIX) and _unparseable(text):
                continue  # a line of ours cut short by a crash: kept as it is, skipped
            raise BatchError(f"--output {path} line {number} is not a structspec output line; "
                             "refusing to append to a file that is not ours (choose another --output)")
        if "error" in record:
            done.bad_lines.add(record.get("line"))
        else:
            done.ids.add(id_key(record["id"]))
    return done


CUT_PREFIX = '{"id": '  # how every line we write starts


def _unparseable(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return True
    return False


def _our_record(text: str) -> dict | None:
    try:
        record = json.loads(text)
    except ValueError:
        return None
    ours = isinstance(record, dict) and "id" in record and (
        {"text", "stop_reason"} <= record.keys() or {"line", "error"} <= record.keys())
    return record if ours else None


def stats_record(stats) -> dict:
    """The statistics of one result as plain JSON."""
    s = stats.seconds
    return {
        "new_tokens": stats.new_tokens,
        "prefill_tokens": stats.prefill_tokens,
        "target_forward_passes": stats.target_forward_passes,
        "assistant_forward_passes": stats.assistant_forward_passes,
        "drafted": stats.drafted,
        "accepted": stats.accepted,
        "forced_tokens_appended": stats.forced_tokens_appended,
        "seconds": {"total": round(s.total, 4), "target": round(s.target, 4), "assistant": round(s.assistant, 4),
                    "fsm": round(s.fsm, 4)},
    }


def result_record(ident, result) -> dict:
    value = result.value
    if isinstance(value, pydantic.BaseModel):
        value = value.model_dump(mode="json")
    return {"id": ident, "text": result.text, "value": value, "stop_reason": result.stop_reason,
            "stats": stats_record(result.stats)}


def error_record(ident, line: int | None, error: str) -> dict:
    """The output line of an input line that could not be used, or of a document whose generation failed."""
    return {"id": ident, "line": line, "error": error}


def document_record(document: Document, generate_one: Callable) -> dict:
    """The output line of one document: its result, or its error line if `generate_one(document)` raised a
    ValueError/TypeError (the batch goes on)."""
    try:
        result = generate_one(document)
    except (ValueError, TypeError) as error:
        return error_record(document.id, document.line, str(error))
    return result_record(document.id, result)


def write_bad_lines(out, bad: list[BadLine], done: Done, report: Callable[[str], None]) -> None:
    """Report every bad input line, and write those not reported by an earlier run; first end a line cut short."""
    if done.ends_cut:
        out.write("\n")  # end the cut-off line so that ours start on a line of their own
    for item in bad:
        report(f"input line {item.line}: {item.error}")
        if item.line not in done.bad_lines:
            _write(out, error_record(item.id, item.line, item.error))


@dataclass(frozen=True)
class Summary:
    """What one batch run did."""

    written: int  # result lines written by this run
    skipped: int  # documents already done by an earlier run
    bad: int  # bad input lines (reported this run or before)
    failed: int  # documents whose generation raised
    tokens: int  # new tokens generated by this run


def run_batch(documents: list[Document], bad: list[BadLine], output: Path, generate_one: Callable,
              report: Callable[[str], None], progress: bool = True) -> Summary:
    """Append a line per document not done yet (and per bad line not reported yet) to `output`.

    `generate_one(document)` returns a GenerationResult; a ValueError/TypeError it raises becomes an error
    line for that document and the batch goes on. Bad lines are reported through `report`.
    """
    done = read_output(output)
    todo = [d for d in documents if id_key(d.id) not in done.ids]
    tokens = failed = written = 0
    with open(output, "a", encoding="utf-8") as out:
        write_bad_lines(out, bad, done, report)
        bar = _progress(len(todo), progress)
        start = time.perf_counter()
        for document in todo:
            record = document_record(document, generate_one)
            if "error" in record:
                failed += 1
                report(f"input line {document.line} (id {document.id!r}): {record['error']}")
            else:
                written += 1
                tokens += record["stats"]["new_tokens"]
            _write(out, record)
            bar.update(1)
            bar.set_postfix_str(f"{tokens / max(time.perf_counter() - start, 1e-9):.1f} tok/s", refresh=False)
        bar.close()
    return Summary(written, len(documents) - len(todo), len(bad), failed, tokens)


def _write(out, record: dict) -> None:
    out.write(json.dumps(record, ensure_ascii=False) + "\n")
    out.flush()


def _progress(total: int, enabled: bool):
    from tqdm.auto import tqdm
    return tqdm(total=total, unit="doc", disable=not enabled, dynamic_ncols=True, smoothing=0.1)

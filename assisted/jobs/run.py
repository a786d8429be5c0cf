"""Generate over a JSONL file of documents, one output line per input, resumable.

Input lines are ``{"id": ..., "prompt": "..."}`` or ``{"id": ..., "messages": [...]}`` (read by
`assisted.jobs.input`, one line at a time). Output lines are ``{"id", "text", "value", "stop_reason", "stats"}``
for a document done, and ``{"id", "line", "error"}`` for a line that could not be used (not UTF-8, not JSON, no
id, a duplicate id, ...) or whose generation failed. Each line is flushed as it is written, and the output file
is only ever appended to: a rerun skips every id already done and every bad line already reported, so a crash,
a SIGKILL or Ctrl-C loses nothing that was written. One run at a time holds the output (`assisted.jobs.lock`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pydantic

from assisted.jobs.input import BadLine, BatchError, Document, Inputs, id_key, read_input

__all__ = ["BadLine", "BatchError", "Document", "Done", "Inputs", "Summary", "id_key", "read_input", "read_output",
           "run_batch_rows"]


@dataclass
class Done:
    """What an existing output file already holds."""

    ids: set = field(default_factory=set)  # keys of ids with a result line
    bad_lines: set = field(default_factory=set)  # line numbers already reported as bad input
    ends_cut: bool = False  # the last line has no newline: a write cut short by a crash


def read_output(path: Path) -> Done:
    """The ids and bad lines an existing output already holds, read one line at a time.

    Raises
    ------
    BatchError
        If the file cannot be read, or a line is not one of ours (a line of ours cut short by a crash, even in
        the middle of a UTF-8 character, is skipped).
    """
    done = Done()
    try:
        file = open(path, "rb")
    except FileNotFoundError:
        return done
    except OSError as error:
        raise BatchError(f"--output {path}: cannot read it ({error.strerror or error})") from error
    with file:
        for number, raw in enumerate(file, 1):
            done.ends_cut = not raw.endswith(b"\n")
            if raw.strip():
                _read_output_line(path, number, raw, done)
    return done


CUT_PREFIX = '{"id": '  # how every line we write starts


def _read_output_line(path: Path, number: int, raw: bytes, done: Done) -> None:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    record = None if text is None else _our_record(text)
    if record is None:
        if raw.startswith(CUT_PREFIX.encode()) and (text is None or _unparseable(text)):
            return  # a line of ours cut short by a crash: kept as it is, skipped
        raise BatchError(f"--output {path} line {number} is not a structspec output line; "
                         "refusing to append to a file that is not ours (choose another --output)")
    if "error" in record:
        done.bad_lines.add(record.get("line"))
    else:
        done.ids.add(id_key(record["id"]))


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
        "target_kernels": stats.target_kernels,
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
            write_line(out, error_record(item.id, item.line, item.error))


@dataclass(frozen=True)
class Summary:
    """What one batch run did."""

    written: int  # result lines written by this run
    skipped: int  # documents already done by an earlier run
    bad: int  # bad input lines (reported this run or before)
    failed: int  # documents whose generation raised
    tokens: int  # new tokens generated by this run


def run_batch_rows(inputs: Inputs, output: Path, generate_rows: Callable, report: Callable[[str], None],
                   progress: bool = True) -> Summary:
    """Append a line per document not done yet (and per bad line not reported yet) to `output`.

    Parameters
    ----------
    inputs : Inputs
        The first pass over the input (`read_input`); documents are read again one at a time as they are done.
    output : Path
        The output file, appended to (the caller holds its lock, `assisted.jobs.lock.output_lock`).
    generate_rows : callable
        ``generate_rows(documents)`` yields ``(document, result)`` as rows finish (`assisted.generate_batch_iter`),
        so lines are written in the order documents finish; a result with ``error`` set becomes that document's
        error line.
    report : callable
        Called with one line per bad input line and per failed document.
    progress : bool
        Show a progress bar.
    """
    def records(documents):
        for document, result in generate_rows(documents):
            yield document, (error_record(document.id, document.line, result.error) if result.error is not None
                             else result_record(document.id, result))

    return _append(inputs, output, records, report, progress)


def _append(inputs: Inputs, output: Path, records: Callable, report: Callable[[str], None], progress: bool
            ) -> Summary:
    """Write the bad lines, then ``records(documents)``'s ``(document, record)`` pairs as they come."""
    done = read_output(output)
    todo = inputs.todo(done.ids)
    tokens = failed = written = 0
    with open(output, "a", encoding="utf-8") as out:
        write_bad_lines(out, inputs.bad, done, report)
        bar = progress_bar(todo, progress)
        start = time.perf_counter()
        for document, record in records(inputs.documents(skip=done.ids)):
            if "error" in record:
                failed += 1
                report(f"input line {document.line} (id {document.id!r}): {record['error']}")
            else:
                written += 1
                tokens += record["stats"]["new_tokens"]
            write_line(out, record)
            bar.update(1)
            elapsed = max(time.perf_counter() - start, 1e-9)
            bar.set_postfix_str(f"{(written + failed) / elapsed:.2f} doc/s, {tokens / elapsed:.1f} tok/s",
                                refresh=False)
        bar.close()
    return Summary(written, len(inputs.first) - todo, len(inputs.bad), failed, tokens)


def write_line(out, record: dict) -> None:
    """Append `record` to `out` as one JSON line and flush it (a run is resumable after every line)."""
    out.write(json.dumps(record, ensure_ascii=False) + "\n")
    out.flush()


def progress_bar(total: int, enabled: bool):
    """A tqdm bar over `total` documents (silent unless `enabled`)."""
    from tqdm.auto import tqdm
    return tqdm(total=total, unit="doc", disable=not enabled, dynamic_ncols=True, smoothing=0.1)

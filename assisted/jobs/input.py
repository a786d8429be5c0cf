"""The input of `structspec batch`: a JSONL file read as bytes, one line at a time, in two passes.

The first pass (`read_input`, before any model is loaded) checks every line: a line that is not UTF-8, not
JSON, has no id, repeats an id, ... becomes a `BadLine` with its line number, and the rest of the file is used.
The second pass (`Inputs.documents`, during the run) reads the file again and yields the documents still to do,
one at a time. Lines end at b"\\n" only; a UTF-8 byte order mark before the first line is skipped.

Memory: the file is never held whole. The reader holds one line at a time, plus, per usable document, its id
and line number (about 120 bytes plus the id's length: some 130 MB for a million documents with ids of ten
characters) and, per bad line, its error message; the length of the prompts does not count.
"""

from __future__ import annotations

import codecs
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator


class BatchError(ValueError):
    """A problem that stops the whole run (unreadable input, an output file that is not ours, a busy output)."""


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


def id_key(value) -> str:
    """Ids compare by JSON text: 1 and "1" are different ids."""
    return json.dumps(value)


@dataclass
class Inputs:
    """What the first pass over an input file found.

    Attributes
    ----------
    path : Path
        The input file.
    bad : list of BadLine
        Every line that cannot be used, in file order (duplicated ids included).
    first : dict
        ``id_key(id) -> line number`` of each usable document.
    """

    path: Path
    bad: list
    first: dict

    def todo(self, done: set) -> int:
        """How many usable documents have an id key not in `done`."""
        return sum(1 for key in self.first if key not in done)

    def documents(self, skip: set = frozenset()) -> Iterator[Document]:
        """The second pass: each usable document whose id key is not in `skip`, in file order, read one at a time.

        Raises
        ------
        BatchError
            If the file cannot be read any more, or changed since the first pass.
        """
        bad_lines = {item.line for item in self.bad}
        for item in _items(self.path):
            if isinstance(item, Document) and self.first.get(id_key(item.id)) == item.line:
                if id_key(item.id) not in skip:
                    yield item
            elif item.line not in bad_lines:
                raise BatchError(f"--input {self.path} changed during the run (line {item.line}); rerun to resume")


def read_input(path: Path) -> Inputs:
    """The first pass over `path`: every bad line, and the line of each usable document.

    Blank lines are skipped; a repeated id is a bad line that names the id's first line.

    Raises
    ------
    BatchError
        If the file cannot be opened or read.
    """
    bad, first = [], {}
    for item in _items(path):
        if isinstance(item, Document) and id_key(item.id) in first:
            item = BadLine(item.line, item.id, f"duplicate id {item.id!r} (first on line {first[id_key(item.id)]})")
        if isinstance(item, Document):
            first[id_key(item.id)] = item.line
        else:
            bad.append(item)
    return Inputs(path, bad, first)


def _items(path: Path) -> Iterator[Document | BadLine]:
    """Each non-blank line of `path` as a Document or a BadLine, reading one line at a time."""
    try:
        with open(path, "rb") as file:
            offset = 0
            for number, raw in enumerate(file, 1):
                start = offset
                offset += len(raw)
                if number == 1 and raw.startswith(codecs.BOM_UTF8):
                    raw, start = raw[len(codecs.BOM_UTF8):], start + len(codecs.BOM_UTF8)
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as error:
                    yield BadLine(number, None, f"not UTF-8 (byte 0x{raw[error.start]:02x} at byte offset "
                                                f"{start + error.start} of the file: {error.reason})")
                    continue
                if text.strip():
                    yield parse_line(number, text)
    except OSError as error:
        raise BatchError(f"--input {path}: cannot read it ({error.strerror or error})") from error


def parse_line(number: int, text: str) -> Document | BadLine:
    """One decoded input line as a Document, or a BadLine saying what is wrong with it."""
    try:
        record = json.loads(text)
    except ValueError as error:
        return BadLine(number, None, f"not JSON ({error})")
    if not isinstance(record, dict):
        return BadLine(number, None, f"not a JSON object but {type(record).__name__}")
    ident = record.get("id")
    if isinstance(ident, bool) or not isinstance(ident, (str, int)):
        return BadLine(number, None, 'no "id" (a string or an integer)')
    if isinstance(ident, str) and not _encodable(ident):
        return BadLine(number, None, 'the "id" holds an unpaired surrogate escape (\\ud800-\\udfff)')
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
    texts = [prompt] if prompt is not None else [t for m in messages for t in (m["role"], m["content"])]
    if not all(_encodable(text) for text in texts):
        return BadLine(number, ident, f'"{"prompt" if prompt is not None else "messages"}" holds an unpaired '
                                      'surrogate escape (\\ud800-\\udfff)')
    return Document(number, ident, prompt, messages)


def _encodable(text: str) -> bool:
    """Whether `text` can be written as UTF-8 (JSON escapes can make unpaired surrogates, which cannot)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True

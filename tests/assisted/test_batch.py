"""`structspec batch` exactly once: the input read as bytes line by line, and one run per output file.

Reader and lock tests need no model; the runs use tiny random models (SmolLM2's tokenizer), in-process or, where
a second process is the point (a concurrent run, a SIGKILL), in a subprocess synchronised on its output and pipes.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

import assisted
from assisted.jobs import lock as batch_lock
from assisted.jobs.run import BatchError, read_input, read_output
from assisted.jobs.lock import OutputBusy, lock_path, output_lock
from assisted.cli import main
from tests.assisted.test_cli import pair  # noqa: F401 (the CLI tests' tiny pair, a fixture)

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.filterwarnings("ignore")]

ROOT = Path(__file__).resolve().parents[2]
NO_SUCH_PID = 4194305  # above the largest pid_max Linux allows: never a running process
SCHEMA = {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["x"], "additionalProperties": False}


@pytest.fixture
def files(tmp_path):
    schema = tmp_path / "x.json"
    schema.write_text(json.dumps(SCHEMA))
    return schema, tmp_path / "docs.jsonl", tmp_path / "out.jsonl"


def doc(i) -> bytes:
    return json.dumps({"id": f"d{i}", "prompt": f"Number {i}:"}).encode() + b"\n"


def batch(schema, docs, out):
    return ["batch", "--model", "tiny", "--assistant", "tiny2", "--schema", str(schema), "--input", str(docs),
            "--output", str(out), "--max-new-tokens", "12", "--no-progress"]


def one_at_a_time(schema, docs, out):
    """The run one document at a time (`--batch-size 1`): lines written in input order."""
    return [*batch(schema, docs, out), "--batch-size", "1"]


def ids_of(out: Path) -> list:
    return [json.loads(line)["id"] for line in out.read_text().splitlines() if '"text": ' in line]


# ---- the input, as bytes


def test_undecodable_lines_are_bad_lines_with_their_byte_offset_and_the_rest_is_used(tmp_path):
    lines = [doc(0), b'{"id": "x", "prompt": "caf\xff"}\n', doc(1), b'{"id": "y", "prompt": "\xe2\x28\xa1"}\n',
             doc(2), b'{"id": "z", "prompt": "cut \xe2\x82"}\n', doc(3)]
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"".join(lines))
    inputs = read_input(path)
    at = [sum(map(len, lines[:i])) for i in range(len(lines))]
    assert [(b.line, b.id, b.error) for b in inputs.bad] == [
        (2, None, f"not UTF-8 (byte 0xff at byte offset {at[1] + 26} of the file: invalid start byte)"),
        (4, None, f"not UTF-8 (byte 0xe2 at byte offset {at[3] + 23} of the file: invalid continuation byte)"),
        (6, None, f"not UTF-8 (byte 0xe2 at byte offset {at[5] + 27} of the file: invalid continuation byte)"),
    ]
    assert [lines[1][26], lines[3][23], lines[5][27]] == [0xFF, 0xE2, 0xE2]  # the offsets above point at them
    assert [(d.line, d.id) for d in inputs.documents()] == [(1, "d0"), (3, "d1"), (5, "d2"), (7, "d3")]
    assert inputs.todo({'"d1"'}) == 3 and [d.id for d in inputs.documents(skip={'"d1"'})] == ["d0", "d2", "d3"]


def test_lines_end_at_newlines_only_and_a_byte_order_mark_is_skipped(tmp_path):
    path = tmp_path / "in.jsonl"
    separator = "\u2028\r\x0b\x1c"  # str.splitlines() would cut the line at each of these
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps({"id": 1, "prompt": f"a{separator}b"}, ensure_ascii=False).encode()
                     + b"\r\n\n  \n" + json.dumps({"id": "1", "prompt": "c"}).encode())
    inputs = read_input(path)
    assert inputs.bad == []
    assert [(d.line, d.id, d.prompt) for d in inputs.documents()] == [(1, 1, f"a{separator}b"), (4, "1", "c")]


def test_unpaired_surrogate_escapes_are_bad_lines(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text(
        '{"id": "\\ud800", "prompt": "a"}\n{"id": 2, "prompt": "b\\udfff"}\n'
        '{"id": 3, "messages": [{"role": "user", "content": "\\ud83d"}]}\n{"id": 4, "prompt": "\\ud83d\\ude00"}\n'
    )
    inputs = read_input(path)
    assert [(b.line, b.id, b.error.split(" holds")[0]) for b in inputs.bad] == [
        (1, None, 'the "id"'), (2, 2, '"prompt"'), (3, 3, '"messages"')]
    assert [d.prompt for d in inputs.documents()] == ["\U0001f600"]


def test_the_reader_holds_one_line_at_a_time_not_the_file(tmp_path):
    path = tmp_path / "big.jsonl"
    prompt = "long document text " * 300  # ~5.7 kB a line, ~11 MB in all
    with open(path, "w") as file:
        for i in range(2000):
            file.write(json.dumps({"id": i, "prompt": f"{i} {prompt}"}) + "\n")
    tracemalloc.start()
    try:
        inputs = read_input(path)
        scanned = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        count = sum(1 for _ in inputs.documents())
        streamed = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert count == 2000 and path.stat().st_size > 10_000_000
    assert scanned < 1_000_000 and streamed < 1_000_000  # a few lines and 2000 ids, not 11 MB


def test_an_input_changed_during_the_run_stops_it_with_the_line(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_bytes(doc(0) + doc(1))
    inputs = read_input(path)
    path.write_bytes(doc(0) + doc(5))
    with pytest.raises(BatchError, match=r"--input .*in\.jsonl changed during the run \(line 2\); rerun to resume"):
        list(inputs.documents())


def test_an_output_line_cut_inside_a_utf8_character_is_skipped_as_cut(tmp_path):
    out = tmp_path / "out.jsonl"
    whole = json.dumps({"id": "a", "text": "é", "value": None, "stop_reason": "eos", "stats": {}}, ensure_ascii=False)
    line = json.dumps({"id": "b", "text": "€€", "value": None}, ensure_ascii=False).encode()
    cut = line[: line.index("€".encode()) + 2]  # two of the euro sign's three bytes
    out.write_bytes(whole.encode() + b"\n" + cut + b"\n" + whole.replace('"a"', '"c"').encode() + b"\n" + cut)
    done = read_output(out)
    assert done.ids == {'"a"', '"c"'} and done.ends_cut


# ---- the lock


def test_a_second_lock_on_one_output_is_refused_naming_the_holder_and_the_lock(tmp_path):
    out = tmp_path / "out.jsonl"
    with output_lock(out) as path:
        assert path == lock_path(out) == tmp_path / "out.jsonl.lock"
        holder = json.loads(path.read_text())
        assert (holder["pid"], holder["host"]) == (os.getpid(), socket.gethostname())
        with pytest.raises(OutputBusy) as refused:
            with output_lock(out):
                raise AssertionError("two runs hold one output")
        message = str(refused.value)
        assert "\n" not in message
        assert message.startswith(f"--output {out} is in use by another run: pid {os.getpid()} on host "
                                  f"{socket.gethostname()} since {holder['since']} holds the lock {path}; ")
    assert not path.exists()
    with output_lock(out):  # released: the next run gets it
        pass


def test_a_stale_lock_is_taken_over_with_a_note(tmp_path):
    out = tmp_path / "out.jsonl"
    stale = {"pid": NO_SUCH_PID, "host": socket.gethostname(), "since": "2026-01-01T00:00:00Z"}
    lock_path(out).write_text(json.dumps(stale) + "\n")
    notes = []
    with output_lock(out, notes.append) as path:
        assert json.loads(path.read_text())["pid"] == os.getpid()
    assert notes == [f"--output {out}: taking over the lock {path} left by pid {NO_SUCH_PID} on host "
                     f"{socket.gethostname()} since 2026-01-01T00:00:00Z, a run that ended without releasing it "
                     "(killed)"]
    assert not path.exists()


def test_a_lock_still_held_after_its_holder_died_is_refused_and_says_so(tmp_path):
    import fcntl

    out = tmp_path / "out.jsonl"
    with open(lock_path(out), "w") as held:  # e.g. a child process that inherited the dead run's lock
        held.write(json.dumps({"pid": NO_SUCH_PID, "host": socket.gethostname()}) + "\n")
        held.flush()
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(OutputBusy, match=rf"pid {NO_SUCH_PID} on host .* \(gone; a process it started still "
                                             r"holds the lock\) holds the lock"):
            with output_lock(out):
                pass


def test_a_lock_file_removed_by_its_ending_holder_while_being_taken_is_not_trusted(tmp_path, monkeypatch):
    out = tmp_path / "out.jsonl"
    real, calls = batch_lock._flock, []

    def flock_after_the_holder_ended(fd, operation):
        if not calls:  # the holder removes the file we opened, and a third run creates and holds a new one
            os.unlink(lock_path(out))
            third = os.open(lock_path(out), os.O_RDWR | os.O_CREAT)
            calls.append(third)
            real(third, operation)
        real(fd, operation)

    monkeypatch.setattr(batch_lock, "_flock", flock_after_the_holder_ended)
    with pytest.raises(OutputBusy, match="a run that has not written its pid and host yet holds the lock"):
        with output_lock(out):
            pass
    os.close(calls[0])


def test_the_lock_is_released_when_the_run_stops_on_an_error(files, capsys):
    schema, docs, out = files
    docs.write_bytes(doc(0))
    schema.write_text("{not json")
    assert main(batch(schema, docs, out), load=lambda args: None) == 2
    assert "--schema" in capsys.readouterr().err and not lock_path(out).exists()


# ---- runs


def test_a_batch_with_invalid_bytes_in_the_middle_does_every_other_line(pair, files, capsys):
    schema, docs, out = files
    bad = b'{"id": "bad", "prompt": "\xc3\x28"}\n'
    docs.write_bytes(doc(0) + doc(1) + bad + doc(2) + doc(3))
    assert main(batch(schema, docs, out), load=lambda args: pair) == 0
    err = capsys.readouterr().err
    offset = len(doc(0) + doc(1)) + bad.index(b"\xc3")
    assert (f"{docs}: input line 3: not UTF-8 (byte 0xc3 at byte offset {offset} of the file: invalid "
            "continuation byte)\n") in err
    assert ids_of(out) == ["d0", "d1", "d2", "d3"]
    errors = [json.loads(line) for line in out.read_text().splitlines() if '"error": ' in line]
    assert errors == [{"id": None, "line": 3, "error": f"not UTF-8 (byte 0xc3 at byte offset {offset} of the file: "
                                                       "invalid continuation byte)"}]
    before = out.read_text()
    assert main(batch(schema, docs, out), load=lambda args: pair) == 0
    assert out.read_text() == before


def test_a_second_run_on_the_same_output_is_refused_and_the_first_goes_on(pair, files, monkeypatch):
    schema, docs, out = files
    docs.write_bytes(b"".join(doc(i) for i in range(5)))
    real, seen = assisted.jobs.run.write_line, {}

    def write(*args, **kwargs):
        seen["calls"] = seen.get("calls", 0) + 1
        if seen["calls"] == 3:  # two lines written and flushed: start a second run on the same output, now
            seen["before"] = out.read_bytes()
            seen["second"] = subprocess.run([sys.executable, "-m", "assisted.cli", *one_at_a_time(schema, docs, out)],
                                            cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"},
                                            capture_output=True, text=True, timeout=600)
            seen["after"] = out.read_bytes()
        return real(*args, **kwargs)

    monkeypatch.setattr(assisted.jobs.run, "write_line", write)
    assert main(one_at_a_time(schema, docs, out), load=lambda args: pair) == 0
    second = seen["second"]
    assert second.returncode == 2 and second.stdout == ""
    assert second.stderr.count("\n") == 1, second.stderr
    assert second.stderr.startswith(f"structspec: error: --output {out} is in use by another run: pid {os.getpid()} "
                                    f"on host {socket.gethostname()} since ")
    assert f"holds the lock {out}.lock; " in second.stderr
    assert seen["after"] == seen["before"] and seen["before"].count(b"\n") == 2
    assert out.read_bytes().startswith(seen["before"])
    assert ids_of(out) == [f"d{i}" for i in range(5)]
    assert not lock_path(out).exists()


CHILD = """
import json, sys
import torch
torch.set_num_threads(1)
import assisted.jobs.run
from assisted.cli import main
from tests.helpers_models import smollm2_tokenizer, tiny_llama

pair = tiny_llama(49152, seed=0), smollm2_tokenizer(), tiny_llama(49152, seed=1)
real, calls = assisted.jobs.run.write_line, []

def write(out, record):
    calls.append(1)
    if len(calls) == int(sys.argv[2]):
        print("generating", flush=True)  # the lines before this document's are written and flushed
        sys.stdin.readline()  # wait here for the parent's SIGKILL
    real(out, record)

assisted.jobs.run.write_line = write
sys.exit(main(json.loads(sys.argv[1]), load=lambda args: pair))
"""


def test_a_run_killed_mid_batch_then_rerun_does_every_id_exactly_once(pair, files, tmp_path, capsys):
    schema, docs, out = files
    docs.write_bytes(b"".join(doc(i) for i in range(6)))
    script, log = tmp_path / "child.py", tmp_path / "child.err"
    script.write_text(CHILD)
    with open(log, "w") as stderr:
        child = subprocess.Popen([sys.executable, str(script), json.dumps(one_at_a_time(schema, docs, out)), "4"],
                                 cwd=ROOT,
                                 env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)},
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True)
    try:
        assert child.stdout.readline() == "generating\n", log.read_text()
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.communicate()
    assert child.returncode == -signal.SIGKILL
    killed = out.read_bytes()
    assert ids_of(out) == ["d0", "d1", "d2"]
    assert json.loads(lock_path(out).read_text())["pid"] == child.pid  # left behind, its flock released
    assert main(batch(schema, docs, out), load=lambda args: pair) == 0
    err = capsys.readouterr().err
    assert f"structspec: note: --output {out}: taking over the lock {out}.lock left by pid {child.pid} " in err
    assert "3 written, 3 already done" in err
    assert out.read_bytes().startswith(killed)
    assert ids_of(out) == [f"d{i}" for i in range(6)]
    assert not lock_path(out).exists()


WRITER_CHILD = """
import json, sys
import torch
torch.set_num_threads(1)
import assisted.jobs.run
from assisted.cli import main
from tests.helpers_models import smollm2_tokenizer, tiny_llama

pair = tiny_llama(49152, seed=0), smollm2_tokenizer(), tiny_llama(49152, seed=1)
real, writes = assisted.jobs.run.write_line, []

def write(out, record):
    writes.append(1)
    if len(writes) == int(sys.argv[2]):
        print("writing", flush=True)  # the lines before this one are written and flushed
        sys.stdin.readline()  # wait here for the parent's SIGKILL
    real(out, record)

assisted.jobs.run.write_line = write
sys.exit(main(json.loads(sys.argv[1]), load=lambda args: pair))
"""


def test_a_batched_run_killed_mid_run_then_rerun_does_every_id_exactly_once(pair, files, tmp_path, capsys):
    """`--batch-size 8`: rows finish out of order; a SIGKILL after four lines, then a rerun: every id exactly once,
    the killed run's lines byte for byte first."""
    schema, docs, out = files
    docs.write_bytes(b"".join(doc(i) for i in range(12)))
    script, log = tmp_path / "child.py", tmp_path / "child.err"
    script.write_text(WRITER_CHILD)
    args = [*batch(schema, docs, out), "--batch-size", "8"]
    with open(log, "w") as stderr:
        child = subprocess.Popen([sys.executable, str(script), json.dumps(args), "5"], cwd=ROOT,
                                 env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)},
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True)
    try:
        assert child.stdout.readline() == "writing\n", log.read_text()
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.communicate()
    assert child.returncode == -signal.SIGKILL
    killed = out.read_bytes()
    assert killed.count(b"\n") == 4 and len(set(ids_of(out))) == 4
    assert main(args, load=lambda args: pair) == 0
    assert "8 written, 4 already done" in capsys.readouterr().err
    assert out.read_bytes().startswith(killed)
    assert sorted(ids_of(out)) == sorted(f"d{i}" for i in range(12))  # each once
    assert not lock_path(out).exists()

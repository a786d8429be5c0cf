"""One `structspec batch` run per output file: an exclusive lock on a lock file beside it, for the whole run.

The lock is `fcntl.flock` on ``<output>.lock``, which also holds the holder's pid, host and start time for the
message a second run prints. The kernel releases a flock when its process dies, however it dies, so a lock file
left by a killed run is stale by construction: the next run gets the lock, notes what it takes over, and writes
itself in. A run that ends (normally, on an error or on Ctrl-C) removes the lock file while it still holds the
lock; a run that opened the file just before that removal sees, once it holds the lock, that its file is no
longer the one at the path, and starts again on the new one, so two runs never both hold "the" lock.

The lock is only as good as the file system's flock: local disks and NFS share it between processes and hosts;
some cluster file systems keep it per node or do not support it (then the run stops with an error).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from assisted.jobs.input import BatchError

ATTEMPTS = 5  # lock files replaced under us before we give up (each replacement is a run ending meanwhile)


@dataclass(frozen=True)
class Holder:
    """Who a lock file says holds it (fields are None when the file does not say)."""

    pid: int | None = None
    host: str | None = None
    since: str | None = None

    def describe(self) -> str:
        """`pid 123 on host h since ...`, or what is known of it."""
        if self.pid is None:
            return "a run that has not written its pid and host yet"
        return f"pid {self.pid} on host {self.host}" + (f" since {self.since}" if self.since else "")

    def gone(self) -> bool:
        """Whether the holder is a process of this host that no longer runs."""
        return self.pid is not None and self.host == socket.gethostname() and not _alive(self.pid)


class OutputBusy(BatchError):
    """Another run holds the output's lock."""


def lock_path(output: Path) -> Path:
    """The lock file of `output`: ``<output>.lock`` beside it."""
    return output.with_name(output.name + ".lock")


@contextlib.contextmanager
def output_lock(output: Path, note: Callable[[str], None] = lambda message: None) -> Iterator[Path]:
    """Hold the exclusive lock of `output` for the ``with`` block; yields the lock file's path.

    Parameters
    ----------
    output : Path
        The output file the run appends to (it need not exist yet).
    note : callable
        Called with one line when the lock is taken over from a run that did not release it (killed).

    Raises
    ------
    OutputBusy
        At once, if another run holds the lock: the message names its pid, host and the lock file.
    BatchError
        If the lock file cannot be created or locked.
    """
    path = lock_path(output)
    fd = _acquire(path, output)
    try:
        left = _holder(fd)
        if left != Holder():
            note(f"--output {output}: taking over the lock {path} left by {left.describe()}, a run that "
                 "ended without releasing it (killed)")
        _write_holder(fd)
        yield path
    finally:
        _release(fd, path)


def _acquire(path: Path, output: Path) -> int:
    import fcntl  # POSIX only; imported here so that the rest of the command works without it

    for _ in range(ATTEMPTS):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as error:
            raise BatchError(f"--output {output}: cannot create the lock {path} ({error.strerror or error})") from error
        try:
            _flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            orphan = " (gone; a process it started still holds the lock)" if holder.gone() else ""
            raise OutputBusy(f"--output {output} is in use by another run: {holder.describe()}{orphan} holds the "
                             f"lock {path}; wait for it to end, or stop it and rerun to resume") from None
        except OSError as error:
            os.close(fd)
            raise BatchError(f"--output {output}: cannot lock {path} ({error.strerror or error}); "
                             "choose an --output on a file system with flock") from error
        if _is_at(fd, path):
            return fd
        os.close(fd)  # its holder removed it between our open and our lock: start again on the new one
    raise BatchError(f"--output {output}: the lock {path} was replaced {ATTEMPTS} times while taking it; rerun")


def _flock(fd: int, operation: int) -> None:
    import fcntl

    fcntl.flock(fd, operation)


def _release(fd: int, path: Path) -> None:
    """Remove the lock file while still holding it (unless it is no longer ours), then unlock by closing."""
    try:
        if _is_at(fd, path):
            os.unlink(path)
    except OSError:
        pass  # a lock file left behind is stale, and taken over by the next run
    finally:
        os.close(fd)


def _is_at(fd: int, path: Path) -> bool:
    """Whether the open file `fd` is the file at `path` (not removed or replaced)."""
    try:
        there = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (there.st_dev, there.st_ino) == (mine.st_dev, mine.st_ino)


def _holder(fd: int) -> Holder:
    """The holder the lock file names (its first line is JSON; a half-written or foreign file names no one)."""
    try:
        first = os.pread(fd, 4096, 0).split(b"\n", 1)[0]
        record = json.loads(first) if first.strip() else {}
    except (OSError, ValueError):
        return Holder()
    if not isinstance(record, dict):
        return Holder()
    pid, host, since = record.get("pid"), record.get("host"), record.get("since")
    return Holder(pid if isinstance(pid, int) and not isinstance(pid, bool) else None,
                  None if host is None else str(host), None if since is None else str(since))


def _write_holder(fd: int) -> None:
    """Write this process into the lock file: one JSON line, written over the old text before cutting its tail,
    so that a reader never sees an empty file where a holder was."""
    since = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    line = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": since}).encode() + b"\n"
    os.pwrite(fd, line, 0)
    os.ftruncate(fd, len(line))


def _alive(pid: int) -> bool:
    """Whether a process `pid` runs on this host (one we may not signal counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True

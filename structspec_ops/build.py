"""Build a C++ op library once per machine and load it into torch (`torch.utils.cpp_extension`, cached).

Each library is a set of ``structspec_ops/csrc/*.cpp`` files that register their ops with
``TORCH_LIBRARY_FRAGMENT(structspec, m)``, so they are called as ``torch.ops.structspec.<op>``. The build lands in
torch's extension folder (``$TORCH_EXTENSIONS_DIR``, default ``~/.cache/torch_extensions``) and is rebuilt only when a
source changes. A failed build gives a `Built` that says why in one line and names a log file holding the compiler's
whole output; the caller falls back. The code of each op picks its instructions at run time from the CPU's cpuid (no
/proc/cpuinfo), so a library builds on any x86 CPU with g++ and ninja (the `ninja` package is a dependency; its binary
is put on PATH).

A build killed half way (Ctrl-C, a killed worker, a test timeout) leaves torch's lock file behind, on which every
later load would wait forever: a lock older than `STALE_LOCK_SECONDS` is removed with a warning, and a younger one
is waited on at most until it is that old.
"""

from __future__ import annotations

import functools
import hashlib
import os
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

CSRC = Path(__file__).resolve().parent / "csrc"
STALE_LOCK_SECONDS = 600.0  # far longer than a build takes here (about a minute on 2 cores)


@dataclass(frozen=True)
class Built:
    """Whether a library of ops is loaded: ``ok``, else ``reason`` (one line, for stats and errors)."""

    name: str
    ok: bool
    reason: str = ""


def build_directory(name: str) -> Path:
    """Where torch builds the library `name` (``structspec_<name>`` under its extension folder)."""
    from torch.utils import cpp_extension

    return Path(cpp_extension._get_build_directory(f"structspec_{name}", verbose=False))


def break_stale_lock(folder: Path, stale_after: float = STALE_LOCK_SECONDS, clock=time.time, sleep=time.sleep) -> bool:
    """Wait for a build lock in `folder` until it is `stale_after` seconds old, then remove it with a warning.

    Returns True when a stale lock was removed. `clock` and `sleep` are injectable (tests).
    """
    lock = folder / "lock"
    while True:
        try:
            age = clock() - lock.stat().st_mtime
        except FileNotFoundError:
            return False
        if age >= stale_after:
            warnings.warn(f"removing a stale build lock {lock} ({age:.0f} s old: a build was killed half way)",
                          stacklevel=3)
            lock.unlink(missing_ok=True)
            return True
        sleep(min(1.0, stale_after - age))


def _ninja_on_path() -> None:
    """Put the `ninja` package's binary on PATH (torch calls ``ninja`` by name) where it is installed."""
    try:
        import ninja
    except ImportError:
        return
    folder = str(getattr(ninja, "BIN_DIR", ""))
    if folder and folder not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = os.pathsep.join(filter(None, (folder, os.environ.get("PATH"))))


def _failed(name: str, error: Exception) -> Built:
    """A failed build: the whole message in a log file beside the build, one line of it in the reason."""
    text = str(error).strip() or type(error).__name__
    lines = text.splitlines()
    lines = [line for line in lines if "error:" in line] or [line for line in lines if "error" in line.lower()] or lines
    try:
        log = build_directory(name) / "build-error.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(text + "\n")
        where = f" (full output: {log})"
    except OSError:
        where = ""
    return Built(name, False, f"the C++ op library {name!r} did not build: {lines[0].strip()[:200]}{where}")


@functools.cache
def sources_digest() -> str:
    """A digest of every C++ source and header in csrc: what the op libraries of this copy compute, and how fast
    (`assisted.policy.costs` keys the forward costs it remembers on disk by it)."""
    files = sorted(CSRC.glob("*.cpp")) + sorted(CSRC.glob("*.h"))
    return hashlib.sha256(b"".join(p.name.encode() + p.read_bytes() for p in files)).hexdigest()[:16]


def _headers_flag() -> str:
    """A define naming a digest of csrc's headers: torch rebuilds a library when its sources or flags change, and
    reads no header, so a changed header changes the flags."""
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sorted(CSRC.glob("*.h")))).hexdigest()[:16]
    return f"-DSTRUCTSPEC_HEADERS=0x{digest}"


@functools.cache
def load(name: str, sources: tuple[str, ...], cflags: tuple[str, ...] = ()) -> Built:
    """Build (once per machine) and load the library `name` from ``structspec_ops/csrc/<sources>``.

    Parameters
    ----------
    name : str
        The library's name (``structspec_<name>`` in torch's extension folder).
    sources : tuple of str
        File names under ``structspec_ops/csrc``.
    cflags : tuple of str
        Extra compiler flags (``-O3`` is always given).
    """
    try:
        from torch.utils import cpp_extension

        _ninja_on_path()
        folder = build_directory(name)
        folder.mkdir(parents=True, exist_ok=True)
        break_stale_lock(folder)
        cpp_extension.load(name=f"structspec_{name}", sources=[str(CSRC / s) for s in sources],
                           extra_cflags=["-O3", *cflags, _headers_flag()], is_python_module=False, verbose=False)
    except Exception as error:  # a compiler, ninja or header missing: the caller falls back
        return _failed(name, error)
    return Built(name, True)

"""Build a C++ op library once per machine and load it into torch (`torch.utils.cpp_extension`, cached).

Each library is a set of ``kernels/csrc/*.cpp`` files that register their ops with ``TORCH_LIBRARY_FRAGMENT(structspec,
m)``, so they are called as ``torch.ops.structspec.<op>``. The build lands in torch's extension folder
(``$TORCH_EXTENSIONS_DIR``, default ``~/.cache/torch_extensions``) and is rebuilt only when a source changes; a failed
build or a CPU without the instructions an op needs gives a `Built` that says why, in one line, and the caller falls
back.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

CSRC = Path(__file__).resolve().parent / "csrc"


@dataclass(frozen=True)
class Built:
    """Whether a library of ops is loaded: ``ok``, else ``reason`` (one line, for stats and errors)."""

    name: str
    ok: bool
    reason: str = ""


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as Linux lists them (empty where /proc/cpuinfo is not readable)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    line = next((row for row in text.splitlines() if row.startswith("flags")), "")
    return frozenset(line.partition(":")[2].split())


@functools.cache
def load(name: str, sources: tuple[str, ...], cflags: tuple[str, ...] = (), needs: tuple[str, ...] = ()) -> Built:
    """Build (once per machine) and load the library `name` from ``kernels/csrc/<sources>``.

    Parameters
    ----------
    name : str
        The library's name (``structspec_<name>`` in torch's extension folder).
    sources : tuple of str
        File names under ``kernels/csrc``.
    cflags : tuple of str
        Extra compiler flags (``-O3`` is always given).
    needs : tuple of str
        CPU flags (as /proc/cpuinfo names them) the library's code requires; without one it is not built.
    """
    missing = [flag for flag in needs if flag not in cpu_flags()]
    if missing:
        return Built(name, False, f"this CPU lacks {', '.join(missing)}")
    try:
        from torch.utils import cpp_extension

        cpp_extension.load(name=f"structspec_{name}", sources=[str(CSRC / s) for s in sources],
                           extra_cflags=["-O3", *cflags], is_python_module=False, verbose=False)
    except Exception as error:  # a compiler, ninja or header missing: the caller falls back
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        return Built(name, False, f"the C++ op library {name!r} did not build: {first[:200]}")
    return Built(name, True)

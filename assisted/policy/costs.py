"""What forwards cost on one device, measured online: the cost-aware policy's model of time.

`CostTable` keeps a decayed mean of the target's forward seconds per n (tokens fed to one forward) and
of the assistant's seconds per drafted token. The cost of verifying n tokens is not a line: on a CPU the
step from 1 to 2 tokens can double it (matrix-vector becomes matrix-matrix) and later tokens add little,
on a GPU it is flat up to a few dozen; with packed weights (`assisted.models.packing`) it can even fall (a packed
forward over a few tokens can cost less than a dense one-token step). So `curve` interpolates linearly
between the n it has measured, as measured (a dip is kept: there, verifying a few more drafts is cheaper than
verifying none), and past the largest measured n holds that cost: optimistic, so that a longer verification
is tried once when the drafts look good, and is then measured. A timing that noise made too cheap corrects
itself, as the policy then verifies that many tokens and times them again.

Costs belong to a (target, assistant, device) rather than to one call, so `generate` keeps a call's table for the
next call on the same pair (`recall` / `memorize`), in memory and in a small file per pair, machine and code
(`cost_dir`; the models named by their architecture and size, the machine by its CPU model, the code by the package
version and a digest of the C++ ops' sources, so that costs measured on other kernels are never recalled): only the
first call on a pair on a machine pays the warm-up, not the first call of every process. The table also keeps what
the assistant's first call in a call costs per position it catches up on (its prefill: the assistant starts lazily)
and the drafting rate earlier calls measured, so that a call can weigh starting the assistant at all. The mean
acceptance is not kept: it belongs to the text. How often a draft of a given confidence is accepted belongs mostly to
the pair and the sampling setting (per confidence bin, code, extraction and prose differ little), so the policy's
calibration is kept per pair and sampling setting (`recall_calibration`, in memory). `forget` (public as
`assisted.reset_remembered_state`) clears both, and the files. One lock guards both registries: concurrent `generate`
calls from several threads read and write them safely (the last call to finish on a pair is remembered).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import math
import os
import platform
import tempfile
import threading
import weakref
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch

from assisted.models.int4_models import linear_kernels
from assisted.models.packing import is_packed
from fsm.vocabulary_cache import cache_folder
from structspec_ops.build import sources_digest

N_MAX = 64  # forwards over more tokens than this per row (prompt prefills) are not recorded


@dataclass(frozen=True)
class StepCost:
    """Wall times of one decoding step, as the loop measured them around calls it makes anyway."""

    target_tokens: int  # tokens fed to the target forward (uncached + draft; the bonus row is the last); 0: none
    target_seconds: float  # that forward's wall time
    drafted: int  # assistant tokens drafted (one assistant forward each), verified or cut
    draft_seconds: float  # their wall time

    @property
    def seconds(self) -> float:
        return self.target_seconds + self.draft_seconds


@dataclass(frozen=True)
class CostTable:
    """Decayed means: target seconds per forward over n tokens, assistant seconds per drafted token."""

    target: tuple[tuple[int, float, float], ...] = ()  # (n, mean seconds, weight), sorted by n
    draft_per_token: float | None = None  # None: not measured yet
    catch_up: float | None = None  # assistant seconds per position of its first call in a call (its prefill)
    drafting_rate: float | None = None  # tokens per second of the drafting steps of earlier calls on the pair

    def with_target(self, n: int, seconds: float, decay: float, limit: int = N_MAX) -> CostTable:
        """The table after one forward over n tokens took `seconds` (older timings at n fade by `decay`); forwards
        over more than `limit` are not recorded."""
        if not 0 < n <= limit:
            return self
        rows = {m: (mean, weight) for m, mean, weight in self.target}
        mean, weight = rows.get(n, (0.0, 0.0))
        weight = decay * weight + 1.0
        rows[n] = (mean + (seconds - mean) / weight, weight)
        return replace(self, target=tuple((m, *rows[m]) for m in sorted(rows)))

    def with_draft(self, seconds_per_token: float, decay: float) -> CostTable:
        return replace(self, draft_per_token=_decayed(self.draft_per_token, seconds_per_token, decay))

    def with_catch_up(self, seconds_per_position: float, decay: float) -> CostTable:
        return replace(self, catch_up=_decayed(self.catch_up, seconds_per_position, decay))

    def with_drafting_rate(self, tokens_per_second: float, decay: float) -> CostTable:
        return replace(self, drafting_rate=_decayed(self.drafting_rate, tokens_per_second, decay))

    def measured(self) -> tuple[int, ...]:
        """The n with at least one timing."""
        return tuple(n for n, _, _ in self.target)

    def knows(self, n: int) -> bool:
        """Whether the table prices a forward over n tokens from timings at or above n: n itself was timed, or two
        larger sizes were (n then lies on their line, `curve`). In a batch most forwards are wider than its rows
        (forced tokens and prompt-lookup copies are positions too), so the plain forward itself may never run."""
        return n in self.measured() or sum(m > n for m in self.measured()) >= 2

    def curve(self, n_max: int, rows: int = 1) -> np.ndarray:
        """(n_max + 1,) target seconds of a forward over `rows` rows of n tokens each, n = 0..n_max ([0] = 0):
        interpolated between measured sizes; below the smallest, on the line through the two smallest (never
        rising as n falls, never below 0); flat past the largest."""
        if not self.target:
            return np.zeros(n_max + 1)
        xs = np.array([n for n, _, _ in self.target], dtype=float)
        ys = np.array([mean for _, mean, _ in self.target])
        at = np.arange(n_max + 1, dtype=float) * rows
        out = np.interp(at, xs, ys)
        if len(xs) > 1:
            slope = max((ys[1] - ys[0]) / (xs[1] - xs[0]), 0.0)
            below = at < xs[0]
            out[below] = np.maximum(ys[0] - slope * (xs[0] - at[below]), 0.0)
        out[0] = 0.0
        return out


def _decayed(old: float | None, new: float, decay: float) -> float:
    return new if old is None else decay * old + (1 - decay) * new


# target -> {assistant | _ALONE: (device key, CostTable)}
_MEMORY: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# target -> {assistant | _ALONE: {warp: calibration}}
_CALIBRATIONS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()  # guards _MEMORY and _CALIBRATIONS


class _Alone:
    """Stands for "no assistant" as a weak key."""


_ALONE = _Alone()


def _device_key(model, engine: str) -> tuple:
    p = next(model.parameters())
    return str(p.device), str(p.dtype), torch.get_num_threads(), is_packed(model), linear_kernels(model), engine


def recall(target, assistant, engine: str = "dynamic") -> CostTable | None:
    """The costs earlier calls measured on this pair, if the target still runs on the same device, dtype, threads,
    weight layout (`assisted.models.packing`), Linear kernels (float, int8, int4:
    `assisted.models.int4_models.linear_kernels`; a model quantized in place is another target) and engine
    (`assisted.caching.CachePlan.engine`: a captured step costs a fraction of an eager one): this process's, else
    those an earlier process on this machine left in `cost_dir`."""
    device = _device_key(target, engine)
    with _LOCK:
        pairs = _MEMORY.get(target)
        entry = None if pairs is None else pairs.get(_ALONE if assistant is None else assistant)
    if entry is not None and entry[0] == device:
        return entry[1]
    costs = _read(_cost_file(target, assistant, device))
    if costs is not None:
        with _LOCK:
            _MEMORY.setdefault(target, weakref.WeakKeyDictionary())[_ALONE if assistant is None else assistant] = (
                device, costs)
    return costs


def recall_calibration(target, assistant, warp) -> object | None:
    """What earlier calls on this pair, sampling with `warp`, learned about how often drafts of a given confidence
    are accepted (any device: it belongs to the models and the sampling, not to the hardware)."""
    with _LOCK:
        pairs = _CALIBRATIONS.get(target)
        entry = None if pairs is None else pairs.get(_ALONE if assistant is None else assistant)
        return None if entry is None else entry.get(warp)


def memorize(target, assistant, costs: CostTable | None, calibration: object | None = None, warp=None,
             engine: str = "dynamic") -> None:
    """Keep a call's costs (and its policy's calibration under `warp`) for the next call on the pair."""
    key, device = (_ALONE if assistant is None else assistant), _device_key(target, engine)
    with _LOCK:
        if costs is not None:
            _MEMORY.setdefault(target, weakref.WeakKeyDictionary())[key] = (device, costs)
        if calibration is not None:
            _CALIBRATIONS.setdefault(target, weakref.WeakKeyDictionary()).setdefault(key, {})[warp] = calibration
    if costs is not None:
        _write(_cost_file(target, assistant, device), costs)


def forget() -> None:
    """Drop every remembered cost and calibration, for every model pair, in memory and on disk (`cost_dir`; public as
    `assisted.reset_remembered_state`).

    The next `schedule="auto"` call on any pair warms up again, as a machine's first call on a pair does.
    Safe to call while other threads generate: their calls remember what they measure when they finish.
    """
    with _LOCK:
        _MEMORY.clear()
        _CALIBRATIONS.clear()
    folder = cost_dir()
    for file in [] if folder is None or not folder.is_dir() else folder.glob("costs-*.json"):
        file.unlink(missing_ok=True)


def cost_dir() -> Path | None:
    """The folder of the remembered costs: ``$STRUCTSPEC_COST_CACHE``, else ``$STRUCTSPEC_CACHE/costs``, else
    ``~/.cache/structured-speculation/costs``; None where ``STRUCTSPEC_COST_CACHE=off`` (costs live in memory only)."""
    return cache_folder("STRUCTSPEC_COST_CACHE", "costs")


def _cost_file(target, assistant, device: tuple) -> Path | None:
    """The pair's file on this machine: named by the models' architecture and size, the device key and the CPU."""
    folder = cost_dir()
    if folder is None:
        return None
    names = [_model_name(target), None if assistant is None else _model_name(assistant), device, _machine(), _code()]
    return folder / f"costs-{hashlib.sha256(json.dumps(names, default=str).encode()).hexdigest()[:32]}.json"


def _model_name(model) -> list:
    config = model.config
    return [type(model).__name__, getattr(config, "_name_or_path", ""), config.to_json_string(use_diff=False),
            sum(p.numel() for p in model.parameters())]


def _code() -> str:
    """The package version and the C++ ops' sources digest: another copy of the kernels measures other costs."""
    return f"{_version()} {sources_digest()}"


@functools.cache
def _version() -> str:
    """This package's installed version (read once: a metadata lookup takes about a millisecond)."""
    try:
        return importlib.metadata.version("structured-speculation")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _machine() -> str:
    """The CPU's model name (Linux), else what `platform` knows, and the number of CPUs."""
    try:
        with open("/proc/cpuinfo") as info:
            name = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), "")
    except OSError:
        name = ""
    return f"{name or platform.processor() or platform.machine()} x{os.cpu_count()}"


def _write(file: Path | None, costs: CostTable) -> None:
    """Write the table whole or not at all (a temporary file renamed over the old one); errors are ignored: the file
    only saves a later process its warm-up."""
    if file is None:
        return
    temporary = None
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=file.parent, prefix=file.stem + ".", suffix=".tmp")
        with os.fdopen(handle, "w") as out:
            json.dump(asdict(costs), out)
        os.replace(temporary, file)
    except OSError:
        if temporary is not None:
            Path(temporary).unlink(missing_ok=True)


def _read(file: Path | None) -> CostTable | None:
    """The table in `file`, or None where there is none or it is not a whole, sane table."""
    if file is None:
        return None
    try:
        fields = json.loads(file.read_text())
        target = tuple((int(n), float(mean), float(weight)) for n, mean, weight in fields["target"])
        rest = {name: None if fields[name] is None else float(fields[name])
                for name in ("draft_per_token", "catch_up", "drafting_rate")}
    except (OSError, ValueError, TypeError, KeyError):
        return None
    numbers = [x for row in target for x in row[1:]] + [x for x in rest.values() if x is not None]
    if not all(math.isfinite(x) and x >= 0 for x in numbers) or any(n <= 0 for n, _, _ in target):
        return None
    return CostTable(target=target, **rest)

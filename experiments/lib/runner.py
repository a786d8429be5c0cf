"""The benchmarks' one runner: every (repeat, unit) runs every system, the order rotated per unit so slow phases of a
shared machine hit all systems alike; each call timed, a failing system recorded rather than raised; then systems
paired per unit (`paired`, over `experiments.lib.intervals.paired_ratio`)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator, Sequence

from experiments.lib.intervals import paired_ratio

SystemsOf = Sequence[str] | Callable[[object], Sequence[str]]  # the systems of every unit, or unit -> its systems


def rotated(systems: Sequence[str], i: int) -> tuple[str, ...]:
    """`systems` starting at position i (mod their number)."""
    i %= len(systems)
    return (*systems[i:], *systems[:i])


def interleaved(units: Sequence, systems: SystemsOf, repeats: int = 1) -> Iterator[tuple[int, object, str]]:
    """(repeat, unit, system) in run order: repeats outermost, every unit once per repeat, and at the i-th
    (repeat, unit) every system, in the order `rotated(systems, i)` (`systems`: a list, or unit -> its list)."""
    pairs = [(r, u) for r in range(repeats) for u in units]
    for i, (repeat, unit) in enumerate(pairs):
        for system in rotated(systems(unit) if callable(systems) else systems, i):
            yield repeat, unit, system


def timed(call: Callable[[], object]) -> tuple[float, object, str]:
    """(wall seconds, `call()`'s result or None, "" or the error it raised in one line)."""
    start = time.perf_counter()
    try:
        result, error = call(), ""
    except Exception as exc:  # noqa: BLE001  a system failing is a result to record, not a crash
        result, error = None, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:120]
    return time.perf_counter() - start, result, error


def run(units: Sequence, systems: SystemsOf, call: Callable[[object, str, int], dict], repeats: int = 1,
        log: Callable[[dict], str] | None = None) -> list[dict]:
    """One row per (repeat, unit, system) in `interleaved` order: {"repeat": r, "system": s, **call(unit, s, r)}.
    `log(row)`: a line printed to stderr after each row."""
    rows = []
    for repeat, unit, system in interleaved(units, systems, repeats):
        rows.append({"repeat": repeat, "system": system, **call(unit, system, repeat)})
        if log is not None:
            print(log(rows[-1]), file=sys.stderr)
    return rows


def paired(rows: list[dict], judged: str, keys: Sequence[str], value: Callable[[dict], float] = lambda r: r["seconds"],
           level: float = 0.9) -> dict[str, tuple[float, float, float]]:
    """`judged` paired with every other system over the units (`keys` of a row) both ran: {other: (geometric mean of
    other's value / judged's, low, high)} at `level` (> 1: judged is smaller, i.e. faster)."""
    by_unit: dict = {}
    for r in rows:
        by_unit.setdefault(tuple(r[k] for k in keys), {})[r["system"]] = value(r)
    others = list(dict.fromkeys(r["system"] for r in rows if r["system"] != judged))
    found = {}
    for other in others:
        pairs = [(u[other], u[judged]) for u in by_unit.values() if other in u and judged in u]
        if pairs:
            found[other] = paired_ratio(pairs, level)
    return found


def span(ratio: tuple[float, float, float]) -> str:
    """"1.23x [1.01, 1.50]" (no interval for one unit)."""
    r, low, high = ratio
    return f"{r:.2f}x" if low != low else f"{r:.2f}x [{low:.2f}, {high:.2f}]"

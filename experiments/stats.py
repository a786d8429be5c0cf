"""How sure a speedup cell is: paired ratios of two systems with a t-interval.

A sampled cell holds one text per (prompt, repeat) unit and system, and texts differ per system (a lucky text
is accepted at 0.9, an unlucky one at 0.3), so a ratio of medians over three units can move by 30% between
runs. Pairing the two systems' runs of a unit (same prompt, seed and moment of the machine) and putting an
interval on the mean log ratio says whether a difference is larger than that.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
from scipy import stats


def paired_ratio(pairs: list[tuple[float, float]], level: float = 0.9) -> tuple[float, float, float]:
    """Geometric mean of x / y over (x, y) pairs, with a `level` Student-t interval on the mean log ratio.

    Parameters
    ----------
    pairs : list of (float, float)
        Per unit, the seconds per token of two systems (x: the other system, y: the one judged).
    level : float
        Two-sided coverage of the interval.

    Returns
    -------
    (ratio, low, high) : > 1 where y is faster; the interval is (nan, nan) for fewer than two pairs.
    """
    if not pairs:
        raise ValueError("paired_ratio needs at least one pair")
    logs = np.log([x / y for x, y in pairs])  # (units,)
    mean = float(logs.mean())
    if len(logs) < 2:
        return math.exp(mean), math.nan, math.nan
    half = stats.t.ppf((1 + level) / 2, len(logs) - 1) * logs.std(ddof=1) / math.sqrt(len(logs))
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def pooled_table(folders: list[Path], system: str = "ours-auto") -> list[str]:
    """Markdown: `system` paired with each other system over the units of several speedup runs, by group."""
    from experiments.speedup import SYSTEMS, read_rows, units as units_of

    units = {(folder.name, *key): unit for folder in folders  # (run, class, T, prompt, repeat) -> {system: s/token}
             for key, unit in units_of(read_rows(folder / "results.csv")).items()}
    others = [s for s in SYSTEMS if s != system]
    classes, temperatures = sorted({k[1] for k in units}), sorted({k[2] for k in units})
    groups = [("all", lambda k: True), *((c, lambda k, c=c: k[1] == c) for c in classes),
              *((f"T = {t}", lambda k, t=t: k[2] == t) for t in temperatures)]
    lines = ["| units | n | " + " | ".join(others) + " |", "|---" * (len(others) + 2) + "|"]
    for name, member in groups:
        chosen = [u for k, u in units.items() if member(k)]
        cells = (paired_ratio([(u[s], u[system]) for u in chosen]) for s in others)
        lines.append(f"| {name} | {len(chosen)} | " + " | ".join(f"{r:.2f} [{lo:.2f}, {hi:.2f}]" for r, lo, hi in cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.stats",
                                description="ours-auto paired with each system over the units of speedup runs "
                                            "(geometric mean of the other's seconds per token / ours-auto's, 90% t-interval)")
    p.add_argument("runs", type=Path, nargs="+", help="speedup result folders (each with a results.csv)")
    args = p.parse_args(argv)
    print("\n".join(pooled_table(args.runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Paired speed ratios with intervals: how the experiments compare two systems over the same units, and their
tables pooled per class and per temperature."""

from __future__ import annotations

import math

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


def grouped(units: dict, order, system: str = "ours-auto") -> tuple[list[str], list[tuple[str, int, dict]]]:
    """`system` paired with each other system over all units, per class and per temperature.

    Parameters
    ----------
    units : dict
        (..., class, T, prompt, repeat) -> {system: seconds per token}.
    order : sequence of str
        The systems in the order the columns take; those every unit holds, except `system`, are compared.

    Returns
    -------
    (others, groups) : the other systems, and per group ("all", each class, "T = t" per temperature) its name,
    its number of units and {other: (ratio, low, high)} from `paired_ratio`.
    """
    held = set.intersection(*(set(u) for u in units.values())) if units else set()
    others = [s for s in order if s != system and s in held]
    classes, temperatures = sorted({k[-4] for k in units}), sorted({k[-3] for k in units})
    members = [("all", lambda k: True), *((c, lambda k, c=c: k[-4] == c) for c in classes),
               *((f"T = {t}", lambda k, t=t: k[-3] == t) for t in temperatures)]
    groups = []
    for name, member in members:
        chosen = [u for k, u in units.items() if member(k)]
        groups.append((name, len(chosen), {s: paired_ratio([(u[s], u[system]) for u in chosen]) for s in others}))
    return others, groups


def table(others: list[str], groups: list[tuple[str, int, dict]]) -> list[str]:
    """Markdown of `pooled`'s (others, groups): one row per group, one column per other system."""
    lines = ["| units | n | " + " | ".join(others) + " |", "|---" * (len(others) + 2) + "|"]
    for name, n, ratios in groups:
        cells = ("{:.2f} [{:.2f}, {:.2f}]".format(*ratios[s]) for s in others)
        lines.append(f"| {name} | {n} | " + " | ".join(cells) + " |")
    return lines

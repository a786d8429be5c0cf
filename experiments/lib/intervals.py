"""Paired speed ratios with intervals: how the experiments compare two systems over the same units."""

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

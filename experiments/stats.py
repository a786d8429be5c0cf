"""How sure a speedup cell is: paired ratios of two systems with a t-interval.

A sampled cell holds one text per (prompt, repeat) unit and system, and texts differ per system (a lucky text
is accepted at 0.9, an unlucky one at 0.3), so a ratio of medians over three units can move by 30% between
runs. Pairing the two systems' runs of a unit (same prompt, seed and moment of the machine) and putting an
interval on the mean log ratio says whether a difference is larger than that.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from experiments.lib.intervals import grouped, table


def pooled(folders: list[Path], system: str = "ours-auto") -> tuple[list[str], list[tuple[str, int, dict]]]:
    """`system` paired with each other system over the units of several speedup runs, by group.

    Returns
    -------
    (others, groups) : the other systems, and per group ("all", each class, "T = t" per temperature) its name,
    its number of units and {other: (ratio, low, high)} from `paired_ratio`.
    """
    from experiments.speedup import SYSTEMS, read_rows, units as units_of

    units = {(folder.name, *key): unit for folder in folders  # (run, class, T, prompt, repeat) -> {system: s/token}
             for key, unit in units_of(read_rows(folder / "results.csv")).items()}
    return grouped(units, SYSTEMS, system)


def plot_pooled(others: list[str], groups: list[tuple[str, int, dict]], out: Path, title: str,
                system: str = "ours-auto") -> None:
    """A PNG of `pooled`'s (others, groups): per class and per temperature, `system`'s speedup over each other
    drafting system (the paired geometric mean) with its 90% interval, against a line at 1. The target alone is
    left out (the speedup plots show it): its scale would flatten the rest."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    others = [s for s in others if s != "target"]
    panels = [[g for g in groups if g[0] != "all" and not g[0].startswith("T = ")],
              [g for g in groups if g[0].startswith("T = ")]]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True, gridspec_kw={"width_ratios": [3, 5]})
    for ax, panel in zip(axes, panels):
        for j, other in enumerate(others):
            x = [i + (j - (len(others) - 1) / 2) * 0.12 for i in range(len(panel))]
            ratio, low, high = np.array([g[2][other] for g in panel]).T  # (groups,) each
            ax.errorbar(x, ratio, yerr=[ratio - low, high - ratio], fmt="o", capsize=3, label=other)
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_xticks(range(len(panel)), [f"{g[0]}\n({g[1]} units)" for g in panel])
    axes[0].set_ylabel(f"{system}'s speedup over each system\n(paired geometric mean, 90% interval)")
    axes[1].legend(title="over", fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.stats",
                                description="ours-auto paired with each system over the units of speedup runs "
                                            "(geometric mean of the other's seconds per token / ours-auto's, "
                                            "90% t-interval)")
    p.add_argument("runs", type=Path, nargs="+", help="speedup result folders (each with a results.csv)")
    p.add_argument("--plot", type=Path, default=None, help="also write the table as a PNG plot to this path")
    args = p.parse_args(argv)
    others, groups = pooled(args.runs)  # read once for the table and the plot
    print("\n".join(table(others, groups)))
    if args.plot:
        plot_pooled(others, groups, args.plot,
                    f"ours-auto paired with each system over {groups[0][1]} units of {len(args.runs)} runs")
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The benchmarks' one report writer: a run folder holds results.csv (one row per generation or timing) and a
README.md that starts with the command, date, machine, versions and commit, then the study's tables."""

from __future__ import annotations

import csv
import datetime
import os
import platform
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def cpu_name() -> str:
    """The CPU model from /proc/cpuinfo, else what `platform` knows."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def git(*args: str) -> str:
    """A git command's output in this repository ('' when git fails)."""
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()


STARTED_AT = git("describe", "--always", "--dirty") or "unknown"  # the commit of the code this process imported


def machine_lines() -> list[str]:
    """README lines naming the machine (its CPU and vector ISA decide what a verification costs) and the commit of
    the code the run imported (taken at import: a long run's README is written after later commits)."""
    import torch
    isa = torch.backends.cpu.get_cpu_capability()
    return [f"- machine: {platform.node()} ({cpu_name() or platform.machine()}, torch CPU capability {isa}, "
            f"{os.cpu_count()} CPUs, shared with other jobs: noisy)", f"- code: commit {STARTED_AT}"]


def run_lines(module: str, argv: list[str], *versions: str) -> list[str]:
    """README lines every run starts with: its command, date, machine and commit, and the versions it ran on
    (`versions`: more "name version" entries, e.g. "xgrammar 0.2.8")."""
    import torch
    import transformers
    stack = [f"torch {torch.__version__}", f"transformers {transformers.__version__}", *versions,
             f"python {platform.python_version()}", f"torch threads {torch.get_num_threads()}"]
    return [f"- command: `python -m {module} {' '.join(argv)}`", f"- date: {datetime.date.today().isoformat()}",
            *machine_lines(), "- " + ", ".join(stack), *load_lines()]


def package_version(name: str) -> str | None:
    """An installed package's version (None where it is not installed)."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def load_lines() -> list[str]:
    """A README line of what loading the models cost (seconds, the process's peak memory, how each model was
    made: `assisted.models.loading.last_load`), where this process loaded a pair."""
    from assisted.models.loading import describe_load, last_load
    return [f"- models {describe_load()}"] if last_load() else []


def write_rows(path: Path, rows: list[dict], fields, digits: int | None = 4, append: bool = False) -> None:
    """One CSV row per generation, floats rounded to `digits` (None: as they are; the benchmarks' results.csv);
    keys not in `fields` are left out. `append`: add the rows to `path` (the header only where it is new), as a
    run that can be resumed writes each unit as it ends."""
    fresh = not (append and path.exists())
    with open(path, "a" if append else "w", newline="") as f:
        w = csv.DictWriter(f, fields, extrasaction="ignore")
        if fresh:
            w.writeheader()
        w.writerows({k: (round(v, digits) if digits is not None and isinstance(v, float) else v)
                     for k, v in r.items()} for r in rows)


def read_rows(path: Path, text: tuple[str, ...] = ()) -> list[dict]:
    """The rows of a results.csv: numbers back as int or float, the columns in `text` (and anything not a number)
    as strings."""
    def typed(key: str, value: str):
        if key in text:
            return value
        for kind in (int, float):
            try:
                return kind(value)
            except ValueError:
                pass
        return {"True": True, "False": False}.get(value, value)
    with open(path, newline="") as f:
        return [{k: typed(k, v) for k, v in row.items()} for row in csv.DictReader(f)]


def write_run(out: Path, title: str, head: list[str], body: list[str], rows: list[dict] | None = None,
              fields=None) -> None:
    """`out`/README.md: `# title`, the `head` lines (`run_lines` and the setup), then `body`; and `out`/results.csv
    when `rows` are given."""
    out.mkdir(parents=True, exist_ok=True)
    if rows is not None:
        write_rows(out / "results.csv", rows, fields or list(rows[0]))
    (out / "README.md").write_text("\n".join([f"# {title}", "", *head, "", *body]) + "\n")


def pyplot():
    """matplotlib's pyplot on the Agg backend (files only, no display)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save_figure(fig, path: Path, dpi: int = 110, rect=None) -> None:
    """Lay `fig` out (within `rect` of the figure when given), write it to `path` and close it."""
    fig.tight_layout(**({} if rect is None else {"rect": rect}))
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)


def bar_groups(ax, groups: list, systems: list, height, label=str) -> None:
    """Side-by-side bars on `ax`: per group one bar per system, `height(group, system)` high, named `label(system)`."""
    width = 0.8 / len(systems)
    for j, system in enumerate(systems):
        ax.bar([i + j * width for i in range(len(groups))], [height(g, system) for g in groups], width,
               label=label(system))
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(groups))], groups)


def table(header: list[str], rows: list[list]) -> list[str]:
    """A markdown table."""
    return ["| " + " | ".join(header) + " |", "|---" * len(header) + "|",
            *("| " + " | ".join(str(c) for c in row) + " |" for row in rows)]

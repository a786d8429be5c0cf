"""What a results README says about the machine and the code: runs compare only with runs like them."""

from __future__ import annotations

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
    """README lines naming the machine (the CPU and its vector ISA decide what a verification costs) and the
    commit of the code the run imported (taken when this module is imported: a long run's README is
    written after later commits)."""
    import torch

    isa = torch.backends.cpu.get_cpu_capability()
    commit = STARTED_AT
    return [f"- machine: {platform.node()} ({cpu_name() or platform.machine()}, torch CPU capability {isa}, "
            f"{os.cpu_count()} CPUs, shared with other jobs: noisy)", f"- code: commit {commit}"]


def run_lines(module: str, argv: list[str], *versions: str) -> list[str]:
    """README lines every run starts with: its command, date, machine and commit, and the versions it ran on
    (`versions`: more "name version" entries, e.g. "xgrammar 0.2.8")."""
    import datetime

    import torch
    import transformers

    stack = [f"torch {torch.__version__}", f"transformers {transformers.__version__}", *versions,
             f"python {platform.python_version()}", f"torch threads {torch.get_num_threads()}"]
    return [f"- command: `python -m {module} {' '.join(argv)}`", f"- date: {datetime.date.today().isoformat()}",
            *machine_lines(), "- " + ", ".join(stack)]

"""A process pool that forks one child per task and kills a child that runs past its time or memory.

`concurrent.futures` cannot stop one stuck task (a pathological schema can compile for minutes),
so each task gets its own forked child: it inherits the already loaded tokenizer and vocabulary
(copy-on-write, nothing to pickle), starts with empty fsm caches (compile times are honest) and its
peak RSS belongs to this one task. A child reports stage changes ("compile:regex", "compile:dfa",
..., "walk"); each major stage (the part before ":") gets its own `timeout`, so a slow walk is not
blamed on compilation, and a timeout names the sub-stage it hit.

The limit is on the child's CPU time (user + system), so that other jobs on a shared machine do
not turn slow schemas into timeouts; a wall-clock backstop of `wall_factor` x `timeout` catches a
child that sleeps or starves.
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import time
import traceback
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Callable, Iterable, Iterator

Work = Callable[[str, Callable[[str], None]], dict]  # (task, report_stage) -> result


@dataclass(frozen=True)
class Outcome:
    """How one task ended: kind is "done", "timeout", "memory" or "died"."""

    task: str
    kind: str
    result: dict | None = None
    stage: str = ""
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    peak_rss_mb: float = 0.0
    detail: str = ""


@dataclass
class _Child:
    task: str
    process: mp.Process
    conn: object
    started: float
    stage_wall: float  # monotonic time when the current major stage began
    stage_cpu: float = 0.0  # the child's CPU seconds when it began
    stage: str = "start"
    peak_rss_mb: float = 0.0
    cpu: float = 0.0


def run_pool(tasks: Iterable[str], work: Work, *, workers: int = 2, timeout: float = 30.0,
             memory_mb: float = 8000.0, wall_factor: float = 10.0) -> Iterator[Outcome]:
    """Run `work(task, report_stage)` for every task in forked children; yield outcomes as they end.

    Each major stage may use `timeout` CPU seconds (and `wall_factor` x that in wall time); a child
    above `memory_mb` of RSS is killed too. Outcomes come in completion order.
    """
    limits = (timeout, timeout * wall_factor, memory_mb)
    pending, running = deque(tasks), {}
    gc.collect()
    gc.freeze()  # children then do not copy every page when their collector walks old objects
    try:
        while pending or running:
            while pending and len(running) < workers:
                child = _start(pending.popleft(), work)
                running[child.conn] = child
            for conn in wait(list(running), timeout=0.2):
                outcome = _receive(running[conn])
                if outcome is not None:
                    del running[conn]
                    yield outcome
            for conn, child in list(running.items()):
                outcome = _police(child, *limits)
                if outcome is not None:
                    del running[conn]
                    yield outcome
    finally:
        for child in running.values():
            _stop(child)
        gc.unfreeze()


def _start(task: str, work: Work) -> _Child:
    parent_end, child_end = mp.Pipe(duplex=False)
    process = mp.get_context("fork").Process(target=_child_main, args=(child_end, work, task), daemon=True)
    process.start()
    child_end.close()
    now = time.monotonic()
    return _Child(task, process, parent_end, now, now)


def _child_main(conn, work: Work, task: str) -> None:
    _die_with_parent()

    def report(stage: str) -> None:
        conn.send(("stage", stage))

    try:
        result = work(task, report)
    except BaseException as error:  # a bug in the runner itself: report it, do not hang the pool
        result = {"runner_error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()}
    conn.send(("done", result))
    conn.close()


def _die_with_parent() -> None:
    """Linux: SIGKILL this child when the parent dies, so a killed run leaves no orphans."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _receive(child: _Child) -> Outcome | None:
    """Read what the child sent; an Outcome once it is done or gone."""
    try:
        while child.conn.poll():
            kind, payload = child.conn.recv()
            if kind == "stage":  # a new major stage ("walk" after "compile:...") gets a fresh budget
                if payload.split(":")[0] != child.stage.split(":")[0]:
                    child.stage_wall, child.stage_cpu = time.monotonic(), _cpu_seconds(child.process.pid)
                child.stage = payload
            else:
                child.process.join()
                child.conn.close()
                return _outcome(child, "done", result=payload)
    except (EOFError, OSError):
        child.process.join()
        child.conn.close()
        return _outcome(child, "died", detail=f"worker exited with code {child.process.exitcode} while {child.stage}")
    return None


def _police(child: _Child, cpu_limit: float, wall_limit: float, memory_mb: float) -> Outcome | None:
    """Kill a child past its CPU or wall-clock budget for the stage, or its memory limit."""
    rss, child.cpu = _rss_mb(child.process.pid), max(child.cpu, _cpu_seconds(child.process.pid))
    child.peak_rss_mb = max(child.peak_rss_mb, rss)
    cpu, wall = child.cpu - child.stage_cpu, time.monotonic() - child.stage_wall
    if cpu > cpu_limit or wall > wall_limit:
        _stop(child)
        return _outcome(child, "timeout", detail=f"over {cpu_limit:g} s CPU (or {wall_limit:g} s wall) in stage "
                                                 f"{child.stage}: {cpu:.1f} s CPU, {wall:.1f} s wall")
    if rss > memory_mb:
        _stop(child)
        return _outcome(child, "memory", detail=f"RSS {rss:.0f} MB > {memory_mb:.0f} MB in stage {child.stage}")
    return None


def _outcome(child: _Child, kind: str, **fields) -> Outcome:
    return Outcome(child.task, kind, stage=child.stage, seconds=time.monotonic() - child.started, cpu_seconds=child.cpu,
                   peak_rss_mb=child.peak_rss_mb, **fields)


def _stop(child: _Child) -> None:
    if child.process.is_alive():
        child.process.kill()
    child.process.join()
    child.conn.close()


def _rss_mb(pid: int) -> float:
    """Resident set size of `pid` in MB (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, IndexError, ValueError):
        return 0.0


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of `pid` so far (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def peak_rss_mb() -> float:
    """This process's peak RSS in MB (VmHWM)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def current_rss_mb() -> float:
    return _rss_mb(os.getpid())

"""Budgets: every compile and every first visit of a guide state runs under limits of work; a compile also
under a limit of time.

Work is counted in new `rx` terms (each DFA state, derivative and search step makes some), a
deterministic proxy for memory: the task holds the terms it creates until it ends, so a term it dropped and needs again
is not created twice, whenever the garbage collector runs (terms are interned weakly, and derivatives make cycles that
only a collection frees); a compile's time is checked every few hundred terms. Time is the CPU time of the
compiling thread (`time.thread_time`): a process paused (SIGSTOP, a suspended laptop) or waiting for a core on a busy
machine spends none of it, and neither do other threads of the process (a model's forward). Past a limit the
build stops with `GuideBudgetError` instead of running on. A first visit of a state (during generation,
after model calls began) is never timed: what it allows must not depend on the machine's load, so only
work counts there (`metered(..., timed=False)`). Building (term creation, DFA growth, index
entries) happens under one process-wide re-entrant lock, `BUILD_LOCK`, so shared lazy structures
are never grown by two threads at once; reading what is built takes no lock.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable

from fsm.errors import SchemaError

BUILD_LOCK = threading.RLock()
CLOCK_EVERY = 256  # terms between two looks at the clock


class GuideBudgetError(SchemaError):
    """A compile or a first visit of a state went past its `Budget` (names the schema pointer where known)."""

    def __init__(self, reason: str, pointer: str = ""):
        super().__init__(f"{reason} at {pointer}" if pointer else reason, pointer=pointer)
        self.reason = reason

    def at(self, pointer: str) -> "GuideBudgetError":
        """The same error, located at `pointer` (the innermost subschema being compiled)."""
        return self if self.pointer else GuideBudgetError(self.reason, pointer)


@dataclass(frozen=True)
class Budget:
    """Limits for one compile and for one first visit of a state (each gets the full budget).

    Attributes
    ----------
    max_terms : int
        New terms one compile or one first visit may create (a proxy for its memory).
    max_states : int
        DFA states one automaton may grow to over its life (its table costs ~1 KiB per state).
    max_seconds : float
        Seconds of CPU time one compile may take (first visits are bounded by work alone).
    clock : callable
        Seconds as a float (injectable for tests); the compiling thread's CPU time by default, so a pause of the
        process (SIGSTOP) or a wait for a busy core never counts.
    """

    max_terms: int = 2_000_000
    max_states: int = 200_000
    max_seconds: float = 60.0
    clock: Callable[[], float] = field(default=time.thread_time, compare=False)


DEFAULT_BUDGET = Budget()


class Meter:
    """Counts (and holds) the terms created under one budgeted task and, when `timed`, checks its clock."""

    __slots__ = ("budget", "what", "made", "deadline")

    def __init__(self, budget: Budget, what: str, timed: bool = True):
        self.budget, self.what, self.made = budget, what, []
        self.deadline = budget.clock() + budget.max_seconds if timed else None

    @property
    def terms(self) -> int:
        return len(self.made)

    def tick(self, term) -> None:
        """Count and hold a new term: held, it stays interned until the task ends, collected or not."""
        made = self.made
        made.append(term)
        terms = len(made)  # `terms`, inline: a call per new term
        if terms > self.budget.max_terms:
            raise GuideBudgetError(f"{self.what} needs more than {self.budget.max_terms} terms (Budget.max_terms)")
        if terms % CLOCK_EVERY == 0:
            self.check_clock()

    def check_clock(self) -> None:
        """Raise when past the deadline (long loops that create no terms call this themselves); never untimed."""
        if self.deadline is not None and self.budget.clock() > self.deadline:
            raise GuideBudgetError(f"{self.what} takes longer than {self.budget.max_seconds} s (Budget.max_seconds)")


_active: list[Meter] = []  # the meter of the task being built (only under BUILD_LOCK)


def current_meter() -> Meter | None:
    return _active[-1] if _active else None


@contextmanager
def metered(budget: Budget | None, what: str, timed: bool = True):
    """Run a build under BUILD_LOCK and `budget` (an inner task keeps the outer task's meter). `timed=False`: work
    alone bounds it (a first visit: its answer must not depend on the clock)."""
    with BUILD_LOCK:
        if _active:
            yield _active[-1]
            return
        meter = Meter(budget or DEFAULT_BUDGET, what, timed)
        _active.append(meter)
        try:
            yield meter
        finally:
            _active.pop()

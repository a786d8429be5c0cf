"""A pinned clock for the loop's timings: every read advances it by one tick, whatever the machine's load.

`schedule="auto"` cuts drafts and picks plain decoding from measured seconds; with the clock pinned, its
decisions (and so the steps a test sees) are the same on an idle laptop and on a loaded CI machine.
"""

from __future__ import annotations

import importlib
import types

TIMED_MODULES = ("assisted.rows.engine", "drafting.assistant")  # where the engine times target and assistant forwards


class TickClock:
    """`perf_counter` that returns 0, tick, 2 * tick, ...: each timed forward lasts one tick."""

    def __init__(self, tick: float = 1e-3):
        self.tick, self.now = tick, 0.0

    def perf_counter(self) -> float:
        self.now += self.tick
        return self.now


def pin_clock(monkeypatch, tick: float = 1e-3) -> TickClock:
    """Make the timed modules read a `TickClock` (undone by `monkeypatch` at the end of the test)."""
    clock = TickClock(tick)
    for name in TIMED_MODULES:
        monkeypatch.setattr(
            importlib.import_module(name), "time", types.SimpleNamespace(perf_counter=clock.perf_counter)
        )
    return clock

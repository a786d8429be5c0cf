"""structspec_ops.build: a stale build lock is broken (never waited on forever), a failed build keeps its whole output.

The lock is tested with an injected clock (no waiting in the test) and then with a real load of the attention
library behind a stale lock; the failed build compiles a file that cannot compile, in a temporary extension folder.
"""

from __future__ import annotations

import os

import pytest

from structspec_ops import attention, build


class Clock:
    """A clock that moves only when slept on."""

    def __init__(self, now: float):
        self.now, self.slept = now, []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds > 0
        self.slept.append(seconds)
        self.now += seconds


def _lock(folder, age: float, clock: Clock):
    lock = folder / "lock"
    lock.write_text("")
    os.utime(lock, (clock.now - age, clock.now - age))
    return lock


def test_an_old_lock_is_removed_at_once_with_a_warning(tmp_path):
    clock = Clock(1e9)
    lock = _lock(tmp_path, build.STALE_LOCK_SECONDS + 1, clock)
    with pytest.warns(UserWarning, match="removing a stale build lock"):
        assert build.break_stale_lock(tmp_path, clock=clock, sleep=clock.sleep)
    assert not lock.exists() and clock.slept == []


def test_a_young_lock_is_waited_on_until_it_is_stale_and_no_longer(tmp_path):
    clock = Clock(1e9)
    lock = _lock(tmp_path, 5.0, clock)
    with pytest.warns(UserWarning, match="stale build lock"):
        assert build.break_stale_lock(tmp_path, stale_after=30.0, clock=clock, sleep=clock.sleep)
    assert not lock.exists() and sum(clock.slept) == pytest.approx(25.0)


def test_a_lock_released_while_waiting_is_not_touched(tmp_path):
    clock = Clock(1e9)
    lock = _lock(tmp_path, 0.0, clock)

    def release(seconds):
        clock.sleep(seconds)
        lock.unlink()

    assert not build.break_stale_lock(tmp_path, stale_after=30.0, clock=clock, sleep=release)
    assert not build.break_stale_lock(tmp_path)  # no lock: nothing to do


@pytest.mark.skipif(not attention.built().ok, reason=attention.implementation())
def test_a_load_behind_a_stale_lock_finishes():
    """A build killed half way left its lock: the next load breaks it and loads the (built) library."""
    folder = build.build_directory("attention")
    lock = folder / "lock"
    lock.write_text("")
    old = lock.stat().st_mtime - build.STALE_LOCK_SECONDS - 60
    os.utime(lock, (old, old))
    with pytest.warns(UserWarning, match="stale build lock"):
        loaded = build.load.__wrapped__("attention", ("attention.cpp",), ("-ffp-contract=off", "-fopenmp"))
    assert loaded.ok and not lock.exists()


def test_a_failed_build_names_a_log_with_the_whole_output(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "extensions"))
    source = tmp_path / "broken.cpp"
    source.write_text("#error this file cannot compile\n")
    failed = build.load.__wrapped__("test_broken", (str(source),))
    assert not failed.ok and "did not build" in failed.reason and "\n" not in failed.reason
    log = build.build_directory("test_broken") / "build-error.log"
    assert f"(full output: {log})" in failed.reason
    assert "this file cannot compile" in failed.reason and "this file cannot compile" in log.read_text()

"""Smoke run of the reliability sweep (experiments/reliability.py): a few hostile cases, in-process.
Verdicts are outcomes only (ok / refused with a clear error), never times."""

from __future__ import annotations

import pytest

from experiments import reliability


@pytest.mark.parametrize("case", reliability.SMOKE, ids=lambda c: c.name)
def test_hostile_case_has_its_expected_outcome(smol_tokenizer, case):
    outcome, detail = reliability.outcome_of(case, smol_tokenizer)
    assert outcome == case.expect, detail


def _sleeps(tokenizer) -> str:
    import time
    time.sleep(30)
    return "woke"


def _exits(tokenizer) -> str:
    import os
    os._exit(3)


def test_a_case_runs_in_its_own_process_and_a_stuck_or_crashed_one_is_reported():
    done = reliability.run_case(reliability.Case("fine", lambda tokenizer: "fine"), None, timeout=60)
    assert done["outcome"] == "ok" and done["detail"] == "fine" and done["passed"]
    stuck = reliability.run_case(reliability.Case("stuck", _sleeps), None, timeout=0.5)
    assert stuck["outcome"] == "timeout" and stuck["detail"] == "killed after 0.5 s" and not stuck["passed"]
    crashed = reliability.run_case(reliability.Case("crash", _exits), None, timeout=60)
    assert crashed["outcome"] == "error" and crashed["detail"] == "crashed (exit code 3)"

"""Smoke run of the reliability sweep (experiments/reliability.py): a few hostile cases, in-process.
Verdicts are outcomes only (ok / refused with a clear error), never times."""

from __future__ import annotations

import pytest

from experiments import reliability


@pytest.mark.parametrize("case", reliability.SMOKE, ids=lambda c: c.name)
def test_hostile_case_has_its_expected_outcome(smol_tokenizer, case):
    outcome, detail = reliability.outcome_of(case, smol_tokenizer)
    assert outcome == case.expect, detail

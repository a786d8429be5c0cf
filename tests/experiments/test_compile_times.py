"""experiments.compile_times: a pass's lines, the medians over passes and which schemas count as slower."""

from __future__ import annotations

import json
import subprocess
import sys

from experiments import compile_times as ct
from experiments.lib.report import REPO


def test_a_pass_books_every_schema_with_its_status(tmp_path):
    good = {"type": "object", "properties": {"x": {"type": "string"}}}
    (tmp_path / "a.json").write_text(json.dumps({"schema": good}))
    (tmp_path / "b.json").write_text(json.dumps({"schema": {"type": "string", "pattern": "("}}))  # a bad regex
    out = subprocess.run([sys.executable, "-m", "experiments.compile_times", "--measure", str(REPO), "--data",
                          str(tmp_path)], cwd=REPO, capture_output=True, text=True, check=True).stdout
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["schema"] for r in rows] == ["a.json", "b.json"]
    assert rows[0]["status"] == "ok" and rows[1]["status"] == "SchemaError" and rows[0]["cpu_s"] >= 0


def test_slower_means_over_the_ratio_and_a_tenth_of_a_second_in_the_median_of_the_passes():
    def run(**seconds):
        return {name: {"status": "ok", "cpu_s": s} for name, s in seconds.items()}

    baseline = ct._medians([run(tiny=0.01, big=1.0, slow=0.2), run(tiny=0.01, big=1.0, slow=0.2)])
    this = ct._medians([run(tiny=0.05, big=2.5, slow=0.5), run(tiny=0.05, big=1.5, slow=0.5)])
    assert this["big"] == ("ok", 2.0)
    # tiny: 5x but 0.04 s; big: 2.0x, not over it; slow: 2.5x and 0.3 s
    assert ct._slower({"baseline": baseline, "this": this}, 2.0) == ["slow"]

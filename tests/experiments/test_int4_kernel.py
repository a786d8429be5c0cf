"""experiments.int4_kernel runs end to end on a tiny float model (its speed is measured only by the command)."""

from __future__ import annotations

import pytest

from kernels import int4
from tests.helpers_models import save_tiny_llama


@pytest.mark.skipif(not int4.built().ok, reason=f"int4 kernel unavailable: {int4.built().reason}")
def test_int4_kernel_writes_both_targets_rows_and_ratios(tmp_path):
    from experiments import int4_kernel

    folder = save_tiny_llama(tmp_path / "tiny", ["a", "b", "c", "d"], hidden_size=64, intermediate_size=256,
                             eos_token_id=1)
    out = tmp_path / "run"
    assert int4_kernel.main(["--model", str(folder), "--repeats", "1", "--context", "6", "--prefill", "9",
                             "--out", str(out)]) == 0
    readme = (out / "README.md").read_text()
    assert f"- int4 target: {int4.kernel_name()} x7, int8 (fbgemm) x1" in readme
    assert "- int8 target: int8 (fbgemm) x8" in readme
    for shape in ("| linears | 1 rows | int4 |", "| linears | 9 rows |", "| forwards | step |",
                  "| forwards | verify 5 |", "| forwards | prefill 9 |", "| layouts | 5 rows | two-level |"):
        assert shape in readme
    assert len((out / "results.csv").read_text().splitlines()) == 1 + 2 * 9  # header, 9 shapes x 2 contenders

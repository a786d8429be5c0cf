"""experiments.attention_cost on a tiny int8 model: every unit timed, the report's table, the bitwise check."""

from __future__ import annotations

import pytest
import torch

from assisted.models.int8 import quantize_int8
from experiments import attention_cost
from kernels.attention import ATTENTION, LOOP_ATTENTION
from tests.helpers_models import threads, tiny_llama

pytestmark = pytest.mark.usefixtures("one_thread")


def test_every_unit_is_timed_and_reported(tmp_path):
    model = quantize_int8(tiny_llama(300, seed=0, layers=2, hidden=64))
    ids = torch.randint(0, 300, (attention_cost.PROMPT + 5,), generator=torch.Generator().manual_seed(0)).tolist()
    args = attention_cost.parse_args(["--threads", "1", "--repeats", "1"])
    with torch.inference_mode(), threads(1):
        rows = attention_cost.measure(model, ids, args)
        for attention in (ATTENTION, LOOP_ATTENTION):
            model.set_attn_implementation(attention)
            assert attention_cost.verify_is_steps(model, ids)
    assert len(rows) == 1 * 3 * 3 and all(r["seconds"] > 0 for r in rows)  # repeats x attentions x forwards
    lines = attention_cost.report(rows, args)
    assert lines[1] == "threads=1" and len(lines) == 5 + 3
    assert all(line.count("x |") == 2 for line in lines[5:])  # op / loop and op / sdpa, per forward
    attention_cost.write_run(tmp_path / "run", rows, ["# head"], lines)
    assert (tmp_path / "run" / "README.md").read_text().startswith("# head\n\nthreads=1\n\n| forward |")
    assert len((tmp_path / "run" / "timings.csv").read_text().splitlines()) == 1 + len(rows)


def test_the_calls_alone_are_timed_at_a_configs_shapes():
    from transformers import LlamaConfig

    from experiments import attention_calls

    shape = attention_calls.shapes(LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                               num_hidden_layers=2))
    assert shape == dict(heads=4, kv_heads=2, dim=16, layers=2)
    args = attention_calls.parse_args(["--threads", "1", "--repeats", "1"])
    with torch.inference_mode():
        rows = attention_calls.measure(shape, args)
    assert len(rows) == 3 * 3 and all(r["seconds"] > 0 for r in rows)
    assert len(attention_cost.report(rows, args)) == 5 + 3

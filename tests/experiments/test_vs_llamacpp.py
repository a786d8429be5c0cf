"""experiments.vs_llamacpp's run and tables on a tiny random target with a stand-in for llama.cpp (llama-cpp-python
is not needed): every unit runs every system of its kind, in rotated order, and the tables pair ours with it."""

from __future__ import annotations

import pytest
import torch

from assisted.models.loading import QUANTIZED_COPIES
from experiments import vs_llamacpp
from experiments.lib.tasks import set_eos
from tests.helpers_models import threads, tiny_llama


class FakeLlama:
    """llama.cpp's interface as the experiment uses it: (text, tokens) of a completion."""

    def complete(self, threads: int, ids: list[int], budget: int, schema, compact: bool = False):
        return '{"name":"x"}', 3


def test_every_unit_runs_its_kind_s_systems_and_the_tables_pair_them(smol_tokenizer):
    model = tiny_llama(len(smol_tokenizer), seed=0)
    set_eos(smol_tokenizer, model)
    ours = vs_llamacpp.Ours({"int8": model}, smol_tokenizer, tiny_llama(len(smol_tokenizer), seed=1), 6, 4)
    units = vs_llamacpp.units(smol_tokenizer, per_class=1)[2:4]  # one free prompt, then the first extraction
    assert [u[0] for u in units] == ["free", "structured"]
    with threads(1):
        rows = vs_llamacpp.measure(ours, FakeLlama(), units, [1], repeats=1)
    assert [r["system"] for r in rows] == ["llama.cpp", "ours-plain-int8", "ours-spec-int8",
                                           "llama.cpp-grammar-compact", "ours-full-int8", "llama.cpp-grammar"]
    assert list(rows[0]) == list(vs_llamacpp.FIELDS) and all(r["threads"] == 1 for r in rows)
    targets = vs_llamacpp.TARGETS
    assert vs_llamacpp.table(rows, "free", "ours-spec-int8", targets)[0].startswith("|")
    assert any("ours-full-int8" in line for line in vs_llamacpp.table(rows, "structured", "ours-full-int8", targets))


def test_the_forward_costs_name_our_models_and_llama_cpp_and_set_our_step_against_its_floor(smol_tokenizer,
                                                                                              monkeypatch):
    class Timed(FakeLlama):
        def forward_cost(self, threads: int, ids: list[int], k: int) -> float:
            return 0.001 * k

    model = tiny_llama(len(smol_tokenizer), seed=0)
    weight = sum(m.weight.numel() * 4 for m in model.modules() if isinstance(m, torch.nn.Linear))  # float32
    monkeypatch.setattr(vs_llamacpp, "read_bandwidth", lambda threads: 1000 * weight)  # a floor of 1 ms
    with threads(1):
        lines = vs_llamacpp.costs({"ours int8 target": model}, Timed(), [1], repeats=1)
    assert lines[0] == "| threads | model | k=1 | k=2 | k=4 | k=8 | k=16 | k=128 | weight MB | k=1 / floor |"
    ours = lines[2].removesuffix(" |").split(" | ")
    assert ours[:2] == ["| 1", "ours int8 target"] and ours[-2] == f"{weight / 1e6:.0f}"
    assert float(ours[-1]) == pytest.approx(float(ours[2]), abs=0.06)  # the step in ms over a floor of 1 ms
    assert lines[3] == "| 1 | llama.cpp target (its GGUF) | 1.0 | 2.0 | 4.0 | 8.0 | 16.0 | 128.0 |  |  |"
    assert lines[5] == f"floor: the weight bytes a step reads / a read loop's bandwidth ({weight / 1e6:.1f} GB/s at " \
        "1 thread(s))"
    assert lines[9] == "| threads | model | op | calls a step | share |"  # where our step goes
    ops = [line.removesuffix(" |").split(" | ") for line in lines[11:]]
    assert len(ops) == 5 and all(op[:2] == ["| 1", "ours int8 target"] and op[-1].endswith("%") for op in ops)
    shares = [int(op[-1][:-1]) for op in ops]
    assert shares == sorted(shares, reverse=True) and sum(shares) <= 101  # of one step's op time, largest first


def test_the_floor_s_parts_read_memory_and_count_the_packed_bytes(smol_tokenizer):
    assert vs_llamacpp.read_bandwidth(1, gib=1 / 64, repeats=2) > 1e8  # bytes per second of a 16 MiB read
    model = tiny_llama(len(smol_tokenizer), seed=0)
    copy = QUANTIZED_COPIES["int4"](model)
    assert 0 < vs_llamacpp.weight_bytes(copy) < vs_llamacpp.weight_bytes(model) / 4  # 4-bit groups against float32

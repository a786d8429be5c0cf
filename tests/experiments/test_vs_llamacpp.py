"""experiments.vs_llamacpp's run and tables on a tiny random target with a stand-in for llama.cpp (llama-cpp-python
is not needed): every unit runs every system of its kind, in rotated order, and the tables pair ours with it."""

from __future__ import annotations

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
    assert vs_llamacpp.table(rows, "free", "ours-spec-int8")[0].startswith("|")
    assert any("ours-full-int8" in line for line in vs_llamacpp.table(rows, "structured", "ours-full-int8"))


def test_forward_costs_table_names_our_models_and_llama_cpp(smol_tokenizer):
    class Timed(FakeLlama):
        def forward_cost(self, threads: int, ids: list[int], k: int) -> float:
            return 0.001 * k

    model = tiny_llama(len(smol_tokenizer), seed=0)
    with threads(1):
        lines = vs_llamacpp.costs({"ours int8 target": model}, Timed(), [1], repeats=1)
    assert lines[0] == "| threads | model | k=1 | k=2 | k=4 | k=8 | k=16 |"
    assert lines[2].startswith("| 1 | ours int8 target |") and lines[3] == "| 1 | llama.cpp target (its GGUF) | " \
        "1.0 | 2.0 | 4.0 | 8.0 | 16.0 |"

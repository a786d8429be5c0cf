"""A bounded, deterministic slice of the differential sweep (experiments/differential.py): instances
drawn by hypothesis-jsonschema (fixed seed) and their mutants, judged by `jsonschema`; the compiled
language never accepts a text the oracle rejects, under either policy. A schema that fails to compile fails
its case unless listed as refused with its reason; each case holds valid and invalid texts, or says why not.
The full sweep is a benchmark."""

from __future__ import annotations

import json
import random

import pytest

from experiments.coverage import DEFAULT_DATA as DATA
from experiments.differential import judge, texts_for
from experiments.lib.differential_cases import combination_schema, value_pool

FILES = ("Github_medium---o17648.json", "Github_medium---o52960.json", "Kubernetes---kb_215_Normalized.json",
         "Kubernetes---kb_464_Normalized.json", "Github_hard---o78082.json")
COMBOS = range(40)  # seeds 17 and 35 caught false accepts of the compiler before issue 22
# Combinations the compiler refuses ("the schema accepts no value that can be generated"), and why.
REFUSED = {
    3: "unsatisfiable: `not` of properties {x1: true}, which every value satisfies (jsonschema finds no valid text)",
    36: "unsatisfiable: `not` of properties {b: true}, which every value satisfies (jsonschema finds no valid text)",
    31: "valid values are objects with a key the schema names only under `not` (^x with a non-integer, or another key "
        "with a non-string value); the compiler generates no such key",
    37: "valid values are objects with an ^x key whose value is not an integer, named only under `not`; the compiler "
        "generates no such key",
}
NO_INVALID = {7: "every JSON value is valid: arrays pass the third anyOf branch (it constrains objects only), "
                 "every other value the first"}
PROBES = [[[], [], []], {"a": {"b": "s"}}, {"x1": "s"}, ["s"], {"a": "s"}, [1, "s"], {"x1": 1, "a": 1}]  # invalid often


def _no_false_accepts(result: dict) -> None:
    """Both policies compiled, and neither accepts a text the oracle rejects."""
    assert "oracle_error" not in result, result
    for policy in ("compact", "spec"):
        assert "schema_error" not in result[policy], f"{policy} refused the schema: {result[policy]}"
        assert result[policy]["false_accepts"] == [], f"{policy}: {result[policy]['false_accepts'][:3]}"


@pytest.mark.skipif(not DATA.is_dir(), reason="../shared/data/jsonschemabench is not beside the checkout")
@pytest.mark.parametrize("name", FILES)
def test_no_false_accepts_on_benchmark_schemas(name):
    record = json.loads((DATA / name).read_text())
    texts = texts_for(record["schema"], 0, 4, 4, [t["data"] for t in record.get("tests") or []])
    result = judge(record["schema"], texts)
    assert result["n_invalid"] > 0 and result["n_valid"] > 0
    _no_false_accepts(result)


@pytest.mark.parametrize("seed", COMBOS)
def test_no_false_accepts_on_combined_keywords(seed):
    """Each combination compiles and is judged on valid and invalid texts, or is listed (REFUSED, NO_INVALID) with
    the reason it cannot be."""
    schema = combination_schema(random.Random(seed))
    texts = texts_for(schema, seed, 0, 3, value_pool(random.Random(seed + 1), 60) + PROBES)
    result = judge(schema, texts)
    if seed in REFUSED:
        for policy in ("compact", "spec"):
            assert result[policy].get("message") == "the schema accepts no value that can be generated", result[policy]
        assert (result["n_valid"] == 0) == REFUSED[seed].startswith("unsatisfiable"), REFUSED[seed]
        return
    assert result["n_valid"] > 0
    assert (result["n_invalid"] > 0) == (seed not in NO_INVALID), NO_INVALID.get(seed, "no invalid text was drawn")
    _no_false_accepts(result)


def test_spec_policy_accepts_the_valid_texts_of_exact_combinations():
    """Where the compiler is exact (no not/if/oneOf upper bounds, no free-form depth), spec accepts every valid text."""
    schema = {
        "$defs": {"d": {"prefixItems": [{"type": "integer"}], "items": {"type": "string"}}},
        "anyOf": [
            {"$ref": "#/$defs/d", "unevaluatedItems": False},
            {"type": "object", "properties": {"a": {"type": "integer"}}, "unevaluatedProperties": {"type": "string"}},
        ],
    }
    texts = texts_for(schema, 0, 0, 4, value_pool(random.Random(7), 40) + [[1, "a"], {"a": 1, "b": "s"}])
    result = judge(schema, texts)
    assert result["n_valid"] >= 5 and result["spec"]["valid_rejected"] == []
    _no_false_accepts(result)

"""A fixed slice of JSONSchemaBench (MaskBench, MIT): valid instances are accepted token by token,
invalid ones rejected. Every case compiles or is listed as refused with its reason, and holds at least one
valid and one invalid instance (hand-written or mutated where its file has none, each judged by jsonschema).
Read from ../shared, never copied."""

from __future__ import annotations

import json
import random
from pathlib import Path

import jsonschema
import pytest

import fsm
from experiments.lib.differential_cases import mutants

DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "jsonschemabench"
SLICE = ("Glaiveai2K", "BFCL_simple", "Handwritten")
PER_SUBSET = 5
# Schemas that compile since the term compiler (not, patternProperties, unknown formats and annotations).
EXTRA = (
    "Github_medium---o10297.json",
    "JsonSchemaStore---1.0.schema.json",
    "Github_ultra---o13020.json",
    "Synthesized---draft2019_09_nonvalid_additionalProperties_id5_subschema1_not_2.json",
    "Snowplow---sp_113_Normalized.json",
)


def _files() -> list[Path]:
    if not DATA.is_dir():
        return []
    chosen = []
    for subset in SLICE:
        chosen += sorted(p for p in DATA.iterdir() if p.name.startswith(subset))[:PER_SUBSET]
    return chosen + [DATA / name for name in EXTRA if (DATA / name).is_file()]


# Compiled schemas whose file lists no invalid (or no) instance: hand-written ones, each judged by jsonschema first.
HAND = {
    "Handwritten---allany16.json": ["a12xxxxxxz", "a1xxxxxxxz", "a12z"],  # a12 satisfies all three nots; a1 none
    "Handwritten---allany2.json": [264, 440, 3, 24],  # multiples of 24 * 11 and 40 * 11 only
    "Handwritten---allany4.json": [3, 9, 5, 8, 24],  # multiples of 3, not of 8, 5 or 7
}
# Schemas the compiler refuses, why, and a value jsonschema accepts (the refusal is a known incompleteness).
REFUSED = {
    "Handwritten---allOfPProp7.json": (
        "a valid object needs a key named only by patternProperties under `not` (^cde...); "
        "the compiler generates no such key",
        {"cdea": 30},
    ),
    "Handwritten---allOfPProp8.json": (
        "a valid object needs a key named only by patternProperties under `not` (^11...); "
        "the compiler generates no such key",
        {"111a": 70},
    ),
}
MUTANTS = 12  # mutants of the valid instances tried where a file lists no invalid one


def _walk(guide: fsm.Guide, token_ids: list[int]) -> bool:
    """True when the guide accepts the tokens and ends in a final state."""
    try:
        for token in token_ids:
            guide.advance(token)
    except fsm.InvalidTokenError:
        return False
    return guide.is_final()


def _oracle(schema):
    """jsonschema's validator for `schema` (formats checked)."""
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def _instances(path: Path, case: dict) -> list[tuple[object, bool]]:
    """(value, valid) pairs: the file's tests, the hand-written ones, and, where the file lists no invalid instance,
    the mutants of its valid ones that jsonschema rejects."""
    oracle = _oracle(case["schema"])
    pairs = [(t["data"], t["valid"]) for t in case.get("tests") or []]
    pairs += [(value, oracle.is_valid(value)) for value in HAND.get(path.name, [])]
    if all(valid for _, valid in pairs):
        rng = random.Random(0)
        pairs += [
            (m, False) for value, _ in list(pairs) for m in mutants(value, rng, MUTANTS) if not oracle.is_valid(m)
        ]
    assert all(oracle.is_valid(value) == valid for value, valid in pairs), (
        "an instance's label disagrees with jsonschema"
    )
    return pairs


@pytest.mark.skipif(not DATA.is_dir(), reason="../shared/data/jsonschemabench is not beside the checkout")
@pytest.mark.parametrize("path", _files(), ids=lambda p: p.name)
def test_instances_are_judged_like_a_validator(path, smol_tokenizer):
    """Every case compiles (or is listed in REFUSED), and holds at least one valid and one invalid instance."""
    case = json.loads(path.read_text())
    if path.name in REFUSED:
        reason, witness = REFUSED[path.name]
        with pytest.raises(fsm.SchemaError, match="the schema accepts no value that can be generated"):
            fsm.Guide.from_schema(case["schema"], smol_tokenizer)
        assert _oracle(case["schema"]).is_valid(witness), reason
        return
    guide = fsm.Guide.from_schema(case["schema"], smol_tokenizer)  # a SchemaError here fails the case
    pairs = _instances(path, case)
    assert {valid for _, valid in pairs} == {True, False}, "a case needs a valid and an invalid instance"
    for value, valid in pairs:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
        accepted = _walk(guide.copy(), smol_tokenizer.encode(text, add_special_tokens=False))
        assert accepted == valid, f"valid={valid}: {text[:200]}"

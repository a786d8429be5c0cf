"""A fixed slice of JSONSchemaBench (MaskBench, MIT): valid instances are accepted token by token,
invalid ones rejected, for every schema the project compiles. Read from ../shared, never copied."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import fsm

DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "jsonschemabench"
SLICE = ("Glaiveai2K", "BFCL_simple", "Handwritten")
PER_SUBSET = 5
# Schemas that compile since the term compiler (not, patternProperties, unknown formats and annotations).
EXTRA = ("Github_medium---o10297.json", "JsonSchemaStore---1.0.schema.json", "Github_ultra---o13020.json",
         "Synthesized---draft2019_09_nonvalid_additionalProperties_id5_subschema1_not_2.json", "Snowplow---sp_113_Normalized.json")


def _files() -> list[Path]:
    if not DATA.is_dir():
        return []
    chosen = []
    for subset in SLICE:
        chosen += sorted(p for p in DATA.iterdir() if p.name.startswith(subset))[:PER_SUBSET]
    return chosen + [DATA / name for name in EXTRA if (DATA / name).is_file()]


def _walk(guide: fsm.Guide, token_ids: list[int]) -> bool:
    """True when the guide accepts the tokens and ends in a final state."""
    try:
        for token in token_ids:
            guide.advance(token)
    except fsm.InvalidTokenError:
        return False
    return guide.is_final()


@pytest.mark.skipif(not DATA.is_dir(), reason="../shared/data/jsonschemabench is not beside the checkout")
@pytest.mark.parametrize("path", _files(), ids=lambda p: p.name)
def test_instances_are_judged_like_a_validator(path, smol_tokenizer):
    case = json.loads(path.read_text())
    try:
        guide = fsm.Guide.from_schema(case["schema"], smol_tokenizer)
    except fsm.SchemaError:
        pytest.skip("reported as unsupported (SchemaError)")
    for test in case["tests"]:
        text = json.dumps(test["data"], separators=(",", ":"), ensure_ascii=False)
        ids = smol_tokenizer.encode(text, add_special_tokens=False)
        accepted = _walk(guide.copy(), ids)
        assert accepted == test["valid"], f"{test['description']}: {text[:200]}"

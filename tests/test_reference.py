"""The plain reference itself (tests/helpers_reference.py): independent of the code it judges, and right by hand.

Its coalesced spelling is checked on examples worked out from docs/design.md section 1, then against the library's
`Guide.forced()` on every state a walk visits (a differential check of the forced-token spelling).
"""

from __future__ import annotations

import ast
import random
from pathlib import Path

import pytest

import fsm
from tests.helpers_models import smollm2_tokenizer, tiny_tokenizer
from tests.helpers_reference import forced_string, forced_tokens

HELPER = Path(__file__).with_name("helpers_reference.py")


def test_the_reference_imports_nothing_from_the_loop_it_judges():
    tree = ast.parse(HELPER.read_text())
    names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    names |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert {n.split(".")[0] for n in names} & {"assisted", "drafting", "experiments"} == set()
    attributes = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    assert "forced" not in attributes and "forced_tokens" not in attributes  # never the library's spelling


def ids(tok, *pieces: str) -> list[int]:
    """Token ids of the tiny tokenizer's pieces."""
    return tok.convert_tokens_to_ids(list(pieces))


@pytest.mark.parametrize("pattern, text, spelled", [
    ("abcd", b"abcd", ["ab", "cd"]),  # canonical merges, nothing can follow
    ("b(a|c)", b"b", []),  # "ba" is allowed and spans the end of "b": held back
    ("cd(a|b)", b"cd", ["cd"]),  # no allowed token is longer than "cd"
    ("a(b|c)", b"a", []),  # "ab" spans the end of "a": held back, the model chooses between a+b and ab
    ("(a|b)c", b"", []),  # a choice first: nothing is forced
])
def test_forced_text_and_its_coalesced_spelling_from_the_definition(pattern, text, spelled):
    tok = tiny_tokenizer()
    guide = fsm.Guide.from_regex(pattern, tok)
    assert forced_string(guide, tok) == text
    assert forced_tokens(guide, tok) == ids(tok, *spelled)


@pytest.mark.parametrize("pattern", [r"(yes|no)\. [a-z]{2,8}!", r'\{"name":"[a-z]{1,6}","age":[0-9]{1,2}\}',
                                     r"(cat|category|catalog)s?, thank you( kindly)?"])
def test_the_library_spells_forced_text_as_the_reference_does(pattern):
    """Every state of random walks: `Guide.forced()` is the reference's spelling (SmolLM2's tokenizer)."""
    tok, rng, states = smollm2_tokenizer(), random.Random(0), 0
    for _ in range(6):
        guide = fsm.Guide.from_regex(pattern, tok)
        while not guide.is_final() or rng.random() < 0.5:
            assert guide.forced() == forced_tokens(guide, tok), (pattern, guide.state)
            states += 1
            allowed = [t for t in guide.allowed() if t not in guide.eos_token_ids]
            if not allowed:
                break
            guide.advance(rng.choice(allowed))
    assert states >= 20

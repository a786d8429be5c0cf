"""The speedup prompt set and its fixed split into a tuning half and a validation half.

`experiments/prompts/split.json` holds 70 prompts in five classes (code in eight languages, extraction,
prose, chat instructions, math). Each prompt's half is decided once, by a hash of its name: a policy or
drafting change is tuned on the "tuning" half (replay traces included) and reported on the "validation"
half only. The hash, not a person, decides, so the validation half cannot be picked to flatter a method.
The older `prompts/speedup.json` (12 prompts, the set the policy was first tuned on) is tuning material.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

SPLIT_PROMPTS = Path(__file__).parents[1] / "prompts" / "split.json"
HALVES = ("tuning", "validation")


def half_of(name: str) -> str:
    """The half a prompt belongs to: the parity of the first byte of the SHA-256 of its name."""
    return HALVES[hashlib.sha256(name.encode()).digest()[0] % 2]


def load_prompts(path: Path = SPLIT_PROMPTS, half: str | None = None, per_class: int | None = None) -> list[dict]:
    """The prompts of `path` (a list of {"class", "name", "prompt"}) in file order, those of `half` only when
    given (None: all), and at most `per_class` of each class."""
    if half is not None and half not in HALVES:
        raise ValueError(f"half must be one of {HALVES}, got {half!r}")
    seen: dict[str, int] = {}
    keep = []
    for prompt in json.loads(Path(path).read_text()):
        if half is not None and half_of(prompt["name"]) != half:
            continue
        seen[prompt["class"]] = seen.get(prompt["class"], 0) + 1
        if per_class is None or seen[prompt["class"]] <= per_class:
            keep.append(prompt)
    return keep

"""The benchmarks' one task registry: every structured task (schema and the message that asks for it), the free
prompts of the speedup set and their fixed split, and the checks of an output.

The tasks are data, `experiments/prompts/tasks.json`: pydantic models by name and the groups of tasks. Groups: `DEMO`
(the demo: the seed's Character example, from .txt's "Coalescence" post, and an employee), `STRUCTURED` (the seed
tasks), `HELD_OUT` (four extractions written for the comparison with XGrammar: invoice, patient, flight, review),
`BUDGET` (the tight-budget tasks, the invoice last), `TICKET` (the throughput documents' instruction and schema).
`task(name)` finds any of them.

Free prompts: `experiments/prompts/split.json`, 70 prompts in five classes (code in eight languages, extraction, prose,
chat instructions, math). Each prompt's half is decided once, by a hash of its name (`half_of`): a policy or drafting
change is tuned on the "tuning" half (replay traces included) and reported on the "validation" half only. The hash,
not a person, decides, so the validation half cannot be picked to flatter a method. The older `prompts/speedup.json`
(12 prompts, the set the policy was first tuned on) is tuning material.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, create_model

from assisted.models.loading import set_eos  # noqa: F401  (every system compared stops on one set)

TASK_FILE = Path(__file__).parents[1] / "prompts" / "tasks.json"
SPLIT_PROMPTS = Path(__file__).parents[1] / "prompts" / "split.json"
HALVES = ("tuning", "validation")
TYPES = {"str": str, "int": int, "float": float, "bool": bool}


@dataclass(frozen=True)
class Task:
    """One structured task: a schema and the chat message that asks for it."""

    name: str
    kind: str  # "seed" | "extraction"
    schema: object  # pydantic class or JSON Schema dict
    user: str

    def messages(self, constrained: bool = True) -> list[dict]:
        """Chat messages; unconstrained runs are also told to answer with JSON only."""
        text = self.user + ("" if constrained else "\nAnswer with only the JSON object, on one line, nothing else.")
        return [{"role": "user", "content": text}]

    def json_schema(self) -> dict:
        return self.schema.model_json_schema() if isinstance(self.schema, type) else self.schema


def build_models(specs: dict) -> dict[str, type[BaseModel]]:
    """Pydantic models from their specs, {model: {field: spec}} in order (a model names only the ones before it).

    A field's spec is a type ("str", "int", "float", "bool") or a model's name; {"enum": [...]}, a Literal; or
    {"type": ..., constraints} / {"list": item type, constraints}, the constraints those of `pydantic.Field`.
    """
    models: dict[str, type[BaseModel]] = {}

    def field(spec):
        if isinstance(spec, str):
            return TYPES.get(spec) or models[spec], ...
        if "enum" in spec:
            return Literal[tuple(spec["enum"])], ...
        constraints = {k: v for k, v in spec.items() if k not in ("type", "list")}
        kind = list[TYPES.get(spec["list"]) or models[spec["list"]]] if "list" in spec else TYPES[spec["type"]]
        return kind, Field(**constraints)

    for name, fields in specs.items():
        models[name] = create_model(name, **{key: field(spec) for key, spec in fields.items()})
    return models


def _load(path: Path = TASK_FILE) -> dict:
    """{group: tuple of tasks} of the task file; a group's entry that is a name is that task of an earlier group."""
    data = json.loads(path.read_text())
    models, found, groups = build_models(data["models"]), {}, {}
    for group in ("structured", "held_out", "budget", "ticket"):
        entries = data[group] if isinstance(data[group], list) else [data[group]]
        for entry in entries:
            if isinstance(entry, dict):
                found[entry["name"]] = Task(entry["name"], entry["kind"], models[entry["schema"]], entry["user"])
        groups[group] = tuple(found[e if isinstance(e, str) else e["name"]] for e in entries)
    return groups


_GROUPS = _load()
STRUCTURED, HELD_OUT, BUDGET, (TICKET,) = (_GROUPS[g] for g in ("structured", "held_out", "budget", "ticket"))
CHARACTER, EMPLOYEE, ORDER, EVENT = STRUCTURED
DEMO = (CHARACTER, EMPLOYEE)
TASKS = {t.name: t for t in (*STRUCTURED, *HELD_OUT, *BUDGET, TICKET)}


def task(name: str) -> Task:
    """The registered task called `name`."""
    if name not in TASKS:
        raise KeyError(f"no task {name!r}; known: {', '.join(TASKS)}")
    return TASKS[name]


def validate(task: Task, text: str) -> bool:
    """Is `text` one JSON value that the task's JSON Schema accepts?"""
    import jsonschema
    try:
        jsonschema.validate(json.loads(text), task.json_schema())
    except (ValueError, jsonschema.ValidationError, jsonschema.SchemaError):
        return False
    return True


def extract_json(text: str) -> str:
    """The first {...} block of a free-form answer (code fences and chatter removed), else the text."""
    start, end = text.find("{"), text.rfind("}")
    return text[start : end + 1] if 0 <= start < end else text


def half_of(name: str) -> str:
    """The half a free prompt belongs to: the parity of the first byte of the SHA-256 of its name."""
    return HALVES[hashlib.sha256(name.encode()).digest()[0] % 2]


def load_prompts(path: Path = SPLIT_PROMPTS, half: str | None = None, per_class: int | None = None) -> list[dict]:
    """The free prompts of `path` (a list of {"class", "name", "prompt"}) in file order, those of `half` only when
    given (None: all), and at most `per_class` of each class."""
    if half is not None and half not in HALVES:
        raise ValueError(f"half must be one of {HALVES}, got {half!r}")
    seen: dict[str, int] = {}
    keep = []
    for prompt in json.loads(Path(path).read_text()):
        if half is None or half_of(prompt["name"]) == half:
            seen[prompt["class"]] = seen.get(prompt["class"], 0) + 1
            if per_class is None or seen[prompt["class"]] <= per_class:
                keep.append(prompt)
    return keep


def chat_ids(tokenizer, prompt: dict | list[dict]) -> list[int]:
    """The ids of a chat ready for the assistant's reply: `messages`, or one user message of `prompt["prompt"]`,
    as `generate(messages=...)` makes them."""
    messages = [{"role": "user", "content": prompt["prompt"]}] if isinstance(prompt, dict) else prompt
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]

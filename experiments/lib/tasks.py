"""Shared tasks for the demo and the benchmarks: schemas, prompts, EOS handling and timed runs.

Every mode is one call that returns a `Run` (text, new tokens, wall seconds, target forward passes,
forced tokens appended), so the demo and the structured benchmark print the same numbers.
"""

from __future__ import annotations

import csv
import json
import sys
import time
from dataclasses import dataclass
from typing import Literal

import torch
from pydantic import BaseModel, Field

from assisted import generate
from assisted.models.loading import load_pair, set_eos  # noqa: F401  (every system compared stops on one set)


# ---------------------------------------------------------------- schemas (pydantic at the boundary)
class Character(BaseModel):  # the seed's Character example (.txt "Coalescence" post)
    name: str = Field(max_length=10)
    age: int
    armor: Literal["leather", "chainmail", "plate"]
    strength: int


class Office(BaseModel):
    city: str = Field(max_length=24)
    country: str = Field(max_length=24)


class Employee(BaseModel):
    name: str = Field(max_length=32)
    age: int
    role: str = Field(max_length=32)
    remote: bool
    office: Office


class Item(BaseModel):
    product: str = Field(max_length=24)
    quantity: int
    unit_price: float


class Order(BaseModel):
    order_id: str = Field(max_length=12)
    customer: str = Field(max_length=32)
    items: list[Item] = Field(min_length=1, max_length=3)
    express: bool


class Venue(BaseModel):
    name: str = Field(max_length=32)
    city: str = Field(max_length=24)


class Event(BaseModel):
    title: str = Field(max_length=40)
    date: str = Field(pattern=r"^\d{4}-\d{2}-\d{2}$")
    venue: Venue
    attendees: int
    speakers: list[str] = Field(min_length=1, max_length=3)


@dataclass(frozen=True)
class Task:
    """One structured task: a schema and the chat messages that ask for it."""

    name: str
    kind: str  # "seed" | "extraction" | "jsonschemabench"
    schema: object  # pydantic class or JSON Schema dict
    user: str

    def messages(self, constrained: bool = True) -> list[dict]:
        """Chat messages; unconstrained runs are also told to answer with JSON only."""
        text = self.user
        if not constrained:
            text += "\nAnswer with only the JSON object, on one line, nothing else."
        return [{"role": "user", "content": text}]

    def json_schema(self) -> dict:
        return self.schema.model_json_schema() if isinstance(self.schema, type) else self.schema


CHARACTER = Task("character", "seed", Character,
                 "Create a fantasy character as JSON with the fields name, age, armor (leather, chainmail "
                 "or plate) and strength.")

EMPLOYEE = Task("employee", "extraction", Employee,
                "Extract the employee described below as JSON with name, age, role, remote (true/false) and "
                "office (city, country).\n\n"
                "Maria Lopez, 34, joined Northwind last spring as a senior data engineer. She works from the "
                "company's office in Lisbon, Portugal, three days a week and is not a remote employee.")

ORDER = Task("order", "extraction", Order,
             "Extract the order below as JSON with order_id, customer, items (product, quantity, unit_price) "
             "and express (true/false).\n\n"
             "Order A-1042 was placed by Tom Becker: 2 USB-C cables at 9.5 each and 1 laptop stand at 39.0. "
             "He paid for express shipping.")

EVENT = Task("event", "extraction", Event,
             "Extract the event below as JSON with title, date (YYYY-MM-DD), venue (name, city), attendees "
             "and speakers.\n\n"
             "The Open Data Summit takes place on 2026-05-14 at the Palais des Congres in Paris. About 800 "
             "people are expected, and the keynotes are given by Ada Chen and Omar Haddad.")

DEMO_TASKS = (CHARACTER, EMPLOYEE)
STRUCTURED_TASKS = (CHARACTER, EMPLOYEE, ORDER, EVENT)


# ---------------------------------------------------------------- loading
def load_pair_or_none(target: str, assistant: str | None = None, **options) -> tuple | None:
    """`assisted.models.loading.load_pair(target, assistant, **options)` as the experiments run it: None, after printing
    why to stderr, when a model is not prepared or cannot be loaded or packed. `assistant="random"`: a tiny random
    model with the target's vocabulary (`experiments.models.random_like`; a bad drafter), quantized as
    ``quantize_assistant`` asks."""
    from experiments.models import QUANTIZED_COPIES, NotPreparedError, random_like
    quantize = options.pop("quantize_assistant", None) if assistant == "random" else None
    try:
        loaded = load_pair(target, None if assistant == "random" else assistant, **options)
    except (NotPreparedError, OSError, ValueError, RuntimeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return None
    if assistant != "random":
        return loaded
    model, tokenizer, _ = loaded
    helper = random_like(model)
    helper = QUANTIZED_COPIES[quantize](helper) if quantize else helper
    set_eos(tokenizer, model, helper)
    return model, tokenizer, helper


# ---------------------------------------------------------------- timed runs
@dataclass(frozen=True)
class Run:
    """One generation: output and cost."""

    mode: str
    text: str
    new_tokens: int
    seconds: float
    target_passes: int
    forced_appended: int
    value: object = None

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds else 0.0


# mode -> (needs assistant, schema?, coalesce forced tokens, prompt lookup); "full" is everything we have
MODES = {
    "unconstrained": (False, False, False, False),
    "constrained": (False, True, False, False),
    "constrained+forced": (False, True, True, False),
    "constrained+forced+lookup": (False, True, True, True),
    "constrained+assistant": (True, True, False, False),
    "full": (True, True, True, True),
}


def run_mode(mode: str, task: Task, model, tokenizer, assistant=None, *, max_new_tokens: int = 96,
             num_assistant_tokens: int = 5, schedule: str = "heuristic") -> Run:
    """Greedy generation of `task` in `mode` with `assisted.generate`; the constraint is compiled once
    per (schema, tokenizer) inside fsm, so warm up once before timing."""
    needs_assistant, constrained, coalesce, lookup = MODES[mode]
    if needs_assistant and assistant is None:
        raise ValueError(f"mode {mode!r} needs an assistant model")
    start = time.perf_counter()
    out = generate(model, assistant if needs_assistant else None, tokenizer=tokenizer,
                   messages=task.messages(constrained), schema=task.schema if constrained else None,
                   max_new_tokens=max_new_tokens, coalesce=coalesce, num_assistant_tokens=num_assistant_tokens,
                   num_assistant_tokens_schedule=schedule, prompt_lookup=lookup)
    seconds = time.perf_counter() - start
    s = out.stats
    return Run(mode, out.text, s.new_tokens, seconds, s.target_forward_passes, s.forced_tokens_appended, out.value)


def plain_hf(task: Task, model, tokenizer, *, max_new_tokens: int = 96) -> Run:
    """transformers' own greedy generate, unconstrained (prompt asks for JSON): a sanity baseline."""
    ids = tokenizer.apply_chat_template(task.messages(False), add_generation_prompt=True, return_tensors="pt",
                                        return_dict=True)["input_ids"].to(model.device)
    passes = count_forwards(model)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
    seconds = time.perf_counter() - start
    new = out[0, ids.shape[1]:].tolist()
    passes.remove()
    return Run("hf-unconstrained", tokenizer.decode(new, skip_special_tokens=True), len(new), seconds, passes.n, 0)


class count_forwards:  # noqa: N801 (used like a function)
    """Count forward calls of a module with a forward hook; `.remove()` detaches it."""

    def __init__(self, module):
        self.n = 0
        self._handle = module.register_forward_hook(self._hook)

    def _hook(self, *_):
        self.n += 1

    def reset(self) -> None:
        self.n = 0

    def remove(self) -> None:
        self._handle.remove()


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


def write_rows(path, rows: list[dict], fields) -> None:
    """One CSV row per generation, floats rounded to 4 digits (the benchmarks' results.csv)."""
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fields)
        w.writeheader()
        w.writerows({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()} for r in rows)


def add_assistant_quantization(parser, names: tuple[str, str] = ("--assistant-int4", "--assistant-int8")) -> None:
    """Flags for a quantized copy of the assistant (results cite both spellings of the int8 one)."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument(names[0], dest="assistant_int4", action="store_true",
                       help="draft with a group-wise int4 copy of the assistant (CPU; `assisted.models.int4`)")
    group.add_argument(names[1], dest="assistant_int8", action="store_true",
                       help="draft with a dynamically quantized int8 copy of the assistant (CPU)")


def assistant_quantization(args) -> str | None:
    """"int4", "int8" or None, from the flags of `add_assistant_quantization`."""
    if getattr(args, "assistant_int4", False):
        return "int4"
    return "int8" if getattr(args, "assistant_int8", False) else None


def assistant_label(args) -> str:
    """The assistant as a results README names it."""
    quantize = assistant_quantization(args)
    return f"{args.assistant}{f' ({quantize} copy)' if quantize else ''}"


def chat_ids(tokenizer, prompt: dict) -> list[int]:
    """The ids of a one-message chat holding `prompt["prompt"]`, ready for the assistant's reply."""
    return list(tokenizer.apply_chat_template([{"role": "user", "content": prompt["prompt"]}],
                                              add_generation_prompt=True, return_dict=True)["input_ids"])

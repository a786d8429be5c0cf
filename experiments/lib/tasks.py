"""The benchmarks' one task registry: every structured task (schema and the message that asks for it), the free
prompts of the speedup set and their fixed split, and the checks of an output.

Groups: `DEMO` (the demo: the seed's Character example, from .txt's "Coalescence" post, and an employee),
`HELD_OUT` (four extractions written for the comparison with XGrammar: invoice, patient, flight, review), `BUDGET`
(the tight-budget tasks, the invoice last), `TICKET` (the throughput documents' instruction and schema). `task(name)`
finds any of them.

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

from pydantic import BaseModel, Field

from assisted.models.loading import set_eos  # noqa: F401  (every system compared stops on one set)

SPLIT_PROMPTS = Path(__file__).parents[1] / "prompts" / "split.json"
HALVES = ("tuning", "validation")


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


def _model(model_name: str, /, **fields) -> type[BaseModel]:
    """A pydantic model from {field: annotation or (annotation, Field(...))}."""
    from pydantic import create_model
    return create_model(model_name, **{k: v if isinstance(v, tuple) else (v, ...) for k, v in fields.items()})


def _short(n: int):
    return str, Field(max_length=n)


def _pattern(regex: str):
    return str, Field(pattern=regex)


DATE = _pattern(r"^\d{4}-\d{2}-\d{2}$")
IATA = _pattern(r"^[A-Z]{3}$")

# ---------------------------------------------------------------- the demo's tasks
Character = _model("Character", name=_short(10), age=int, armor=Literal["leather", "chainmail", "plate"],
                   strength=int)  # the seed's Character example (.txt "Coalescence" post)
Office = _model("Office", city=_short(24), country=_short(24))
Employee = _model("Employee", name=_short(32), age=int, role=_short(32), remote=bool, office=Office)

CHARACTER = Task("character", "seed", Character,
                 "Create a fantasy character as JSON with the fields name, age, armor (leather, chainmail "
                 "or plate) and strength.")
EMPLOYEE = Task("employee", "extraction", Employee,
                "Extract the employee described below as JSON with name, age, role, remote (true/false) and "
                "office (city, country).\n\n"
                "Maria Lopez, 34, joined Northwind last spring as a senior data engineer. She works from the "
                "company's office in Lisbon, Portugal, three days a week and is not a remote employee.")

# ---------------------------------------------------------------- held-out extractions (vs XGrammar, figures)
LineItem = _model("LineItem", description=_short(40), quantity=(int, Field(ge=1)), unit_price=float)
Invoice = _model("Invoice", invoice_number=_short(20), vendor=_short(40), date=DATE,
                 items=(list[LineItem], Field(min_length=1, max_length=4)), currency=IATA)
Patient = _model("Patient", name=_short(40), age=(int, Field(ge=0, le=130)), allergies=(list[str], Field(max_length=4)),
                 blood_type=_pattern(r"^(A|B|AB|O)[+-]$"))
Flight = _model("Flight", passenger=_short(40), flight_number=_pattern(r"^[A-Z]{2}[0-9]{2,4}$"), origin=IATA,
                destination=IATA, seat=_short(4), checked_bags=(int, Field(ge=0, le=5)))
Review = _model("Review", product=_short(40), rating=(int, Field(ge=1, le=5)), pros=(list[str], Field(max_length=3)),
                cons=(list[str], Field(max_length=3)), would_recommend=bool)

HELD_OUT = (
    Task("invoice", "extraction", Invoice,
         "Extract the invoice below as JSON with invoice_number, vendor, date (YYYY-MM-DD), items (description, "
         "quantity, unit_price) and currency.\n\nInvoice INV-2291 from Baltic Office Supply, dated 2026-03-02: "
         "3 desk lamps at 24.90 EUR each, 10 packs of printer paper at 4.50 EUR and one 27-inch monitor at "
         "219.00 EUR. All prices in EUR."),
    Task("patient", "extraction", Patient,
         "Extract the patient record below as JSON with name, age, allergies and blood_type.\n\nJonas Weber, "
         "58 years old, was admitted on Tuesday. He is allergic to penicillin and peanuts. Blood type: A negative."),
    Task("flight", "extraction", Flight,
         "Extract the booking below as JSON with passenger, flight_number, origin and destination (IATA codes), "
         "seat and checked_bags.\n\nBooking confirmed for Aiko Yamamoto on LH1234 from Frankfurt (FRA) to "
         "Lisbon (LIS), seat 14C, with two checked bags."),
    Task("review", "extraction", Review,
         "Extract the product review below as JSON with product, rating (1-5), pros, cons and would_recommend."
         "\n\nI have used the Trailblazer 2 hiking boots for a month. Very comfortable and fully waterproof, "
         "but they are heavy and the laces keep coming loose. Four stars; I would still buy them again."),
)

# ---------------------------------------------------------------- tight budgets (close_within_budget)
Package = _model("Package", weight_kg=float, fragile=bool)
Address = _model("Address", city=_short(30), country=_short(30))
Shipment = _model("Shipment", tracking_number=_pattern(r"^[A-Z]{2}[0-9]{6,9}$"), carrier=_short(20), sender=Address,
                  recipient=Address, packages=(list[Package], Field(min_length=1, max_length=4)))
Ingredient = _model("Ingredient", name=_short(30), amount=_short(16))
Recipe = _model("Recipe", title=_short(40), servings=(int, Field(ge=1, le=20)), minutes=int,
                ingredients=(list[Ingredient], Field(min_length=1, max_length=8)), vegetarian=bool)
Meeting = _model("Meeting", title=_short(40), date=DATE, start=_pattern(r"^\d{2}:\d{2}$"),
                 attendees=(list[str], Field(min_length=1, max_length=6)), room=_short(20),
                 decisions=(list[str], Field(max_length=4)))

BUDGET = (
    Task("shipment", "extraction", Shipment,
         "Extract the shipment below as JSON with tracking_number, carrier, sender and recipient (city, country) "
         "and packages (weight_kg, fragile).\n\nParcel DE48213377 went out with DHL from Hamburg, Germany to Porto, "
         "Portugal: a 2.4 kg box of glassware (fragile) and a 7.9 kg box of books."),
    Task("recipe", "extraction", Recipe,
         "Extract the recipe below as JSON with title, servings, minutes, ingredients (name, amount) and "
         "vegetarian.\n\nLentil soup for four, ready in 45 minutes: 250 g red lentils, 1 onion, 2 carrots, "
         "1 litre vegetable stock, 1 tsp cumin and a squeeze of lemon. No meat at all."),
    Task("meeting", "extraction", Meeting,
         "Extract the meeting notes below as JSON with title, date, start (HH:MM), attendees, room and "
         "decisions.\n\nBudget review, 2026-04-09 at 14:30 in room B12. Present: Ana Silva, Ken Ito and Lea "
         "Brandt. Decided: freeze travel spending until June; move the offsite to September."),
    HELD_OUT[0],
)

# ---------------------------------------------------------------- support tickets (throughput; documents in prompts/)
Customer = _model("Customer", name=_short(40), account_tier=Literal["free", "pro", "enterprise"])
Product = _model("Product", product=_short(32), quantity=(int, Field(ge=1, le=500)))
Ticket = _model("Ticket", customer=Customer,
                category=Literal["billing", "shipping", "technical", "account", "feedback", "other"],
                priority=Literal["low", "medium", "high", "urgent"], products=(list[Product], Field(max_length=4)),
                sentiment=Literal["negative", "neutral", "positive"], summary=_short(80))
TICKET = Task("ticket", "extraction", Ticket,
              "Extract the support ticket below as JSON: the customer (name, and account_tier: free, pro or "
              "enterprise; free when not said), category, priority, the products it mentions with quantities "
              "(an empty list if none), the customer's sentiment and a one-line summary.\n\n")

DEMO = (CHARACTER, EMPLOYEE)
TASKS = {t.name: t for t in (*DEMO, *HELD_OUT, *BUDGET, TICKET)}


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

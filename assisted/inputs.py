"""The user boundary of generate(): every argument checked before any model call.

Errors name the argument and what was wrong with it. Schema and regex errors come from fsm.
"""

from __future__ import annotations

import json
import numbers
from dataclasses import dataclass
from typing import Any

import jsonschema
import pydantic
import torch

import fsm
from assisted.cache import logits_size
from assisted.policy import SCHEDULES
from assisted.sampling import Warp
from drafting.base import Cursor


@dataclass(frozen=True)
class Options:
    """Validated decoding options."""

    max_new_tokens: int  # token budget for new tokens (EOS included)
    warp: Warp  # greedy or sampling, with temperature / top-k / top-p
    seed: int | None  # seeds the target's and the assistant's generators
    num_assistant_tokens: int  # the policy's first k
    schedule: str  # a key of policy.SCHEDULES: "constant", "heuristic" or "auto"
    coalesce: bool  # forced tokens appended unverified (True) or drafted as point masses (False)


def check_options(
    max_new_tokens, do_sample, temperature, top_k, top_p, seed, num_assistant_tokens, schedule, coalesce
) -> Options:
    """Validate the scalar options; raises ValueError/TypeError naming the argument."""
    _int("max_new_tokens", max_new_tokens, low=1)
    _int("num_assistant_tokens", num_assistant_tokens, low=1)
    _real("temperature", temperature)
    if do_sample and temperature <= 0:
        raise ValueError(f"temperature must be > 0 when do_sample=True, got {temperature}")
    if top_k is not None:
        _int("top_k", top_k, low=1)
    if top_p is not None and not (_real("top_p", top_p) and 0 < top_p <= 1):
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if seed is not None:
        _int("seed", seed, low=0)
    if schedule is None:  # auto's draft lengths follow timings: a seeded sample would not repeat under it
        schedule = "heuristic" if do_sample and seed is not None else "auto"
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; choose one of {', '.join(map(repr, SCHEDULES))}")
    warp = Warp(bool(do_sample), float(temperature), top_k, None if top_p is None else float(top_p))
    return Options(max_new_tokens, warp, seed, num_assistant_tokens, schedule, bool(coalesce))


def _int(name: str, value, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")


def _real(name: str, value) -> bool:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    return True


def check_models(model, assistant_model, tokenizer) -> int:
    """The target's logits size, after checking that the assistant and tokenizer share the vocabulary."""
    size = logits_size(model)
    if len(tokenizer) > size:
        raise ValueError(f"the tokenizer has {len(tokenizer)} tokens but the model's logits only {size}")
    if assistant_model is not None:
        theirs = logits_size(assistant_model)
        if theirs != size:
            raise ValueError(
                f"assistant_model's vocabulary differs from the model's: logits of size {theirs} vs {size}; "
                "the assistant must share the target's tokenizer and vocabulary"
            )
    return size


def prompt_ids(tokenizer, prompt, messages, input_ids, vocab_size: int) -> list[int]:
    """Exactly one of the three prompt forms -> one sequence of ids (batch size 1)."""
    forms = (("prompt", prompt), ("messages", messages), ("input_ids", input_ids))
    given = [name for name, value in forms if value is not None]
    if len(given) != 1:
        raise ValueError(f"pass exactly one of prompt, messages, input_ids; got {', '.join(given) or 'none'}")
    if prompt is not None:
        ids = _from_prompt(tokenizer, prompt)
    elif messages is not None:
        ids = _from_messages(tokenizer, messages)
    else:
        ids = _from_ids(input_ids)
    if not ids:
        raise ValueError(f"the {given[0]} is empty: at least one prompt token is needed")
    bad = [i for i in ids if not 0 <= i < vocab_size]
    if bad:
        raise ValueError(f"input_ids hold ids outside the vocabulary [0, {vocab_size}): {bad[:5]}")
    return ids


def _batch_error(size: int) -> ValueError:
    return ValueError(f"batch size {size} is not supported yet: pass one sequence")


def _from_prompt(tokenizer, prompt) -> list[int]:
    if isinstance(prompt, (list, tuple)):
        if len(prompt) != 1:
            raise _batch_error(len(prompt))
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise TypeError(f"prompt must be a str, got {type(prompt).__name__}")
    return list(tokenizer(prompt)["input_ids"])


def _from_messages(tokenizer, messages) -> list[int]:
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ValueError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
    if all(isinstance(m, (list, tuple)) for m in messages):
        if len(messages) != 1:
            raise _batch_error(len(messages))
        messages = messages[0]
    if not all(isinstance(m, dict) and "role" in m and "content" in m for m in messages):
        raise ValueError("messages must be a list of {'role': ..., 'content': ...} dicts")
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError("messages need a chat template, and this tokenizer has none: pass prompt= instead")
    text = tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _from_ids(input_ids) -> list[int]:
    if isinstance(input_ids, torch.Tensor):
        if input_ids.dim() == 2:
            if input_ids.shape[0] != 1:
                raise _batch_error(input_ids.shape[0])
            input_ids = input_ids[0]
        if input_ids.dim() != 1:
            raise ValueError(f"input_ids must have shape (n,) or (1, n), got {tuple(input_ids.shape)}")
        return [int(i) for i in input_ids.tolist()]
    ids = list(input_ids)
    if ids and all(isinstance(row, (list, tuple)) for row in ids):
        if len(ids) != 1:
            raise _batch_error(len(ids))
        ids = list(ids[0])
    if not all(isinstance(i, numbers.Integral) and not isinstance(i, bool) for i in ids):
        raise TypeError("input_ids must be ints (a list, a 1-D tensor or a (1, n) tensor)")
    return [int(i) for i in ids]


def eos_ids(model, tokenizer) -> frozenset[int]:
    """EOS ids of the tokenizer and of the model's generation config."""
    ids = {tokenizer.eos_token_id}
    config = getattr(model, "generation_config", None)
    found = getattr(config, "eos_token_id", None) if config is not None else None
    ids.update(found if isinstance(found, (list, tuple)) else [found])
    return frozenset(i for i in ids if i is not None)


def make_cursor(schema, regex, tokenizer, vocab_size: int, eos: frozenset[int]) -> Cursor:
    """The constraint as a cursor (unconstrained without schema and regex); fsm errors pass through."""
    if schema is not None and regex is not None:
        raise ValueError("pass at most one of schema and regex, not both")
    if regex is not None and not isinstance(regex, str):
        raise TypeError(f"regex must be a str, got {type(regex).__name__}")
    if schema is None and regex is None:
        return Cursor(None, eos)
    build = fsm.Guide.from_regex if regex is not None else fsm.Guide.from_schema
    guide = build(regex if regex is not None else schema, tokenizer, vocab_size=vocab_size, eos_token_ids=sorted(eos))
    return Cursor(guide, frozenset(guide.eos_token_ids))


def parse_value(schema, text: str, complete: bool) -> Any:
    """The output as a validated instance of `schema`, or None when the text is not complete.

    Completeness comes from the guide (`complete`: it accepts the text as a whole match), validity from the
    schema's own validator: pydantic for a pydantic class, `jsonschema` (the draft the schema's `$schema` names,
    else 2020-12) for a dict or a JSON string. A text cut by the token budget before it was complete gives None,
    never a parsed prefix ("1" for an integer of at least 1000).

    Raises
    ------
    ValueError
        When the guide accepted a text that the schema's validator rejects (a bug of the guide: never silent).
    """
    if schema is None or not complete:
        return None
    if isinstance(schema, type) and issubclass(schema, pydantic.BaseModel):
        return schema.model_validate_json(text)
    value = json.loads(text)
    schema = json.loads(schema) if isinstance(schema, str) else schema
    validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    error = jsonschema.exceptions.best_match(validator(schema).iter_errors(value))
    if error is not None:
        raise ValueError(f"the guide accepted {text[:80]!r}, which the schema rejects at "
                         f"{error.json_path}: {error.message}")
    return value

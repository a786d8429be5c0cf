"""The user boundary of generate(): every argument checked before any model call.

Errors name the argument and what was wrong with it. Schema and regex errors come from fsm.
"""

from __future__ import annotations

import json
import math
import numbers
from dataclasses import dataclass, replace
from typing import Any

import jsonschema
import numpy as np
import pydantic
import torch

import fsm
from drafting.kv_cache import logits_size
from drafting.processors import Processors
from assisted.policy.draft_policy import SCHEDULES
from drafting.sampling import Warp
from drafting.base import Cursor


LOOKUP_UNBOUNDED = 10**9  # prompt lookup copies as long as the policy's lookup length allows


@dataclass(frozen=True)
class Options:
    """Validated decoding options."""

    max_new_tokens: int  # token budget for new tokens (EOS included)
    warp: Warp  # greedy or sampling, with temperature / top-k / top-p
    seed: int | None  # seeds the target's and the assistant's generators
    num_assistant_tokens: int  # the policy's first k
    schedule: str  # a key of policy.SCHEDULES: "constant", "heuristic" or "auto"
    coalesce: bool  # forced tokens appended unverified (True) or drafted as point masses (False)
    prompt_lookup: bool = False  # also draft copies of the prompt
    lookup_tokens: int = LOOKUP_UNBOUNDED  # ... at most this many per step
    processors: Processors | None = None  # logits processors, applied per scored position (None: none)
    close_within_budget: bool = False  # allow only tokens after which a valid completion fits in the tokens left


def check_options(
    max_new_tokens, do_sample, temperature, top_k, top_p, seed, num_assistant_tokens, schedule, coalesce,
    prompt_lookup=False,
) -> Options:
    """Validate the scalar options; raises ValueError/TypeError naming the argument.

    `schedule` None picks "auto" (or "heuristic" for a seeded sample); `prompt_lookup` None turns prompt lookup on
    under "auto", whose cuts price each copied token by the acceptance the call measures for copies (a call whose
    copies fail soon verifies none), and off under the fixed schedules, which would verify every copy.
    """
    check_int("max_new_tokens", max_new_tokens, low=1)
    check_int("num_assistant_tokens", num_assistant_tokens, low=1)
    _bool("do_sample", do_sample)
    _bool("coalesce", coalesce)
    _real("temperature", temperature)
    if do_sample and temperature <= 0:
        raise ValueError(f"temperature must be > 0 when do_sample=True, got {temperature}")
    if top_k is not None:
        check_int("top_k", top_k, low=1)
    if top_p is not None and not (_real("top_p", top_p) and 0 < top_p <= 1):
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if seed is not None:
        check_int("seed", seed, low=0, high=MAX_SEED)
    if schedule is None:  # auto's draft lengths follow timings: a seeded sample would not repeat under it
        schedule = "heuristic" if do_sample and seed is not None else "auto"
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; choose one of {', '.join(map(repr, SCHEDULES))}")
    if prompt_lookup is None:
        prompt_lookup = schedule == "auto"
    _bool("prompt_lookup", prompt_lookup)
    warp = Warp(bool(do_sample), float(temperature), top_k, None if top_p is None else float(top_p))
    return Options(max_new_tokens, warp, seed, num_assistant_tokens, schedule, bool(coalesce), bool(prompt_lookup))


MAX_SEED = 2**64 - 2  # torch generators take 64 bits; the assistant's is seeded with seed + 1


def check_int(name: str, value, low: int, high: int | None = None) -> None:
    """TypeError unless `value` is an int (not a bool), ValueError outside [low, high]."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")
    if high is not None and value > high:
        raise ValueError(f"{name} must be <= {high}, got {value}")


def _real(name: str, value) -> bool:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value}")
    return True


def _bool(name: str, value) -> None:
    if not isinstance(value, (bool, np.bool_)):  # "no" or 0.0 must not pass as a truth value
        raise TypeError(f"{name} must be True or False, got {type(value).__name__} {value!r}")


def check_models(model, assistant_model, tokenizer) -> int:
    """The target's logits size, after checking that the assistant and tokenizer share the vocabulary."""
    for name, value in (("model", model), ("assistant_model", assistant_model)):
        if value is not None and not isinstance(value, torch.nn.Module):
            raise TypeError(f"{name} must be a loaded causal LM (a torch.nn.Module), got {type(value).__name__} "
                            f"{value!r:.60}: load it first, e.g. AutoModelForCausalLM.from_pretrained(name)")
    if not all(callable(getattr(tokenizer, m, None)) for m in ("__call__", "__len__", "decode")):
        raise TypeError(f"tokenizer must be the model's transformers tokenizer, got {type(tokenizer).__name__}")
    size = logits_size(model)
    if len(tokenizer) > size:
        raise ValueError(f"the tokenizer has {len(tokenizer)} tokens but the model's logits only {size}")
    if assistant_model is not None:
        theirs = logits_size(assistant_model)
        if theirs != size:
            raise ValueError(
                f"assistant_model's vocabulary differs from the model's: logits of size {theirs} vs {size}; "
                "pass its own tokenizer as assistant_tokenizer= to draft across vocabularies"
            )
    return size


def one_prompt(prompt, messages, input_ids) -> tuple[str, Any]:
    """(form, value) of the one prompt form given; ValueError unless exactly one is."""
    forms = [(name, value) for name, value in (("prompt", prompt), ("messages", messages), ("input_ids", input_ids))
             if value is not None]
    if len(forms) != 1:
        raise ValueError(f"pass exactly one of prompt, messages, input_ids; got "
                         f"{', '.join(name for name, _ in forms) or 'none'}")
    return forms[0]


def prompt_ids(tokenizer, prompt, messages, input_ids, vocab_size: int) -> list[int]:
    """Exactly one of the three prompt forms -> one sequence of ids (batch size 1)."""
    given = [one_prompt(prompt, messages, input_ids)[0]]
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
    for i, m in enumerate(messages):
        if not isinstance(m["role"], str) or not isinstance(m["content"], (str, list)):
            raise TypeError(f"messages[{i}] needs a str 'role' and a str (or list of parts) 'content', "
                            f"got role {m['role']!r}, content {m['content']!r:.60}")
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
        if input_ids.dtype.is_floating_point or input_ids.dtype.is_complex or input_ids.dtype == torch.bool:
            raise TypeError(f"input_ids must be a tensor of integer ids, got dtype {input_ids.dtype}")
        return [int(i) for i in input_ids.tolist()]
    ids = list(input_ids)
    if ids and all(isinstance(row, (list, tuple)) for row in ids):
        if len(ids) != 1:
            raise _batch_error(len(ids))
        ids = list(ids[0])
    if not all(isinstance(i, numbers.Integral) and not isinstance(i, bool) for i in ids):
        raise TypeError("input_ids must be ints (a list, a 1-D tensor or a (1, n) tensor)")
    return [int(i) for i in ids]


def fit_positions(opts: Options, prompt_length: int, *models) -> Options:
    """`opts` with the budget cut so that prompt + output fit every model's position limit
    (`config.max_position_embeddings`, GPT-2's `n_positions`): generation then stops with "length" at the
    limit, keeping what it generated, instead of failing inside a forward. Raises ValueError when the prompt
    alone leaves no room."""
    limits = [(getattr(getattr(m, "config", None), "max_position_embeddings", None), name)
              for m, name in zip(models, ("model", "assistant_model")) if m is not None]
    limits = [(limit, name) for limit, name in limits if isinstance(limit, int) and limit > 0]
    if not limits:
        return opts
    limit, name = min(limits, key=lambda pair: pair[0])
    if prompt_length >= limit:
        raise ValueError(f"the prompt has {prompt_length} tokens but {name} takes at most {limit} positions "
                         "(config.max_position_embeddings): no room for a new token; shorten the prompt")
    return replace(opts, max_new_tokens=min(opts.max_new_tokens, limit - prompt_length))


SCHEMA_OPTIONS = frozenset({"policy", "whitespace", "additional_properties", "property_order", "max_recursion_depth",
                            "budget"})  # what `fsm.Guide.from_schema` takes; a regex guide takes only "budget"


def make_cursor(schema, regex, tokenizer, vocab_size: int, eos: frozenset[int], guide_options: dict | None = None
                ) -> Cursor:
    """The constraint as a cursor (unconstrained without schema and regex); fsm errors pass through."""
    if schema is not None and regex is not None:
        raise ValueError("pass at most one of schema and regex, not both")
    if regex is not None and not isinstance(regex, str):
        raise TypeError(f"regex must be a str, got {type(regex).__name__}")
    if schema is None and regex is None:
        if guide_options:
            raise ValueError("guide_options need a schema or a regex")
        return Cursor(None, eos)
    options = check_guide_options(guide_options, schema is not None)
    build = fsm.Guide.from_regex if regex is not None else fsm.Guide.from_schema
    guide = build(regex if regex is not None else schema, tokenizer, vocab_size=vocab_size, eos_token_ids=sorted(eos),
                  **options)
    return Cursor(guide, frozenset(guide.eos_token_ids))


def check_guide_options(options, for_schema: bool) -> dict:
    """`guide_options` checked against what the guide takes (a dict; schema options only with a schema)."""
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise TypeError(f"guide_options must be a dict, got {type(options).__name__}")
    allowed = SCHEMA_OPTIONS if for_schema else frozenset({"budget"})
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise ValueError(f"guide_options: {unknown[0]!r} is not an option of a {'schema' if for_schema else 'regex'} "
                         f"guide (known: {', '.join(sorted(allowed))})")
    return dict(options)


VALIDATORS = {"draft-04": jsonschema.Draft4Validator, "draft-06": jsonschema.Draft6Validator,
              "draft-07": jsonschema.Draft7Validator, "2019-09": jsonschema.Draft201909Validator,
              "2020-12": jsonschema.Draft202012Validator}


def validator_class(schema) -> type:
    """The `jsonschema` validator of the dialect the guide reads `schema` in (`fsm.schema_dialect`), so that
    `value` validation and the guide agree on it ("https://json-schema.org/draft-07/schema" is draft-07 to
    both, where `jsonschema.validators.validator_for` would fall back to 2020-12)."""
    return VALIDATORS[fsm.schema_dialect(schema)]


def parse_value(schema, text: str, complete: bool) -> Any:
    """The output as a validated instance of `schema`, or None when the text is not complete.

    Completeness comes from the guide (`complete`: it accepts the text as a whole match), validity from the
    schema's own validator: pydantic for a pydantic class, `jsonschema` for a dict or a JSON string, in the
    dialect the guide reads (`validator_class`: the draft the schema's `$schema` names, else 2020-12). A text
    cut by the token budget before it was complete gives None, never a parsed prefix ("1" for an integer of
    at least 1000).

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
    validator = validator_class(schema)
    error = jsonschema.exceptions.best_match(validator(schema).iter_errors(value))
    if error is not None:
        raise ValueError(f"the guide accepted {text[:80]!r}, which the schema rejects at "
                         f"{error.json_path}: {error.message}")
    return value

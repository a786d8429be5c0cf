"""generate()'s options by transformers' names: a `GenerationConfig` plus keyword overrides, as `model.generate`
reads them.

Priority, as in transformers: keyword arguments > `generation_config=` (else `model.generation_config`, where hub
models keep their sampling defaults and repetition penalty) > this library's defaults. Those defaults differ from
transformers' global ones where noted in `DEFAULTS` (transformers: top_k 50, max_length 20, 20 assistant tokens,
"constant" schedule). Every field set to something other than transformers' own default must be one this module
honours (`HONOURED`) or is inert for a decoder-only batch of one (`INERT`); any other is refused with a one-line
error naming it and where it came from, never ignored (transformers warns and ignores).

This library's own knobs (`seed`, `coalesce`, `tree`, `cuda_graphs`) are read beside transformers' names, from the
keyword arguments or from custom entries of the config (`GenerationConfig(coalesce=False)`). `schedule` and
`prompt_lookup` are deprecated aliases of `num_assistant_tokens_schedule` and `prompt_lookup_num_tokens`.
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass, replace

from assisted.inputs import LOOKUP_UNBOUNDED, Options, check_int, check_options
from drafting.processors import Processors, built_in

DEFAULTS = {  # where unset everywhere (transformers' global default in the comment where it differs)
    "max_new_tokens": 256,  # transformers: max_length 20, prompt included
    "do_sample": False, "temperature": 1.0, "top_p": None,
    "top_k": None,  # transformers: 50 when sampling
    "repetition_penalty": None, "no_repeat_ngram_size": None,
    "num_assistant_tokens": 5,  # transformers: 20
    "num_assistant_tokens_schedule": None,  # "auto" ("heuristic" for a seeded sample); transformers: "constant"
    "prompt_lookup_num_tokens": None,  # on under "auto", priced per copy; 0 turns it off
    "eos_token_id": None, "stop_strings": None, "cache_implementation": None,
}
HONOURED = frozenset(DEFAULTS) | {"max_length"}
INERT = frozenset({"bos_token_id", "pad_token_id", "decoder_start_token_id", "use_cache", "transformers_version",
                   "_from_model_config", "output_attentions", "output_hidden_states", "output_scores",
                   "output_logits", "return_dict_in_generate"})
OURS = {"seed": None, "coalesce": True, "tree": False, "cuda_graphs": None, "close_within_budget": False}
ALIASES = {"schedule": "num_assistant_tokens_schedule", "prompt_lookup": "prompt_lookup_num_tokens"}
SCHEDULE_NAMES = {"heuristic_transient": "heuristic"}  # ours never carries k from call to call: transient already


@dataclass(frozen=True)
class Settings:
    """The call's options after the config, the model's config and the keyword arguments are merged."""

    values: dict  # HONOURED names -> value (DEFAULTS where unset), plus OURS
    max_length: int | None  # a config's max_length where it sets no max_new_tokens (the budget is then derived)

    def __getattr__(self, name: str):
        try:
            return self.values[name]
        except KeyError:
            raise AttributeError(name) from None


def resolve(model, generation_config, kwargs: dict) -> Settings:
    """Merge the call's options; TypeError for an unknown keyword, ValueError for a set field not honoured."""
    from transformers import GenerationConfig

    if generation_config is not None and not isinstance(generation_config, GenerationConfig):
        raise TypeError(
            f"generation_config must be a transformers.GenerationConfig, got {type(generation_config).__name__}"
        )
    source = "generation_config" if generation_config is not None else "model.generation_config"
    config = copy.deepcopy(generation_config if generation_config is not None
                           else getattr(model, "generation_config", None) or GenerationConfig())
    ours = {name: kwargs.pop(name) for name in list(kwargs) if name in OURS}
    kwargs = _renamed(kwargs)
    set_by_config = {k: v for k, v in config.to_diff_dict().items() if k not in kwargs}
    unknown = [name for name in kwargs if not hasattr(GenerationConfig(), name)]
    if unknown:
        raise TypeError(f"generate() got an unexpected keyword argument {unknown[0]!r}")
    for name, value in kwargs.items():  # set, not `update`: values are checked by this library, with its messages
        setattr(config, name, value)
    _refuse_unhonoured(set_by_config, source)
    _refuse_unhonoured(kwargs, "the call")
    values = {name: _first(getattr(config, name, None), default) for name, default in DEFAULTS.items()}
    values |= {name: ours.get(name, getattr(config, name, default)) for name, default in OURS.items()}
    values["num_assistant_tokens_schedule"] = SCHEDULE_NAMES.get(values["num_assistant_tokens_schedule"],
                                                                 values["num_assistant_tokens_schedule"])
    if "eos_token_id" not in kwargs and generation_config is None:
        values["eos_token_id"] = None  # the model's own EOS joins the tokenizer's (`assisted.eos.eos_ids`)
    explicit_budget = "max_new_tokens" in kwargs or config.max_new_tokens is not None
    return Settings(values, None if explicit_budget else config.max_length)


def _renamed(kwargs: dict) -> dict:
    """Deprecated aliases under their transformers names (a warning each); both names at once is an error."""
    out = dict(kwargs)
    for old, new in ALIASES.items():
        if old in out:
            if new in out:
                raise TypeError(f"pass {new}= or its deprecated alias {old}=, not both")
            warnings.warn(f"generate(): {old}= is deprecated, use {new}=", DeprecationWarning, stacklevel=4)
            value = out.pop(old)
            out[new] = _lookup_tokens(value) if old == "prompt_lookup" else value
    return out


def _lookup_tokens(flag):
    """`prompt_lookup` True / False / None as `prompt_lookup_num_tokens` (unbounded / 0 / default)."""
    if flag is not None and not isinstance(flag, bool):
        raise TypeError(f"prompt_lookup must be a bool or None, got {type(flag).__name__} {flag!r}")
    return None if flag is None else (LOOKUP_UNBOUNDED if flag else 0)




def _refuse_unhonoured(set_fields: dict, source: str) -> None:
    from transformers import GenerationConfig

    defaults = GenerationConfig._get_default_generation_params()
    for name, value in set_fields.items():
        if name in HONOURED or name in INERT or name in OURS or value is None or defaults.get(name, object()) == value:
            continue
        raise ValueError(f"{source} sets {name}={value!r}, which generate() cannot honour"
                         + ("" if source == "the call" else f"; pass {name}={defaults.get(name)!r} to override it"))


def _first(value, default):
    return default if value is None else value


def options(settings, prompt_length: int, logits_processor) -> Options:
    """The loop's Options from merged settings (`assisted.config.resolve`); errors name the option."""
    budget = settings.max_new_tokens
    if settings.max_length is not None:  # a config that sets only max_length bounds prompt + output, as transformers
        budget = settings.max_length - prompt_length
        if budget < 1:
            raise ValueError(f"max_length={settings.max_length} leaves no room after the prompt's {prompt_length} "
                             "tokens; pass max_new_tokens")
    lookup = settings.prompt_lookup_num_tokens
    if lookup is not None:
        check_int("prompt_lookup_num_tokens", lookup, low=0)
    if settings.top_k is not None:
        check_int("top_k", settings.top_k, low=0)
    top_k = None if settings.top_k == 0 else settings.top_k  # 0: no top-k, as in transformers
    opts = check_options(budget, settings.do_sample, settings.temperature, top_k, settings.top_p, settings.seed,
                         settings.num_assistant_tokens, settings.num_assistant_tokens_schedule, settings.coalesce,
                         None if lookup is None else lookup > 0)
    processors = Processors([*built_in(settings.repetition_penalty, settings.no_repeat_ngram_size),
                             *_processor_list(logits_processor)])
    if not isinstance(settings.close_within_budget, bool):
        raise TypeError(f"close_within_budget must be a bool, got {type(settings.close_within_budget).__name__} "
                        f"{settings.close_within_budget!r}")
    return replace(opts, lookup_tokens=lookup or LOOKUP_UNBOUNDED, processors=processors or None,
                   close_within_budget=settings.close_within_budget)


def _processor_list(logits_processor) -> list:
    if logits_processor is None:
        return []
    items = list(logits_processor) if isinstance(logits_processor, (list, tuple)) else None
    if items is None or not all(callable(p) for p in items):
        raise TypeError(f"logits_processor must be a list of transformers LogitsProcessor objects, got "
                        f"{type(logits_processor).__name__}")
    return items

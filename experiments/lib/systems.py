"""The systems the benchmarks compare, built one way: the target alone, transformers' assisted generation, transformers
with a grammar's logits processor (XGrammar's or ours), and ours under named option presets. llama.cpp is
`experiments.lib.llamacpp`.

`Systems(model, tokenizer, assistant).run(name, ids, task=None, temperature=0.0, seed=0)` runs one by name and returns
an `Output`. Names:

  target                        model.generate, no assistant
  hf-default, hf-heuristic      model.generate(assistant_model=...) with the assistant's loaded drafting settings
                                (transformers' defaults: 20 tokens, "constant") or 5 tokens, "heuristic"
  xgrammar, xgrammar-compact    model.generate + XGrammar's processor (its defaults: any whitespace; or compact JSON)
  ours-processor                model.generate + assisted.logits_processor
  <any of those>+assistant      the same with the assistant (transformers' assisted generation, loaded settings)
  ours-auto, constrained, constrained+forced, full-no-lookup, full
                                assisted.generate under the options of `OURS`

All systems stop on the same EOS set and sample with no top-k / top-p / repetition penalty.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass

import torch

from assisted import generate, logits_processor
from drafting.kv_cache import logits_size
from experiments.lib.report import package_version

# preset -> (drafts with the assistant, options of assisted.generate)
OURS = {
    "ours-auto": (True, {"num_assistant_tokens_schedule": "auto"}),
    "constrained": (False, {"coalesce": False, "prompt_lookup_num_tokens": 0}),
    "constrained+forced": (False, {"coalesce": True, "prompt_lookup_num_tokens": 0}),
    "full-no-lookup": (True, {"coalesce": True, "prompt_lookup_num_tokens": 0}),
    "full": (True, {"coalesce": True}),
}
DRAFTING_SETTINGS = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")


@dataclass(frozen=True)
class Output:
    """One generation: its text, new token ids (EOS included), target forwards, and the assistant's acceptance and
    mean draft cap where they apply (nan elsewhere)."""

    text: str
    tokens: tuple[int, ...]
    target_forwards: int
    acceptance: float = math.nan
    mean_k: float = math.nan

    @property
    def new_tokens(self) -> int:
        return len(self.tokens)


class count_forwards:  # noqa: N801 (used like a function)
    """Count forward calls of a module with a forward hook; `.remove()` detaches it."""

    def __init__(self, module):
        self.n = 0
        self._handle = module.register_forward_hook(self._hook)

    def _hook(self, *_):
        self.n += 1

    def remove(self) -> None:
        self._handle.remove()


class Systems:
    """One set of models and every system over it (see the module docstring)."""

    def __init__(self, model, tokenizer, assistant=None, *, max_new_tokens: int = 160, num_assistant_tokens: int = 5):
        self.model, self.tokenizer, self.assistant = model, tokenizer, assistant
        self.max_new, self.k = max_new_tokens, num_assistant_tokens
        eos = model.generation_config.eos_token_id
        self.eos = [eos] if isinstance(eos, int) else list(eos or [])
        config = getattr(assistant, "generation_config", None)
        self.defaults = {k: getattr(config, k) for k in DRAFTING_SETTINGS} if config is not None else {}
        self._compiler = None

    def run(self, name: str, ids: list[int], task=None, temperature: float = 0.0, seed: int = 0) -> Output:
        """`name` on prompt `ids` (with `task`'s schema where the system takes one): greedy at temperature 0, else
        sampled at `temperature` with `seed`."""
        counter = count_forwards(self.model)
        helper = count_forwards(self.assistant) if self.assistant is not None else None
        try:
            if name in OURS:
                return self._ours(name, ids, task, temperature, seed, counter)
            return self._transformers(name, ids, task, temperature, seed, counter, helper)
        finally:
            counter.remove()
            if helper is not None:
                helper.remove()

    def _ours(self, name: str, ids, task, temperature: float, seed: int, counter) -> Output:
        drafts, options = OURS[name]
        sample = temperature > 0
        out = generate(self.model, self.assistant if drafts else None, tokenizer=self.tokenizer, input_ids=ids,
                       schema=None if task is None else task.schema, max_new_tokens=self.max_new, do_sample=sample,
                       temperature=temperature if sample else 1.0, seed=seed, num_assistant_tokens=self.k, **options)
        s = out.stats
        drafted, accepted = s.drafted_by_source["assistant"], s.accepted_by_source["assistant"]
        return Output(out.text, tuple(out.token_ids), counter.n, accepted / drafted if drafted else math.nan,
                      statistics.fmean(s.k_trace) if s.k_trace else math.nan)

    def _transformers(self, name: str, ids, task, temperature: float, seed: int, counter, helper) -> Output:
        kwargs, drafting = {}, name.startswith("hf-") or name.endswith("+assistant")
        if drafting:
            drafting_settings(self.assistant, self.defaults, heuristic=name == "hf-heuristic")
            kwargs["assistant_model"] = self.assistant
        base = name.removesuffix("+assistant")
        if base != "target" and not base.startswith("hf-"):
            kwargs["logits_processor"] = [self.processor(base, task)]
        try:
            emitted = transformers_tokens(self.model, ids, self.eos, self.max_new, temperature, seed, **kwargs)
        finally:
            if drafting:
                drafting_settings(self.assistant, self.defaults)
        # every target forward commits one token of its own; the rest were accepted drafts
        acceptance = (len(emitted) - counter.n) / helper.n if drafting and helper.n else math.nan
        return Output(self.tokenizer.decode(emitted, skip_special_tokens=True), tuple(emitted), counter.n, acceptance)

    def processor(self, name: str, task):
        """The logits processor of `name` for `task`: XGrammar's (compiled here, in the timed call) or ours."""
        if name == "ours-processor":
            return logits_processor(self.tokenizer, schema=task.schema, eos_token_ids=self.eos)
        if self._compiler is None:
            self._compiler = xgrammar_compiler(self.model, self.tokenizer, self.eos)
        return xgrammar_processor(self._compiler, task.json_schema(), compact=name == "xgrammar-compact")


def drafting_settings(assistant, loaded: dict, heuristic: bool = False) -> None:
    """The assistant's drafting settings (transformers reads them from its generation config): the `loaded` ones, or
    5 tokens "heuristic" (transformers' assisted generation with its heuristic)."""
    config = assistant.generation_config
    for key, value in loaded.items():
        setattr(config, key, value)
    if heuristic:
        config.num_assistant_tokens, config.num_assistant_tokens_schedule = 5, "heuristic"


def transformers_tokens(model, ids: list[int], eos: list[int], max_new: int, temperature: float = 0.0, seed: int = 0,
                        **kwargs) -> list[int]:
    """transformers' `generate` on prompt `ids` (greedy at temperature 0, else sampled with `seed`; no top-k, top-p
    or repetition penalty), `kwargs` added: the new ids up to the first of `eos`, with it."""
    sample = temperature > 0
    kwargs |= dict(do_sample=sample, max_new_tokens=max_new, top_k=0, top_p=1.0, repetition_penalty=1.0,
                   eos_token_id=eos, pad_token_id=model.generation_config.pad_token_id)
    kwargs |= {"temperature": temperature} if sample else {}
    torch.manual_seed(seed)
    x = torch.tensor([ids], device=model.device)
    with torch.inference_mode():
        emitted = model.generate(x, attention_mask=torch.ones_like(x), **kwargs)[0, len(ids):].tolist()
    stop = next((i for i, t in enumerate(emitted) if t in eos), None)  # EOS, then padding
    return emitted if stop is None else emitted[: stop + 1]


def xgrammar_compiler(model, tokenizer, eos: list[int]):
    """XGrammar's grammar compiler for `tokenizer` over `model`'s logits (the one XGrammar setup of the benchmarks)."""
    import xgrammar
    info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=logits_size(model), stop_token_ids=eos)
    return xgrammar.GrammarCompiler(info)


def xgrammar_processor(compiler, schema: dict, compact: bool):
    """transformers' logits processor of XGrammar for `schema`: its defaults (any whitespace) or compact JSON (no
    whitespace, "," and ":", what ours writes)."""
    import xgrammar
    options = {"any_whitespace": False, "separators": (",", ":")} if compact else {}
    return xgrammar.contrib.hf.LogitsProcessor(compiler.compile_json_schema(json.dumps(schema), **options))


XGRAMMAR_MISSING = ("error: XGrammar (the xgrammar package) is not importable; on a CPU: "
                    "pip install --no-deps xgrammar apache-tvm-ffi (triton is not needed)")


def xgrammar_version() -> str | None:
    """XGrammar's version, or None when it is not importable (the systems that need it are then skipped)."""
    try:
        import xgrammar
    except ImportError:
        return None
    return getattr(xgrammar, "__version__", None) or package_version("xgrammar") or "unknown"

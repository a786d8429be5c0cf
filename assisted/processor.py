"""A `transformers.LogitsProcessor` that constrains `model.generate(...)` with a schema or regex.

Each row's guide (an `fsm.Guide`, a cursor over the constraint's index) is a function of the tokens that row generated
after the prompt, looked up in a dictionary keyed by those tokens (filled on first sight by advancing a copy of the
parent prefix's guide). Nothing
depends on the order of calls, so the processor is correct under batching with left padding, sampling,
beam search (rows reorder between calls) and transformers' assisted generation (called for candidate
positions that are later rejected, and by the assistant's own drafting loop).
"""

from __future__ import annotations

import warnings

import torch
from transformers import LogitsProcessor

import fsm
from assisted.eos import eos_ids
from assisted.inputs import check_guide_options


class GuideLogitsProcessor(LogitsProcessor):
    """Sets the scores of tokens the constraint does not allow to -inf, row by row.

    The prompt is what the first call of a `generate` call sees: all rows share its length (left padding).
    A call whose prompt rows differ from those seen first starts afresh; before reusing the processor for
    prompts that merely extend the earlier ones, call `reset()` (or build a new processor).
    Rows past EOS, and rows holding a token the constraint forbids (a beam search's dead beams, padding
    after EOS), get only EOS. With a `budget` (close_within_budget), a row that has generated n tokens has
    budget - n left, and its mask allows only tokens after which a valid completion fits in them.
    """

    def __init__(self, term, tokenizer, eos_token_ids: tuple[int, ...], budget: int | None = None):
        self._term, self._tokenizer, self._eos, self._budget = term, tokenizer, eos_token_ids, budget
        self._root = None  # fsm.Guide for the scores' width (counting the budget), built at the first call
        self._eos_only = None  # (V,) bool: what a finished or dead row may take
        self._blocked: dict[int, tuple] = {}  # id(mask) -> (mask, (V,) True where a token is not allowed)
        self.reset()

    def reset(self) -> None:
        """Forget the prompt; the next call starts a new generation."""
        self._prompts: torch.Tensor | None = None  # (B, P) prompt rows of the current generation
        self._guides: dict[tuple[int, ...], fsm.Guide | None] = {}  # generated ids -> guide after them (None: dead)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self._begin(input_ids, scores.shape[-1])
        rows = input_ids[:, self._prompts.shape[1] :].tolist()  # (B, generated) ids after the prompt
        blocked = torch.stack([self._blocked_of(self._mask(self._guide(tuple(row))), scores.device)
                               for row in rows])  # (B, V)
        return scores.masked_fill(blocked, float("-inf"))

    def _begin(self, input_ids: torch.Tensor, width: int) -> None:
        """Build the guide on the first call; take the prompt rows at the first call of each generation."""
        if self._root is None:
            guide = fsm.Guide.from_rx(self._term, self._tokenizer, vocab_size=width, eos_token_ids=self._eos)
            self._root = guide.within(self._budget)
            if not self._root.fits():
                raise ValueError(f"close_within_budget: no valid output is known to fit in max_new_tokens="
                                 f"{self._budget} (the shortest one found takes {guide.shortest_completion()} tokens)")
            self._eos_only = torch.zeros(width, dtype=torch.bool)
            self._eos_only[list(guide.eos_token_ids)] = True
            self.reset()
        if width != self._root.vocab_size:
            raise ValueError(f"scores have {width} columns but the processor was built for {self._root.vocab_size}")
        prompts = self._prompts
        same = (
            prompts is not None
            and input_ids.shape[0] == prompts.shape[0]
            and input_ids.shape[1] >= prompts.shape[1]
            and torch.equal(input_ids[:, : prompts.shape[1]], prompts)
        )
        if not same:
            self.reset()
            self._prompts = input_ids.clone()

    def _guide(self, generated: tuple[int, ...]) -> fsm.Guide | None:
        """The guide after `generated` (None: a token the constraint forbids, or past the budget): one dict lookup, or
        a walk from the longest known prefix."""
        if not generated:
            return self._root
        if generated in self._guides:
            return self._guides[generated]
        known = len(generated) - 1
        while known and generated[:known] not in self._guides:
            known -= 1
        guide = self._guides[generated[:known]] if known else self._root
        for end in range(known + 1, len(generated) + 1):
            guide = self._next(guide, generated[end - 1])
            self._guides[generated[:end]] = guide
        return guide

    @staticmethod
    def _next(guide: fsm.Guide | None, token: int) -> fsm.Guide | None:
        if guide is None:
            return None
        guide = guide.copy()
        try:
            guide.advance(token)
        except fsm.InvalidTokenError:
            return None
        return guide

    def _mask(self, guide: fsm.Guide | None) -> torch.Tensor:
        """(V,) bool allowed after a row's tokens (dead rows: EOS only; past the budget, as with one token left);
        shared, do not modify."""
        if guide is None:
            return self._eos_only
        return guide.within(1).mask() if guide.left is not None and guide.left < 1 else guide.mask()

    def _blocked_of(self, mask: torch.Tensor, device: torch.device) -> torch.Tensor:
        found = self._blocked.get(id(mask))
        if found is None or found[1].device != device:
            found = self._blocked[id(mask)] = (mask, (~mask).to(device))  # the mask kept: its id stays its own
        return found[1]


def logits_processor(tokenizer, *, schema=None, regex=None, eos_token_ids=None, guide_options: dict | None = None,
                     close_within_budget: bool = False, max_new_tokens: int | None = None,
                     **deprecated_options) -> GuideLogitsProcessor:
    """A logits processor that constrains `model.generate(...)` to a JSON Schema or a regex.

        from assisted import logits_processor
        proc = logits_processor(tok, schema=Character)
        out = model.generate(**tok(prompts, return_tensors="pt", padding=True), logits_processor=[proc])

    Parameters
    ----------
    tokenizer : transformers tokenizer
        The model's tokenizer.
    schema : pydantic class | dict | str, optional
        JSON Schema the output must satisfy (compact JSON unless `whitespace` says otherwise).
    regex : str, optional
        Regex the output must fully match. Exactly one of `schema` and `regex`.
    eos_token_ids : sequence of int, optional
        Ids that end the output (allowed where the text is complete); default: the tokenizer's EOS. Pass the
        model's ``generation_config.eos_token_id`` if it differs.
    guide_options : dict, optional
        How the schema is read, as in `generate`: ``policy``, ``whitespace``, ``additional_properties``,
        ``property_order``, ``max_recursion_depth``, ``budget`` (only ``budget`` for a regex). Passing them as keyword
        arguments is deprecated.
    close_within_budget : bool
        Allow a token only if, after it, a valid completion still fits in what is left of `max_new_tokens`
        (pass the same `max_new_tokens` to ``model.generate``): every output ends complete within the budget.
    max_new_tokens : int, optional
        The budget `close_within_budget` counts from (required with it).

    Returns
    -------
    GuideLogitsProcessor
        Works with greedy search, sampling, beam search, batches (left padding) and ``assistant_model=``.
        Its state after a generation describes that generation: call ``reset()`` or build a new one before
        reusing it for prompts that extend the earlier ones.

    Raises
    ------
    fsm.SchemaError, fsm.RegexError, ValueError, TypeError
        For a bad constraint or argument, before any model call.
    """
    if (schema is None) == (regex is None):
        raise ValueError("pass exactly one of schema and regex")
    if deprecated_options:
        warnings.warn(
            "logits_processor(): schema options as keyword arguments are deprecated, pass guide_options={...}",
            DeprecationWarning,
            stacklevel=2,
        )
    options = check_guide_options({**(guide_options or {}), **deprecated_options}, for_schema=schema is not None)
    if regex is not None:
        if not isinstance(regex, str):
            raise TypeError(f"regex must be a str, got {type(regex).__name__}")
        term = fsm.compile_regex(regex).root
    else:
        term = fsm.compile_schema(schema, **options)
    eos = eos_ids(None, tokenizer, eos_token_ids, name="eos_token_ids")
    if not eos:
        raise ValueError("the tokenizer has no EOS token: pass eos_token_ids")
    return GuideLogitsProcessor(term, tokenizer, tuple(sorted(eos)), _budget_of(close_within_budget, max_new_tokens))


def _budget_of(close_within_budget, max_new_tokens) -> int | None:
    """The processor's budget: `max_new_tokens` with `close_within_budget`, else None."""
    if not isinstance(close_within_budget, bool):
        raise TypeError(f"close_within_budget must be a bool, got {close_within_budget!r}")
    if not close_within_budget:
        return None
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"close_within_budget=True needs max_new_tokens, an int >= 1 (as passed to model.generate), "
                         f"got {max_new_tokens!r}")
    return max_new_tokens

"""One setup for every entry point: what `generate` (one row) and `generate_batch` (B rows; the `structspec` command's
`batch` through it) check and build once, before any model call, and the engine they then decode on.

`prepare_call` checks the pair (`assisted.foreign.is_foreign`, `check_models`), the options (`assisted.config`) and
`tree`, and builds what every row shares: its compiled guides (`Guides`, one per distinct constraint), stop strings
and criteria (`Stops`), an assistant of another tokenizer (`foreign_setup`). `Call.engine` puts the engine on the
caches an entry point chose: one row's own (`OneRow`, possibly static and captured) or B rows' (`BatchKV`); the
assistant's, of either vocabulary, the same way. Rows are
set up by `Call.prepare` as the engine admits them; `auto` rows are priced together by one `SharedPrices`, which
carries the costs earlier runs learned on the pair and engine, so a row's policy starts from no costs of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from assisted.config import Settings, options, resolve
from assisted.eos import eos_ids
from assisted.foreign import Foreign, foreign_setup, is_foreign
from assisted.inputs import Options, check_models
from assisted.policy.auto import AutoConfig
from assisted.policy.costs import recall, recall_calibration
from assisted.policy.draft_policy import make_policy
from assisted.policy.prices import SharedPrices
from assisted.prefix import PrefixCache
from assisted.rows.engine import Engine, verify
from assisted.rows.row import Setup
from assisted.rows.row_inputs import Guides, Item, RowInput, prepare_row, token_bytes
from assisted.stopping import Stops
from drafting.kv_cache import input_device
from drafting.row_kv import RowsKV
from drafting.tree import check_tree_attention


@dataclass(frozen=True)
class Call:
    """What the rows of one call share, checked: the models, the options and what is built from them once."""

    model: Any
    assistant_model: Any
    same: Any  # the assistant where it drafts the target's tokens (the engine's, for every row at once), else None
    tokenizer: Any
    vocab_size: int  # the target's logits size
    settings: Settings  # the options by transformers' names, merged and checked
    opts: Options  # ... as the loop reads them, without a row's prompt (its budget) and seed
    logits_processor: Any
    guides: Guides
    stops: Stops
    foreign: Foreign | None  # an assistant with another tokenizer: each row drafts with its own

    @property
    def helper(self) -> Any:
        """The model the engine's assistant runs (`same`, or the assistant of another tokenizer), or None."""
        return self.same if self.foreign is None else self.foreign.model

    def prepare(self, item: Item) -> RowInput:
        """A row's inputs (`assisted.rows.row_inputs.prepare_row`); ValueError/TypeError: the row's own error."""
        return prepare_row(item, self.model, self.same, self.tokenizer, self.vocab_size, self.settings,
                           self.logits_processor, self.guides, self.foreign)

    def engine(self, target: RowsKV, helper: RowsKV | None, *, batch_size: int, memory: str,
               caches: tuple[str, str | None, float] | None = None, prefix_cache: PrefixCache | None = None,
               share_prefix: bool = False, verify: Callable = verify, batch: bool = True,
               make_policy: Callable = make_policy) -> Engine:
        """The engine over the `target` caches and the assistant's (`helper`, for `Call.helper`).

        `memory`: the engine name learned costs are kept under (`assisted.policy.costs.memorize`); `caches`: the
        cache engine, its note and capture seconds each row's stats report (default: dynamic); `verify` and `batch`
        as for `Engine`; `make_policy` builds a row's policy (`assisted.policy.draft_policy.make_policy`; a seam where
        tests script the policy).
        """
        prices = SharedPrices(AutoConfig(), recall(self.model, self.assistant_model, memory), prefilled=target.prefills,
                              assistant_prefilled=target.prefills if helper is None else helper.prefills)

        def policy_for(opts: Options):
            calibration = recall_calibration(self.model, self.assistant_model, opts.warp)
            return make_policy(opts.schedule, opts.num_assistant_tokens, None, calibration, prices)

        setup = Setup(self.model, self.assistant_model, self.tokenizer, self.vocab_size, self.opts.warp, self.stops,
                      self.settings.tree, caches or ("dynamic", None, 0.0), memory, self.foreign is not None)
        return Engine(setup, target, helper, batch_size, policy_for, prices, prefix_cache, share_prefix, verify=verify,
                      batch=batch, prepare=self.prepare)


def prepare_call(model, assistant_model, *, tokenizer, assistant_tokenizer=None, generation_config=None,
                 kwargs: dict, logits_processor=None, stopping_criteria=None, guide_options: dict | None = None,
                 prefix_cache: PrefixCache | None = None) -> Call:
    """Every check of a call that does not depend on a row, and what its rows share; runs no model.

    Parameters
    ----------
    model, assistant_model, tokenizer, assistant_tokenizer, generation_config, logits_processor, stopping_criteria,
    guide_options, prefix_cache
        As for `assisted.generate`.
    kwargs : dict
        The generation options by transformers' names (`assisted.config.resolve`).

    Raises
    ------
    ValueError, TypeError
        For a bad argument, naming it.
    """
    settings = resolve(model, generation_config, kwargs)
    foreign = is_foreign(model, assistant_model, tokenizer, assistant_tokenizer)
    same = None if foreign else assistant_model
    check_tree(settings.tree, model, assistant_model, foreign)
    vocab_size = check_models(model, same, tokenizer)
    opts = options(settings, 0, logits_processor)  # every option checked once; a row's budget and seed at its setup
    check_tree_processors(settings.tree, opts)
    if prefix_cache is not None and not isinstance(prefix_cache, PrefixCache):
        raise TypeError(f"prefix_cache must be an assisted.PrefixCache, got {type(prefix_cache).__name__}")
    stops = Stops(settings.stop_strings, stopping_criteria, token_bytes(tokenizer, vocab_size), input_device(model))
    guides = Guides(tokenizer, vocab_size, eos_ids(model, tokenizer, settings.eos_token_id), guide_options)
    drafts = foreign_setup(assistant_model, assistant_tokenizer, tokenizer, vocab_size, guide_options) if foreign \
        else None
    return Call(model, assistant_model, same, tokenizer, vocab_size, settings, opts, logits_processor, guides, stops,
                drafts)


def check_tree_processors(tree: bool, opts: Options) -> None:
    if tree and opts.processors:
        raise ValueError("tree=True cannot apply logits processors (repetition_penalty, logits_processor=...): "
                         "a leaf's row has another prefix than its chain row")


def check_tree(tree, model, assistant_model, foreign: bool = False) -> None:
    """`tree` is a bool, and True only with an assistant of the target's vocabulary (not `foreign`) and a target whose
    attention takes a tree mask."""
    if not isinstance(tree, bool):
        raise TypeError(f"tree must be a bool, got {type(tree).__name__} {tree!r}")
    if tree and assistant_model is None:
        raise ValueError("tree=True needs an assistant_model: the branch is the assistant's runner-up")
    if tree and foreign:
        raise ValueError("tree=True needs an assistant with the target's vocabulary: the branch is the runner-up of "
                         "the assistant's distribution over the target's tokens")
    if tree:
        check_tree_attention(model)

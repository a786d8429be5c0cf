"""Guide: a cursor over a TokenIndex. Copying one is O(1), so drafting can run ahead of the commit."""

from __future__ import annotations

import torch

from fsm import rx
from fsm.budget import Budget, metered
from fsm.bounded_cache import BoundedCache
from fsm.errors import InvalidTokenError
from fsm.index import FINISHED, TokenIndex
from fsm.regex import DEAD, compile_regex, dfa_of
from fsm.schema import compile_schema
from fsm.vocabulary import vocabulary_from_tokenizer


class Guide:
    """Which tokens may come next under a regex or JSON Schema, and which are forced.

    Build one with `Guide.from_schema`, `Guide.from_regex` or `Guide.from_rx`; the index is cached
    per (term, tokenizer, vocab_size, eos ids, budget) in `INDEXES` (LRU, bounded by count and bytes),
    and terms are interned, so a second guide for the same constraint is free. Guides over one index
    may be used from several threads at once: first visits are built under a lock, revisits take none.
    Every first visit of a state runs under the budget (`fsm.GuideBudgetError` past it).

    A guide may also count the tokens left (`within`): its mask then allows only the tokens after which a valid
    completion still fits in them (`fsm.closing`), and each `advance` spends one.
    """

    __slots__ = ("index", "state", "left")

    def __init__(self, index: TokenIndex, state: int = 0, left: int | None = None):
        self.index = index
        self.state = state
        self.left = left  # tokens left, this position's included; None: no budget

    @classmethod
    def from_regex(cls, pattern: str, tokenizer, vocab_size: int | None = None, eos_token_ids=None,
                   budget: Budget | None = None) -> "Guide":
        """Guide for text that fully matches `pattern` (Python `re` syntax, a finite-automaton subset).

        Parameters
        ----------
        pattern : str
            The regex. Lookbehinds, backreferences, word boundaries and inner anchors raise
            `fsm.RegexError`.
        tokenizer : transformers tokenizer
        vocab_size : int, optional
            The model's logits width (may exceed ``len(tokenizer)``); the mask has this length.
        eos_token_ids : sequence of int, optional
            Ids that end the text; default: the tokenizer's EOS.
        budget : fsm.Budget, optional
            Limits for building the guide and for each first visit of a state (default ``fsm.Budget()``).
        """
        with metered(budget, f"compiling regex {pattern[:60]!r}"):
            dfa = compile_regex(pattern)  # held while the index is built: the index shares it, named
            return cls.from_rx(dfa.root, tokenizer, vocab_size, eos_token_ids, budget)

    @classmethod
    def from_rx(cls, term: rx.Rx, tokenizer, vocab_size: int | None = None, eos_token_ids=None,
                budget: Budget | None = None) -> "Guide":
        """Guide for text whose UTF-8 bytes are in `term` (an `fsm.rx` term).

        Parameters are those of `from_regex`; raises `fsm.RegexError` when `term` matches nothing.
        """
        eos = None if eos_token_ids is None else tuple(sorted(set(eos_token_ids)))
        budget = budget or Budget()
        with metered(budget, f"building the guide of {term!r}"):  # one vocabulary and index per key, even when racing
            vocabulary = vocabulary_from_tokenizer(tokenizer, vocab_size, eos)
            return cls(INDEXES.get_or_build((term, vocabulary, budget), lambda: _index(term, vocabulary, budget)))

    @classmethod
    def from_schema(cls, schema, tokenizer, vocab_size: int | None = None, eos_token_ids=None, **options) -> "Guide":
        """Guide for compact JSON valid under `schema` (a pydantic class, a dict or a JSON string).

        `options` go to `fsm.compile_schema`: whitespace, policy ("compact" or "spec"), additional_properties,
        property_order ("schema" or "any"), max_recursion_depth, budget (also used for the guide's first visits).
        """
        term = compile_schema(schema, **options)
        return cls.from_rx(term, tokenizer, vocab_size, eos_token_ids, options.get("budget"))

    @property
    def vocab_size(self) -> int:
        return self.index.vocab_size

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self.index.vocabulary.eos_token_ids

    def within(self, left: int | None) -> "Guide":
        """A copy that closes within `left` tokens (this position's included; None: no budget).

        Its mask allows a token only if, after it, a valid completion still fits in the tokens left (`fsm.closing`:
        forced text in its fewest tokens, other bytes one token each); `advance` spends one token and `forced()`
        stops where the next forced token would not fit. Use `fits()` to check that the budget leaves a way to finish.
        """
        if left is not None and (isinstance(left, bool) or not isinstance(left, int) or left < 0):
            raise ValueError(f"tokens left must be an int >= 0 or None, got {left!r}")
        return Guide(self.index, self.state, left)

    def mask(self) -> torch.Tensor:
        """(vocab_size,) bool, True where a token is allowed now. Shared and cached: do not modify."""
        if self.left is None:
            return self.index.info(self.state).mask
        return self.index.closing.mask(self.state, self.left)

    def allowed(self) -> list[int]:
        """The allowed token ids, sorted."""
        if self.left is None:
            return self.index.info(self.state).token_ids.tolist()
        return torch.nonzero(self.mask()).flatten().tolist()

    def advance(self, token_id: int) -> None:
        """Move past `token_id`; raises `fsm.InvalidTokenError` if it is not allowed here."""
        nxt = self.index.next_state(self.state, int(token_id))
        if nxt == DEAD:
            raise InvalidTokenError(f"token {token_id} is not allowed in state {self.state} of {self.index.dfa.name()}")
        if self.left is not None:
            if not self._fits_after(nxt):
                raise InvalidTokenError(f"token {token_id} leaves no valid completion within the {self.left - 1} "
                                        f"tokens left in state {self.state} of {self.index.dfa.name()}")
            self.left -= 1
        self.state = nxt

    def _fits_after(self, nxt: int) -> bool:
        return self.left >= 1 and self.index.closing.distance(nxt) <= self.left - 1

    def fits(self) -> bool:
        """Whether the text can still end complete: it is, or some token leaves room for a completion (always True
        without a budget)."""
        if self.left is None or self.is_final():
            return True
        return self.left >= 1 and self.index.closing.bounds(self.state)[0] <= self.left - 1

    def binds(self) -> bool:
        """Whether the budget removes a token the constraint allows here."""
        return self.left is not None and self.index.closing.binds(self.state, self.left)

    def shortest_completion(self) -> int:
        """Tokens that always suffice to complete the text from here (`fsm.closing`; a bound, not always the fewest;
        a large sentinel when no completion is found)."""
        return self.index.closing.distance(self.state)

    def forced(self) -> list[int]:
        """Tokens every valid continuation starts with, as the tokenizer would spell them."""
        if self.state == FINISHED:
            return []
        tokens = list(self.index.forced_tokens(self.state))
        if self.left is None:
            return tokens
        walk, fitting = self.copy(), []  # under a budget: up to the first token that would not fit
        for token in tokens:
            nxt = walk.index.next_state(walk.state, token)
            if not walk._fits_after(nxt):
                break
            walk.left, walk.state = walk.left - 1, nxt
            fitting.append(token)
        return fitting

    def is_final(self) -> bool:
        """True when the text so far is a complete match (EOS is allowed)."""
        return self.index.is_accepting(self.state)

    def is_finished(self) -> bool:
        """True once EOS was consumed."""
        return self.state == FINISHED

    def only_eos_allowed(self) -> bool:
        """Final and nothing but EOS may follow: generation can stop here."""
        if self.left is None:
            return self.is_final() and self.index.info(self.state).max_token_length == 0
        others = self.mask().clone()
        others[list(self.eos_token_ids)] = False
        return self.is_final() and not bool(others.any())

    def copy(self) -> "Guide":
        return Guide(self.index, self.state, self.left)


def _index(term: rx.Rx, vocabulary, budget: Budget) -> TokenIndex:
    with metered(budget, f"building the DFA of {term!r}"):
        dfa = dfa_of(term)
        dfa.max_states = budget.max_states
        return TokenIndex(dfa, vocabulary, budget)


INDEXES = BoundedCache(max_entries=64, max_bytes=1 << 30, size_of=lambda index: index.nbytes)  # shared by the process

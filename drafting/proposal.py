"""One draft being proposed: the guide's forced run first, then the assistant or prompt lookup, repeating.

Forced tokens cost no model call and count against no budget. The assistant drafts up to k tokens; prompt lookup
(free, but verified like the assistant's) up to `lookup_k` more, where the assistant is not drafting: after its k
tokens, or all of the draft at k = 0. Lookup goes second because its copies run on past the end of a copied value,
and a failed copy would displace an assistant draft that is usually right. The policy's `cut` may end the model
drafting sooner; a forced run right after the last kept draft is still appended, so that a forced position always
gets the canonical tokens whatever the cut (as without one, and as plain decoding with coalescence does). Drafting
also stops at EOS, at a final state that allows only EOS, or at `limit` tokens in all; with coalescing, a forced
token may also take the slot after them (the budget's last, where the target's token would go), so that the budget
never lets the target respell forced text.

`Proposal` is this rule as a state machine, so that one implementation serves one row and many: `fill()` appends
free tokens until the draft needs an assistant token (True) or is done (False), `give()` hands it the assistant's
token. The engine asks one assistant forward for every row that wants a token (`drafting.assistant.Assistant`),
with an assistant of another tokenizer too (`drafting.foreign_drafter.ForeignAsker`); without one, `fill()` alone
completes it.
"""

from __future__ import annotations

import math

import torch

from drafting.base import Cursor, DeviceMasks, Draft, Drafted
from drafting.forced import ForcedTokens
from drafting.lookup import PromptLookup


class Proposal:
    """A draft in progress after the committed `seq`, from the guide state `cursor` (advanced here).

    Parameters
    ----------
    seq : list of int
        The committed sequence (prompt and output so far); not copied, not changed.
    cursor : Cursor
        A copy of the committed guide state.
    k, lookup_k, limit : int
        Assistant tokens at most (0 without an assistant), prompt-lookup tokens at most, tokens in all.
    lookup : PromptLookup, optional
        Copies from the prompt; None: no lookup.
    use_forced, coalesced, sampling : bool
        Draft the guide's forced tokens; they are committed unverified (one may take the budget's last slot);
        the target samples (q rows are kept, and a cut drops at most the last model draft).
    cut : callable, optional
        ``cut(confidences) -> int | None``, asked after every model-drafted token, EOS included: None to go on, else
        how many model drafts to keep. When sampling it may only drop the last: whether a position is verified must
        not depend on the token drawn there (or on anything drafted after it), or the accepted tokens would lean
        towards likely ones. Greedy drafts are deterministic: any cut is lossless.
    """

    def __init__(self, seq: list[int], cursor: Cursor, *, k: int, lookup_k: int, limit: int,
                 lookup: PromptLookup | None = None, use_forced: bool = True, coalesced: bool = False,
                 sampling: bool = False, cut=None):
        self.seq, self.cursor, self.limit, self.lookup, self.cut = seq, cursor, limit, lookup, cut
        self.use_forced, self.coalesced, self.sampling = use_forced, coalesced, sampling
        self.asks, self.copies = k, lookup_k  # assistant and lookup tokens it may still add
        self.tokens, self.sources, self.drawn = [], [], []  # (k,) each; drawn: the assistant's Drafted, else None
        self.masks = [cursor.mask()]  # (k+1,) guide masks (V,): before each token, after the last
        self.run, self.copied = ForcedTokens(), []  # the forced run and the lookup copy under way
        self.ends = self.done = cursor.only_eos_left()  # ends: nothing may follow (EOS, only EOS left)
        self.filled = False  # `fill` has run

    @property
    def context(self) -> list[int]:
        """The committed sequence and the draft so far."""
        return self.seq + self.tokens

    @property
    def mask(self) -> torch.Tensor | None:
        """(V,) the guide's mask after the draft so far (None without a constraint)."""
        return self.masks[-1]

    @property
    def model_confidence(self) -> tuple[float, ...]:
        """The assistant's confidence in each model draft so far (NaN for prompt-lookup copies)."""
        return tuple(self._confidence(i) for i, s in enumerate(self.sources) if s != "forced")

    @property
    def model_drafts(self) -> int:
        """Model drafts (assistant and prompt-lookup) so far."""
        return sum(s != "forced" for s in self.sources)

    @property
    def may_draft(self) -> bool:
        """Whether the draft may still grow by a model draft this step."""
        return not self.done and (self.asks > 0 or (self.lookup is not None and self.copies > 0))

    @property
    def copies_to_come(self) -> bool:
        """Whether the draft is not filled yet and will be by prompt-lookup copies alone (no assistant tokens): all of
        them at once, after the rows filled before it."""
        return not self.filled and self.asks == 0 and self.lookup is not None and self.may_draft

    def tail(self, start: int) -> list[int]:
        """`context[start:]` without copying the committed sequence before `start`."""
        if start >= len(self.seq):
            return self.tokens[start - len(self.seq):]
        return self.seq[start:] + self.tokens

    def fill(self) -> bool:
        """Append forced and copied tokens; True when the next token must come from the assistant."""
        self.filled = True
        while not self.done and len(self.tokens) <= self.limit:
            last = len(self.tokens) == self.limit  # the target's slot: only a coalesced forced token may take it
            if last and not self.coalesced:
                break
            token = self.run.next(self.cursor) if self.use_forced else None
            if token is not None:
                self._push(token, "forced")
                continue
            if last:
                break
            if self.asks > 0:
                return True
            token = self._copy()
            if token is None:
                break
            self._push(token, "lookup")
        return False

    def give(self, drafted: Drafted | None) -> None:
        """The assistant's token, with what it was drawn from (`q` None: a point mass); None: it has no token here, and
        is asked no more in this draft."""
        if drafted is None:
            self.asks = 0
            return
        self.asks -= 1
        self._push(drafted.token, "assistant", drafted)

    def _push(self, token: int, source: str, drawn: Drafted | None = None) -> None:
        self.tokens.append(token)
        self.sources.append(source)
        self.drawn.append(drawn)
        eos = token in self.cursor.eos  # nothing follows EOS; the bonus row is never used
        if not eos:
            self.cursor.advance(token)
        self.masks.append(self.masks[-1] if eos else self.cursor.mask())
        self.ends = self.done = eos or self.cursor.only_eos_left()
        if source != "forced" and self.cut is not None:
            self._ask_cut()

    def _ask_cut(self) -> None:
        """Ask `cut` how many model drafts to keep: drop the rest and stop, or keep all and add no more."""
        models = [i for i, s in enumerate(self.sources) if s != "forced"]  # positions of the model drafts
        keep = self.cut(tuple(self._confidence(i) for i in models))
        if keep is None:
            return
        keep = max(keep, len(models) - 1) if self.sampling else keep  # sampling drops at most the last
        if keep < len(models):
            n = models[keep]
            del self.tokens[n:], self.sources[n:], self.drawn[n:], self.masks[n + 1:]
            self.ends, self.done = False, True
        else:
            self.asks = self.copies = 0  # only the forced run that follows is still appended

    def _copy(self) -> int | None:
        """The next prompt-lookup token if the guide allows it (the rest of the copied run is kept)."""
        if self.lookup is None or self.copies <= 0:
            return None
        self.copied = self.copied or self.lookup.continuation(self.context, self.copies)
        if not self.copied or (self.mask is not None and not bool(self.mask[self.copied[0]])):
            self.copied = []
            return None
        token, self.copied = self.copied[0], self.copied[1:]
        self.copies -= 1
        return token

    def _confidence(self, i: int) -> float:
        """The assistant's confidence in token i; NaN for a forced or copied token."""
        return math.nan if self.drawn[i] is None else self.drawn[i].confidence

    def draft(self, target_masks: DeviceMasks, vocab_size: int, device) -> Draft:
        """The proposal as a `Draft`: masks (k+1, V) on the target's device, q (k, V) on `device` when sampling."""
        masks = None if self.masks[0] is None else torch.stack([target_masks(m) for m in self.masks])  # (k+1, V)
        logits = tuple(None if d is None else d.logits for d in self.drawn)
        confidence = tuple(self._confidence(i) for i in range(len(self.tokens)))
        return Draft(tuple(self.tokens), tuple(self.sources), masks, self._q(vocab_size, device), confidence,
                     self.ends, logits)

    def _q(self, vocab_size: int, device) -> torch.Tensor | None:
        """(k, V) draft probabilities: assistant rows, one-hot rows for point masses (forced, lookup, foreign)."""
        if not self.sampling:
            return None
        q = torch.zeros(len(self.tokens), vocab_size, device=device)  # (k, V)
        points = [i for i, d in enumerate(self.drawn) if d is None or d.q is None]
        q[points, [self.tokens[i] for i in points]] = 1.0
        drawn = [i for i, d in enumerate(self.drawn) if d is not None and d.q is not None]
        if drawn:
            q[drawn] = torch.cat([self.drawn[i].q for i in drawn])
        return q

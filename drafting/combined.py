"""The draft source: the guide's forced run first, then the assistant or prompt lookup, repeating.

Forced tokens cost no model call and count against no budget. The assistant drafts up to k tokens;
prompt lookup (free, but verified like the assistant's) up to `lookup_k` more, where the assistant is
not drafting: after its k tokens, or all of the draft at k = 0. Lookup goes second because its copies
run on past the end of a copied value, and a failed copy would displace an assistant draft that is
usually right. The policy's `cut` may end the model drafting sooner; a forced run right after the
last kept draft is still appended, so that a forced position always gets the canonical tokens whatever
the cut (as without one, and as plain decoding with coalescence does). Drafting also stops at EOS, at a
final state that allows only EOS, or at `limit` tokens in all; with coalescing, a forced token may also take the
slot after them (the budget's last, where the target's token would go), so that the budget never lets the target
respell forced text. Without an assistant this yields forced
runs only; without forced tokens either, empty drafts (plain decoding: one target forward per token).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from drafting.assistant import AssistantDrafter, Drafted
from drafting.base import Cursor, DeviceMasks, Draft
from drafting.forced import ForcedTokens
from drafting.lookup import PromptLookup
from drafting.tree import BRANCH_BELOW, Branch, grow_branch


NAN = math.nan


@dataclass(frozen=True)
class Proposed:
    """One token of a draft being proposed, with what the draft keeps of it."""

    token: int
    source: str  # "forced" | "lookup" | "assistant"
    mask_after: torch.Tensor | None  # (V,) the guide's mask after the token (after EOS: the one before it)
    drafted: Drafted | None = None  # the assistant's draw (q row, confidence, logits) for its tokens

    @property
    def confidence(self) -> float:
        return NAN if self.drafted is None else self.drafted.confidence


class Turns:
    """What model drafting may still add to one proposal: assistant and lookup tokens, and the copy under way."""

    __slots__ = ("assistant", "lookup", "copied")

    def __init__(self, assistant: int, lookup: int):
        self.assistant, self.lookup, self.copied = assistant, lookup, []

    def close(self) -> None:
        """A cut kept every model draft: only the forced run that follows is still appended."""
        self.assistant = self.lookup = 0


class CombinedSource:
    """Forced tokens (when `use_forced`), then prompt lookup and an assistant, each optional."""

    def __init__(self, assistant: AssistantDrafter | None, use_forced: bool, vocab_size: int, sampling: bool,
                 lookup: PromptLookup | None = None, mask_device: torch.device | str = "cpu", coalesced: bool = False):
        self.assistant, self.use_forced, self.lookup = assistant, use_forced, lookup
        self.coalesced = coalesced  # forced tokens are appended unverified: one may also take the budget's last slot
        self.vocab_size, self.sampling = vocab_size, sampling
        self.device = assistant.device if assistant is not None else torch.device("cpu")
        self.target_masks = DeviceMasks(mask_device)  # each guide mask is copied to the target's device once

    def propose(self, seq: list[int], cursor: Cursor, k: int, limit: int, cut=None, lookup_k: int | None = None
                ) -> Draft:
        """Draft after `seq` from the committed guide state `cursor` (which this advances); see DraftSource.

        The assistant drafts up to `k` tokens, then prompt lookup up to `lookup_k` (default: k). When sampling,
        `cut` may only drop the last token, and is asked after every model-drafted token, EOS included:
        whether a position is verified must not depend on the token drawn there (or on anything drafted
        after it), or the accepted tokens would lean towards likely ones.
        Greedy drafts are deterministic: any cut is lossless.
        """
        turns = Turns(k if self.assistant is not None else 0, k if lookup_k is None else lookup_k)
        start, out, run = cursor.mask(), [], ForcedTokens()
        ends = cursor.only_eos_left()
        room = limit + 1 if self.coalesced else limit  # coalescing: a forced token may take the target's slot
        while not ends and len(out) < room:
            mask = out[-1].mask_after if out else start
            token, source, drafted = (run.next(cursor) if self.use_forced else None), "forced", None
            if token is None and len(out) < limit:
                token, source, drafted = self._model_token(seq + [p.token for p in out], mask, turns)
            if token is None:
                break
            eos = token in cursor.eos  # nothing follows EOS; the bonus row is never used
            if not eos:
                cursor.advance(token)
            out.append(Proposed(token, source, mask if eos else cursor.mask(), drafted))
            ends = eos or cursor.only_eos_left()
            if cut is not None and source != "forced" and (keep := self._kept(cut, out)) is not None:
                models = [i for i, p in enumerate(out) if p.source != "forced"]  # positions of the model drafts
                if keep < len(models):
                    return self._draft(start, out[: models[keep]], False)
                turns.close()
        return self._draft(start, out, ends)

    def branch(self, draft: Draft, cursor: Cursor, threshold: float = BRANCH_BELOW) -> Branch | None:
        """The runner-up leaf of this source's last `draft` where the assistant was unsure, from the committed
        guide state `cursor` (`drafting.tree.grow_branch`; its mask on the target's device)."""
        return grow_branch(draft, cursor, self.coalesced, self.assistant.generator, self.target_masks, threshold)

    def _model_token(self, context: list[int], mask, turns: Turns) -> tuple[int | None, str, Drafted | None]:
        """The assistant's next token while it has turns left, else prompt lookup's; (None, ...) when neither."""
        if turns.assistant > 0:
            turns.assistant -= 1
            drafted = self.assistant.draft(context, mask)
            return drafted.token, "assistant", drafted
        if turns.lookup > 0:
            token, turns.copied = self._copy(context, mask, turns.copied, turns.lookup)
            turns.lookup -= token is not None
            return token, "lookup", None
        return None, "lookup", None

    def _kept(self, cut, out: list[Proposed]) -> int | None:
        """How many of the model drafts in `out` `cut` keeps (None: go on); sampling drops at most the last."""
        confidences = tuple(p.confidence for p in out if p.source != "forced")
        keep = cut(confidences)
        return max(keep, len(confidences) - 1) if keep is not None and self.sampling else keep

    def _copy(self, context: list[int], mask, copied: list[int], room: int) -> tuple[int | None, list[int]]:
        """The next prompt-lookup token if the guide allows it, and the rest of the copied run."""
        if self.lookup is None:
            return None, []
        copied = copied or self.lookup.continuation(context, room)
        if not copied or (mask is not None and not bool(mask[copied[0]])):
            return None, []
        return copied[0], copied[1:]

    @property
    def seconds(self) -> float:
        """Wall time of the assistant's forward passes so far (0 without an assistant)."""
        return self.assistant.seconds if self.assistant is not None else 0.0

    @property
    def calls(self) -> int:
        """The assistant's forward passes so far, cut drafts included (0 without an assistant)."""
        return self.assistant.calls if self.assistant is not None else 0

    def rollback(self, valid: int) -> None:
        if self.assistant is not None:
            self.assistant.rollback(valid)

    def _draft(self, start: torch.Tensor | None, out: list[Proposed], ends: bool) -> Draft:
        """The proposal as a `Draft`: masks (k+1, V) on the target's device, q (k, V) when sampling."""
        rows = [start, *(p.mask_after for p in out)]
        masks = None if start is None else torch.stack([self.target_masks(m) for m in rows])  # (k+1, V)
        logits = tuple(None if p.drafted is None else p.drafted.logits for p in out)
        return Draft(tuple(p.token for p in out), tuple(p.source for p in out), masks, self._q(out),
                     tuple(p.confidence for p in out), ends, logits)

    def _q(self, out: list[Proposed]) -> torch.Tensor | None:
        """(k, V) draft probabilities: assistant rows, one-hot rows for point masses (forced, lookup)."""
        if not self.sampling:
            return None
        q = torch.zeros(len(out), self.vocab_size, device=self.device)  # (k, V)
        points = [i for i, p in enumerate(out) if p.drafted is None]
        q[points, [out[i].token for i in points]] = 1.0
        drawn = [i for i, p in enumerate(out) if p.drafted is not None]
        if drawn:
            q[drawn] = torch.cat([out[i].drafted.q for i in drawn])
        return q

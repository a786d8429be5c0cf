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

import torch

from drafting.assistant import AssistantDrafter
from drafting.base import Cursor, DeviceMasks, Draft
from drafting.forced import ForcedTokens
from drafting.lookup import PromptLookup


NAN = math.nan


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
        lookup_k = k if lookup_k is None else lookup_k
        tokens, sources, confidence, rows, masks = [], [], [], [], [cursor.mask()]
        self.logits = []  # the assistant's masked logits (1, V) per assistant token, for a draft tree
        run, copied, finished = ForcedTokens(), [], cursor.only_eos_left()
        closed = False  # a cut kept every model draft: only the forced run that follows is still appended
        drafted: list[float] = []  # confidences of the model-drafted tokens so far (what `cut` sees)
        while len(tokens) <= limit and not finished:
            last = len(tokens) == limit  # the slot of the target's token: a coalesced forced token keeps it canonical
            if last and not self.coalesced:
                break
            token, source, c = (run.next(cursor) if self.use_forced else None), "forced", NAN
            if last and token is None:
                break
            assisting = not closed and self.assistant is not None and sources.count("assistant") < k
            if token is None and not assisting and not closed and (looked := sources.count("lookup")) < lookup_k:
                (token, copied), source = self._copy(seq + tokens, masks[-1], copied, lookup_k - looked), "lookup"
            if token is None and assisting:
                token, q, c = self.assistant.next(seq + tokens, masks[-1])
                rows.append(q)
                self.logits.append(self.assistant.last_logits)
                source = "assistant"
            if token is None:
                break
            if source != "forced":
                drafted.append(c)
            tokens.append(token)
            sources.append(source)
            confidence.append(c)
            ends = token in cursor.eos  # nothing follows EOS; the bonus row is never used
            if not ends:
                cursor.advance(token)
            masks.append(masks[-1] if ends else cursor.mask())
            finished = ends or cursor.only_eos_left()
            keep = None if cut is None or source == "forced" else cut(tuple(drafted))
            if keep is not None:
                keep = max(keep, len(drafted) - 1) if self.sampling else keep  # see above
                if keep == len(drafted):  # the forced run after the last draft is canonical, as without a cut
                    closed = True
                    continue
                end = [i for i, s in enumerate(sources) if s != "forced"][keep]
                tokens, sources, confidence, masks = tokens[:end], sources[:end], confidence[:end], masks[: end + 1]
                rows, finished = rows[: sources.count("assistant")], False
                break
        return Draft(tuple(tokens), tuple(sources), self._stack(masks), self._q(tokens, sources, rows), tuple(confidence),
                     finished)

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

    def _stack(self, masks: list[torch.Tensor | None]) -> torch.Tensor | None:
        """(k+1, V) bool on the target's device, or None without a constraint."""
        return None if masks[0] is None else torch.stack([self.target_masks(m) for m in masks])

    def _q(self, tokens: list[int], sources: list[str], rows: list) -> torch.Tensor | None:
        """(k, V) draft probabilities: assistant rows, one-hot rows for point masses (forced, lookup)."""
        if not self.sampling:
            return None
        q = torch.zeros(len(tokens), self.vocab_size, device=self.device)  # (k, V)
        points = [i for i, s in enumerate(sources) if s != "assistant"]
        q[points, [tokens[i] for i in points]] = 1.0
        if rows:
            q[[i for i, s in enumerate(sources) if s == "assistant"]] = torch.cat(rows)
        return q

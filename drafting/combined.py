"""The draft source: the guide's forced run first, then the assistant, repeating.

Forced tokens cost no model call and do not count against k; the assistant adds model-drafted tokens
until there are k of them. Drafting stops early at EOS, at a final state that allows only EOS, or at
`limit` tokens in all. Without an assistant this yields forced runs only; without forced tokens
either, empty drafts (plain decoding: one target forward per token).
"""

from __future__ import annotations

import torch

from drafting.assistant import AssistantDrafter
from drafting.base import Cursor, Draft
from drafting.forced import ForcedTokens


class CombinedSource:
    """Forced tokens (when `use_forced`) interleaved with an optional assistant's tokens."""

    def __init__(self, assistant: AssistantDrafter | None, use_forced: bool, vocab_size: int, sampling: bool):
        self.assistant, self.use_forced = assistant, use_forced
        self.vocab_size, self.sampling = vocab_size, sampling
        self.device = assistant.device if assistant is not None else torch.device("cpu")

    def propose(self, seq: list[int], cursor: Cursor, k: int, limit: int) -> Draft:
        """Draft after `seq` from the committed guide state `cursor` (which this advances)."""
        tokens, forced, rows, masks = [], [], [], [cursor.mask()]
        run, drafted, finished = ForcedTokens(), 0, cursor.finished()
        while len(tokens) < limit and not finished:
            token = run.next(cursor) if self.use_forced else None
            is_forced = token is not None
            if not is_forced:
                if self.assistant is None or drafted == k:
                    break
                token, q = self.assistant.next(seq + tokens, masks[-1])
                rows.append(q)
                drafted += 1
            tokens.append(token)
            forced.append(is_forced)
            if token in cursor.eos:  # nothing follows EOS; the bonus row is never used
                masks.append(masks[-1])
                finished = True
                break
            cursor.advance(token)
            masks.append(cursor.mask())
            finished = cursor.finished()
        return Draft(tuple(tokens), tuple(forced), _stack(masks), self._q(tokens, forced, rows), finished)

    @property
    def seconds(self) -> float:
        """Wall time of the assistant's forward passes so far (0 without an assistant)."""
        return self.assistant.seconds if self.assistant is not None else 0.0

    def rollback(self, valid: int) -> None:
        if self.assistant is not None:
            self.assistant.rollback(valid)

    def _q(self, tokens: list[int], forced: list[bool], rows: list) -> torch.Tensor | None:
        """(k, V) draft probabilities: assistant rows, one-hot rows for forced tokens."""
        if not self.sampling:
            return None
        q = torch.zeros(len(tokens), self.vocab_size, device=self.device)  # (k, V)
        at_forced = [i for i, f in enumerate(forced) if f]
        q[at_forced, [tokens[i] for i in at_forced]] = 1.0
        if rows:
            q[[i for i, f in enumerate(forced) if not f]] = torch.cat(rows)
        return q


def _stack(masks: list[torch.Tensor | None]) -> torch.Tensor | None:
    """(k+1, V) bool, or None without a constraint."""
    return None if masks[0] is None else torch.stack(masks)

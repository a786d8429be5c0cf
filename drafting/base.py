"""What a draft is, who can propose one, and the guide as drafting and the loop see it.

A `Draft` holds k proposed tokens, the guide's mask before each of them and after the last (the rows
the target's logits are masked with), which tokens the guide forced, the assistant's confidence in each
of its tokens (the largest probability of its distribution there), when sampling the draft probabilities
q (one-hot rows for forced and lookup tokens, which are point masses), and the assistant's masked logits at
its tokens (where a draft tree chooses the runner-up, `drafting.tree.grow_branch`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Draft:
    """Proposed continuation of the committed sequence."""

    tokens: tuple[int, ...]  # (k,) proposed ids in order
    sources: tuple[str, ...]  # (k,) who proposed each: "forced" (the guide), "lookup" (the prompt), "assistant"
    masks: torch.Tensor | None  # (k+1, V) bool on the target's device, guide mask before each token / after the last
    q: torch.Tensor | None  # (k, V) draft probabilities when sampling, else None
    confidence: tuple[float, ...]  # (k,) max of the assistant's distribution at each of its tokens; NaN elsewhere
    ends_output: bool  # EOS drafted, or only EOS is left after the draft: no bonus token follows
    logits: tuple[torch.Tensor | None, ...] = ()  # (k,) the assistant's masked logits (1, V) at its tokens, else None

    @property
    def forced(self) -> tuple[bool, ...]:
        """(k,) True where the guide forced the token."""
        return tuple(s == "forced" for s in self.sources)

    @property
    def model_confidence(self) -> tuple[float, ...]:
        """The confidences of the model-drafted (assistant and prompt-lookup) tokens, in order."""
        return tuple(c for c, s in zip(self.confidence, self.sources) if s != "forced")

    @property
    def model_drafted(self) -> int:
        """Tokens the assistant model drafted (one forward each)."""
        return self.sources.count("assistant")


@dataclass(frozen=True)
class Drafted:
    """One assistant token and what it was drawn from."""

    token: int
    q: torch.Tensor | None  # (1, V) the masked, warped distribution when sampling, else None
    confidence: float  # max of the masked distribution at temperature 1 (see `pick`)
    logits: torch.Tensor  # (1, V) masked logits before the warpers: a draft tree's runner-up is chosen from them


class Clock:
    """Seconds spent in guide calls, shared by a cursor and all its copies."""

    __slots__ = ("seconds",)

    def __init__(self) -> None:
        self.seconds = 0.0


class Cursor:
    """A timed view of an `fsm.Guide` (or of no constraint at all) that also tells when only EOS is left.

    `mask()` is None when there is no constraint. EOS ids are never advanced through the guide:
    generation ends at EOS.
    """

    __slots__ = ("guide", "eos", "clock", "_done")

    def __init__(self, guide, eos: frozenset[int], clock: Clock | None = None, done=None):
        self.guide, self.eos = guide, eos
        self.clock = clock or Clock()
        self._done = {} if done is None else done  # id(mask) -> (mask, final-only?) across copies

    def copy(self) -> Cursor:
        guide = None if self.guide is None else self._timed(self.guide.copy)
        return Cursor(guide, self.eos, self.clock, self._done)

    def mask(self) -> torch.Tensor | None:
        return None if self.guide is None else self._timed(self.guide.mask)

    def forced(self) -> list[int]:
        return [] if self.guide is None else self._timed(self.guide.forced)

    def advance(self, token: int) -> None:
        if self.guide is not None:
            self._timed(self.guide.advance, token)

    def accepting(self) -> bool:
        """The text so far is a complete match of the constraint (False without one)."""
        return self.guide is not None and self._timed(self.guide.is_final)

    def only_eos_left(self) -> bool:
        """Final, and nothing but EOS is allowed: the output is complete."""
        if self.guide is None or not self._timed(self.guide.is_final):
            return False
        mask = self.mask()
        if id(mask) not in self._done:
            others = mask.clone()
            others[list(self.eos)] = False
            self._done[id(mask)] = (mask, not bool(others.any()))
        return self._done[id(mask)][1]

    def _timed(self, call, *args):
        start = time.perf_counter()
        try:
            return call(*args)
        finally:
            self.clock.seconds += time.perf_counter() - start


class DeviceMasks:
    """Guide masks copied to one device once each (the guide caches masks per state on CPU)."""

    __slots__ = ("device", "_copies")

    def __init__(self, device: torch.device):
        self.device, self._copies = torch.device(device), {}

    def __call__(self, mask: torch.Tensor | None) -> torch.Tensor | None:
        if mask is None or mask.device == self.device:
            return mask
        if id(mask) not in self._copies:
            self._copies[id(mask)] = (mask, mask.to(self.device))
        return self._copies[id(mask)][1]

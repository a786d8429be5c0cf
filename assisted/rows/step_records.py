"""The records one step of the engine (`assisted.rows.engine.Engine.step`) passes from stage to stage, one per row:

    Proposed  -> Feed  -> Verdict  -> Committed
    (drafted)    (fed)    (judged)    (kept)

Each stage takes the record of the one before and returns its own; nothing is added to a record later. `Rounds` is the
drafting stage's cost for the whole step (the assistant's forwards serve every row at once).
"""

from __future__ import annotations

from dataclasses import dataclass

from assisted.result import StopReason
from drafting.base import Draft
from drafting.tree import Branch


@dataclass(frozen=True)
class Proposed:
    """1. A row's draft (`Engine._draft`) and what drafting it cost the row."""

    k: int  # assistant tokens its policy allowed
    draft: Draft  # tokens (k',), masks (k'+1, V) on the target's device, q (k', V) when sampling
    forwards: int  # assistant forwards it took part in this step
    seconds: float  # its share of their seconds


@dataclass(frozen=True)
class Rounds:
    """1. The assistant forwards this step ran for every row (one per drafting round), and their seconds."""

    forwards: int
    seconds: float


@dataclass(frozen=True)
class Feed:
    """2. What the target forward runs for a row (`Engine._feed`): its draft, and a tree's leaf where it pays."""

    proposed: Proposed
    branch: Branch | None  # the runner-up where the assistant was unsure (tree=True)
    leaf: Branch | None  # ... if its row pays: verified with the chain, after it
    tokens: tuple[int, ...]  # uncached committed tokens, draft(, leaf.token); (): the target is not asked

    @property
    def draft(self) -> Draft:
        return self.proposed.draft


@dataclass(frozen=True)
class Verdict:
    """3. What the target judged of a row's feed (`assisted.rows.engine.verify`): the tokens to commit."""

    accepted: int  # drafts accepted (n)
    took: bool  # the side leaf was taken in place of chain token `leaf.at`
    tokens: tuple[int, ...]  # draft[:accepted], then the target's token or the taken leaf (and the token after it)

    @property
    def after(self) -> tuple[int, ...]:
        """What follows the accepted drafts: (token,), (leaf,), (leaf, token), or () where the target was not asked."""
        return self.tokens[self.accepted :]

    @classmethod
    def judged(cls, feed: Feed, accepted: int, took: int, token: int) -> Verdict:
        """The verdict from the acceptance test's [n, took, token] (`assisted.steps.accept`)."""
        leaf = feed.leaf
        after = (leaf.token, *((token,) if leaf.bonus else ())) if took else (token,)
        return cls(accepted, bool(took), feed.draft.tokens[:accepted] + after)

    @classmethod
    def unasked(cls, draft: Draft) -> Verdict:
        """A draft of coalesced forced tokens up to the end, committed without the target: every token."""
        return cls(len(draft.tokens), False, draft.tokens)


@dataclass(frozen=True)
class Committed:
    """4. What a row kept (`Engine._commit`): the caches' lengths to crop to, and why it stopped."""

    valid: int  # the tokens committed before the step plus the accepted drafts: what the assistant's cache keeps
    cached: int  # target tokens whose cache entries hold (a taken leaf's included), at most all but the last
    stop: StopReason | None  # None: the row goes on

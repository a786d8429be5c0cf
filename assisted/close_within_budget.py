"""`close_within_budget`: outputs that close before `max_new_tokens` runs out.

The option changes the constraint, not the method: the cursor's guide counts the tokens left (`fsm.Guide.within`),
so every mask the loop, the drafters and the batch engine take from it allows only tokens after which a valid
completion still fits (`fsm.closing`). Drafts, forced runs and prompt-lookup copies are verified against those
masks at their own positions, so greedy output equals plain constrained decoding with the same masks, and sampling
keeps that reference's distribution (DESIGN.md, "Budget-aware reference").
"""

from __future__ import annotations

from drafting.base import Cursor


def within_budget(cursor: Cursor, max_new_tokens: int, close: bool) -> Cursor:
    """`cursor` whose guide closes within `max_new_tokens` when `close` (a bool: `assisted.config.options` checked it);
    ValueError when nothing fits."""
    if not close:
        return cursor
    if cursor.guide is None:
        raise ValueError("close_within_budget=True needs a schema or a regex: without one every text is complete")
    guide = cursor.guide.within(max_new_tokens)
    if not guide.fits():
        raise ValueError(f"close_within_budget: no valid output is known to fit in max_new_tokens={max_new_tokens} "
                         f"(the shortest one found takes {guide.shortest_completion()} tokens); raise max_new_tokens")
    return Cursor(guide, cursor.eos, cursor.clock)


def outcome(start: Cursor, new: list[int], stop: str) -> tuple[int, str]:
    """(positions of `new` where the budget tightened the mask, stop reason): "closed" where it tightened one and the
    output ended complete ("eos", "final" or "length" on a complete text). Walks a copy of the starting guide."""
    guide = None if start.guide is None else start.guide.copy()
    if guide is None or guide.left is None:
        return 0, stop
    tightened = 0
    for token in new:
        tightened += guide.binds()
        if token in start.eos:
            break
        guide.advance(token)
    closed = tightened and guide.is_final() and stop in ("eos", "final", "length")
    return tightened, "closed" if closed else stop

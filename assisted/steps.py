"""The rules of one verification step, applied by the engine (`assisted.rows.engine`) to each row, one or many:
whether a draft needs the target at all, the acceptance test on the target's logits,
the commit of the accepted tokens, and which model drafts the draft-length policy is told about.

Each is the same for one row and for a row of a batch, so a batched row decodes as it would alone.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from assisted.acceptance import greedy_accept, speculative_accept
from assisted.inputs import Options
from assisted.result import StopReason
from assisted.stopping import Sink
from assisted.tree_accept import greedy_tree_accept, speculative_tree_accept
from drafting.base import Cursor, Draft
from drafting.sampling import masked, probs
from drafting.tree import Branch


def needs_forward(draft: Draft, committed: int, end: int, coalesce: bool) -> bool:
    """False when the draft is only coalesced forced tokens up to the end (EOS, a final state, or the budget at
    `end` after `committed` tokens): they are committed without asking the target."""
    return not (coalesce and all(draft.forced) and (draft.ends_output or committed + len(draft.tokens) >= end))


def accept(logits: torch.Tensor, seq: list[int], draft: Draft, leaf: Branch | None, opts: Options, generator
           ) -> torch.Tensor:
    """The acceptance test on the target's logits (k+1 (+1), V) after `seq` + `draft`, before its host sync.

    Row i is processed with the prefix `seq + draft[:i]` (the logits processors), masked with the guide state before
    draft token i, then judged by `assisted.acceptance` on a chain or `assisted.tree_accept` on a chain plus a leaf.
    Returns, on the logits' device, (3,) long [n, took, token]: took is 1 where the side leaf was taken (0 on a chain).
    """
    if opts.processors:  # never with a leaf (generate refuses tree=True with processors)
        logits = opts.processors(seq + list(draft.tokens), logits, len(seq))
    device = logits.device
    masks = position_masks(draft, leaf, device)
    tokens = torch.tensor(draft.tokens, dtype=torch.long, device=device)  # (k,)
    auto = torch.tensor([f and opts.coalesce for f in draft.forced], dtype=torch.bool, device=device)  # (k,)
    if opts.warp.do_sample:
        p, q = probs(logits, masks, opts.warp), draft.q.to(device)  # (k+1 (+1), V), (k, V)
        return no_leaf(speculative_accept(p, q, tokens, auto, generator)) if leaf is None else \
            speculative_tree_accept(p, q, tokens, auto, leaf.at, leaf.token, generator)
    scores = masked(logits, masks)  # (k+1 (+1), V)
    return no_leaf(greedy_accept(scores, tokens, auto)) if leaf is None else \
        greedy_tree_accept(scores, tokens, auto, leaf.at, leaf.token)


def position_masks(draft: Draft, leaf: Branch | None, device=None) -> torch.Tensor | None:
    """The guide's mask at each verified position, (k+1 (+1), V) bool: the draft's, then the leaf's (None: the draft has
    no masks, or the leaf no mask after it); on `device` where given."""
    if draft.masks is None or (leaf is not None and leaf.mask_after is None):
        return None
    masks = draft.masks.to(device) if device is not None else draft.masks  # (k+1, V)
    return masks if leaf is None else torch.cat([masks, leaf.mask_after.to(masks.device)[None]])  # (k+2, V)


def no_leaf(found: torch.Tensor) -> torch.Tensor:
    """(2,) [n, token] of a chain's acceptance as (3,) [n, took = 0, token], a tree's form."""
    return torch.cat([found[:1], torch.zeros_like(found[:1]), found[1:]])


def commit(seq: list[int], cursor: Cursor, tokens: Sequence[int], end: int, sink: Sink) -> StopReason | None:
    """Append `tokens`, advancing the guide; the first stop condition met ends the commit."""
    for token in tokens:
        seq.append(token)
        if token in cursor.eos:
            return "eos"
        cursor.advance(token)
        if cursor.only_eos_left():
            return "final"
        if sink.stops and (reason := sink.stops.after(seq)):
            return reason
        if len(seq) >= end:
            return "length"
    return None


def judge(forced: tuple[bool, ...], n: int) -> tuple[int, int]:
    """Model drafts the target judged (up to the first rejection) and how many it accepted.

    Model drafts after a rejected forced token were never judged: they say nothing about k.
    """
    judged = sum(not f for f in forced[: n + 1])
    return judged, judged - (n < len(forced) and not forced[n])

"""The target's head under the guide's masks: only the 16-column blocks that hold an allowed token are computed.

A head over a large vocabulary (Qwen2.5's 151,936 x 1,536, in Q6_K a fifth of the 1.5B's bytes) runs at every kept
position, yet under a schema most positions allow few tokens (digits, an enum's values, a literal): the other columns
are masked to -inf before anything reads them. Inside `only_allowed(model, masks)` the head of a 4-bit or Q6_K model
(`assisted.models.packed_linear.PackedLinear`, by its `only_blocks` attribute) computes the blocks of 16 columns that
hold a token some row's mask allows, and -inf elsewhere. Each computed column is bitwise the full head's (a kernel
computes a column from its own weights alone), so the masked logits, and everything decoded from them, are unchanged.
Where the allowed blocks are more than `FULL_SHARE` of the head, the whole head runs. The engine and the assistant ask
only where no logits processor reads the logits before the mask.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch

LANES = 16  # output columns per block of the 4-bit and Q6_K kernels' layouts
FULL_SHARE = 0.5  # where more of the head's blocks hold allowed tokens, all of it runs


def allowed_blocks(masks: Sequence[torch.Tensor], out_features: int) -> torch.Tensor | None:
    """(m,) int64: the 16-column blocks of a head of `out_features` holding a token allowed by some row of `masks`
    (each (n, V) bool); None where that is more than `FULL_SHARE` of the blocks."""
    union = torch.cat(list(masks)).any(0)[:out_features]  # (V,)
    blocks = -(-out_features // LANES)
    union = torch.nn.functional.pad(union, (0, blocks * LANES - union.numel()))  # (blocks * 16,)
    chosen = union.view(blocks, LANES).any(1).nonzero().flatten()  # (m,)
    return None if chosen.numel() > FULL_SHARE * blocks else chosen


@contextmanager
def only_allowed(model: torch.nn.Module, masks: Sequence[torch.Tensor] | None) -> Iterator[None]:
    """Forwards of `model` inside compute its head only at the blocks `masks` allow (`allowed_blocks`); a no-op where
    `masks` is None or empty, or the head has no `only_blocks` (not a 4-bit or Q6_K head)."""
    head = getattr(model, "lm_head", None)
    chosen = allowed_blocks(masks, head.out_features) if masks and hasattr(head, "only_blocks") else None
    if chosen is None:
        yield
        return
    head.only_blocks = chosen
    try:
        yield
    finally:
        head.only_blocks = None

"""What a linear op's `blocks` argument promises, checked the same way for every op that takes it."""

from __future__ import annotations

from typing import Callable

import torch


def assert_blocks_are_the_full_calls_columns(linear: Callable, out_features: int, n_blocks: int) -> None:
    """`linear(blocks)` (None: every column) computes only the 16-column `blocks`: block j's columns at 16 j.., each
    bitwise the full call's, and zero in the lanes past the last column."""
    full = linear(None)
    for blocks in ([n_blocks - 1], [0], [3, 1], [n_blocks - 1, 2, 0], list(range(n_blocks))):
        part = linear(torch.tensor(blocks))  # (n, 16 * len(blocks))
        for j, block in enumerate(blocks):
            columns = range(16 * block, min(16 * block + 16, out_features))
            assert torch.equal(part[:, 16 * j : 16 * j + len(columns)], full[:, columns.start : columns.stop])
            assert (part[:, 16 * j + len(columns) : 16 * j + 16] == 0).all()  # lanes past the last column

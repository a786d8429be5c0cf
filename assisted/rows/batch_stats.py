"""Statistics of one generate_batch() run, one object shared by every row's result (`GenerationResult.batch`)."""

from __future__ import annotations

import time


class BatchStats:
    """Counters of a batch run; live while rows are still being generated, final once the run has returned them all.

    Attributes
    ----------
    batch_size : int
        The most rows decoded at once (rows of cache held).
    rows, errors, refills : int
        Rows admitted into the batch; rows that failed before admission (their `GenerationResult.error`); rows
        admitted into the slot of a row that had finished.
    target_forwards, assistant_forwards, prefill_forwards : int
        Batched verification forwards of the target, batched drafting forwards of the assistant, and the
        per-row prefill forwards of newcomers (target and assistant counted separately).
    row_forwards : int
        Rows summed over the target's verification forwards (`rows_per_forward` is its mean).
    positions_computed, positions_used : int
        Positions the target's verification forwards computed (`drafting.row_kv.RowsKV.positions`: the feeds' own on
        the ragged path, rows x the longest feed on the padded one) and, of those, the rows' own feeds.
    seconds : float
        Wall time from the run's start to its last row's finish.
    """

    def __init__(self, batch_size: int):
        self.batch_size, self.rows, self.errors, self.refills = batch_size, 0, 0, 0
        self.target_forwards = self.assistant_forwards = self.prefill_forwards = self.row_forwards = 0
        self.positions_computed = self.positions_used = 0
        self.start, self.seconds = time.perf_counter(), 0.0

    def verified(self, feeds: list[list[int]], computed: int) -> None:
        """Book one target forward over these rows' feeds that computed `computed` positions."""
        self.target_forwards += 1
        self.row_forwards += len(feeds)
        self.positions_computed += computed
        self.positions_used += sum(map(len, feeds))

    def tick(self) -> None:
        self.seconds = time.perf_counter() - self.start

    @property
    def rows_per_forward(self) -> float:
        """Mean rows per target verification forward."""
        return self.row_forwards / self.target_forwards if self.target_forwards else 0.0

    @property
    def padding(self) -> int:
        """Positions the target's verification forwards computed beyond the rows' feeds (0 on the ragged path)."""
        return self.positions_computed - self.positions_used

    @property
    def padding_share(self) -> float:
        """Share of the target's verification positions that were padding."""
        return self.padding / self.positions_computed if self.positions_computed else 0.0

    def as_dict(self) -> dict:
        return {"batch_size": self.batch_size, "rows": self.rows, "errors": self.errors, "refills": self.refills,
                "target_forwards": self.target_forwards, "assistant_forwards": self.assistant_forwards,
                "prefill_forwards": self.prefill_forwards, "rows_per_forward": round(self.rows_per_forward, 3),
                "positions_computed": self.positions_computed, "positions_used": self.positions_used,
                "padding_share": round(self.padding_share, 3), "seconds": round(self.seconds, 4)}

    def __repr__(self) -> str:
        return f"BatchStats({self.as_dict()})"

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
    positions, padding : int
        Positions the target's verification forwards ran (rows x longest feed), and of those the padding.
    seconds : float
        Wall time from the run's start to its last row's finish.
    """

    def __init__(self, batch_size: int):
        self.batch_size, self.rows, self.errors, self.refills = batch_size, 0, 0, 0
        self.target_forwards = self.assistant_forwards = self.prefill_forwards = self.row_forwards = 0
        self.positions = self.padding = 0
        self.start, self.seconds = time.perf_counter(), 0.0

    def verified(self, feeds: list[list[int]]) -> None:
        """Book one target forward over these rows' feeds (padded to the longest)."""
        width = max(1, max(map(len, feeds)))
        self.target_forwards += 1
        self.row_forwards += len(feeds)
        self.positions += width * len(feeds)
        self.padding += sum(width - len(f) for f in feeds)

    def tick(self) -> None:
        self.seconds = time.perf_counter() - self.start

    @property
    def rows_per_forward(self) -> float:
        """Mean rows per target verification forward."""
        return self.row_forwards / self.target_forwards if self.target_forwards else 0.0

    @property
    def padding_share(self) -> float:
        """Share of the target's verification positions that were padding."""
        return self.padding / self.positions if self.positions else 0.0

    def as_dict(self) -> dict:
        return {"batch_size": self.batch_size, "rows": self.rows, "errors": self.errors, "refills": self.refills,
                "target_forwards": self.target_forwards, "assistant_forwards": self.assistant_forwards,
                "prefill_forwards": self.prefill_forwards, "rows_per_forward": round(self.rows_per_forward, 3),
                "padding_share": round(self.padding_share, 3), "seconds": round(self.seconds, 4)}

    def __repr__(self) -> str:
        return f"BatchStats({self.as_dict()})"

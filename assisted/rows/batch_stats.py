"""Statistics of one generate_batch() run, one object shared by every row's result (`GenerationResult.batch`)."""

from __future__ import annotations

import time
from contextlib import contextmanager

STAGES = ("admit", "draft", "feed", "verify", "commit", "learn", "finish")  # `Engine`'s stages, each timed


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
    assistant_positions : int
        Positions the assistant's drafting forwards computed, padding included: the drafted tokens' and each row's
        catch-up (its lazy cache is fed a row's context at the row's first draft, and what it lacks after each step).
    assistant_seconds : float
        Wall time of the assistant's drafting forwards (catch-up included), up to each round's host sync; part of the
        "draft" stage.
    stage_seconds : dict[str, float]
        Wall time of each of the engine's stages (`STAGES`): admitting rows (prefill, shared prefixes, both caches,
        rows let go), drafting (policies, proposals, guide masks, the assistant), feeds (a tree's leaf), the target's
        verification forward with the acceptance test (`target_seconds`), commit (and cropping both caches), the
        policies' learning, and each row's result. The rest of `seconds` is the loop's own (the last rows' results are
        made after its last tick).
    seconds : float
        Wall time from the run's start to its last row's finish.
    """

    def __init__(self, batch_size: int):
        self.batch_size, self.rows, self.errors, self.refills = batch_size, 0, 0, 0
        self.target_forwards = self.assistant_forwards = self.prefill_forwards = self.row_forwards = 0
        self.positions_computed = self.positions_used = self.assistant_positions = 0
        self.assistant_seconds, self.stage_seconds = 0.0, dict.fromkeys(STAGES, 0.0)
        self.start, self.seconds = time.perf_counter(), 0.0

    def verified(self, feeds: list[list[int]], computed: int) -> None:
        """Book one target forward over these rows' feeds that computed `computed` positions."""
        self.target_forwards += 1
        self.row_forwards += len(feeds)
        self.positions_computed += computed
        self.positions_used += sum(map(len, feeds))

    def drafted(self, forwards: int, positions: int, seconds: float) -> None:
        """Book a step's assistant forwards, the positions they computed and their seconds."""
        self.assistant_forwards += forwards
        self.assistant_positions += positions
        self.assistant_seconds += seconds

    @contextmanager
    def timed(self, stage: str):
        """Add the wall time of the block to `stage`."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.stage_seconds[stage] += time.perf_counter() - start

    def tick(self) -> None:
        self.seconds = time.perf_counter() - self.start

    @property
    def rows_per_forward(self) -> float:
        """Mean rows per target verification forward."""
        return self.row_forwards / self.target_forwards if self.target_forwards else 0.0

    @property
    def target_seconds(self) -> float:
        """Wall time of the target's verification forwards, each with its acceptance test and host sync."""
        return self.stage_seconds["verify"]

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
                "padding_share": round(self.padding_share, 3), "assistant_positions": self.assistant_positions,
                "assistant_seconds": round(self.assistant_seconds, 4),
                **{f"{stage}_seconds": round(s, 4) for stage, s in self.stage_seconds.items()},
                "seconds": round(self.seconds, 4)}

    def __repr__(self) -> str:
        return f"BatchStats({self.as_dict()})"

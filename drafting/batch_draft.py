"""Drafting for B rows at once: each row's `drafting.proposal.Proposal` (the single-row rule: forced runs and
prompt-lookup copies on the host, the cut-free fixed schedules), and the assistant's token for every row that wants
one from one forward per drafting step, picked by the single-row `drafting.assistant.pick`. The order of tokens,
sources and masks is that of the single-row source, so each row drafts what it would draft alone.
"""

from __future__ import annotations

import time

from drafting.assistant import pick, settle
from drafting.base import DeviceMasks
from drafting.batch_kv import BatchKV
from drafting.proposal import Proposal
from drafting.sampling import Warp


class BatchAssistant:
    """The assistant over a `BatchKV`: one forward drafts one token for every row that asks."""

    def __init__(self, model, warp: Warp):
        self.kv, self.warp = BatchKV(model), warp
        self.masks = DeviceMasks(self.kv.device)
        self.forwards, self.seconds = 0, 0.0

    def draft(self, proposals: list[Proposal], generators: list, processors: list) -> list[int]:
        """Complete every row's proposal; returns how many assistant forwards each row took part in.

        Row r's assistant cache holds a prefix of its context; each forward feeds every asking row what its cache
        lacks (the target's tokens since, and the last drafted token) and picks its next token with its own
        generator (`generators[r]`), after its logits processors and its guide's mask.
        """
        took = [0] * len(proposals)
        asking = [r for r, p in enumerate(proposals) if p.fill()]
        while asking:
            start = time.perf_counter()
            feeds = [proposals[r].tail(n) if r in asking else [] for r, n in enumerate(self.kv.lengths)]
            logits = self.kv.forward(feeds)  # (B, m, V)
            picks = [self._pick(logits[r, len(feeds[r]) - 1][None], proposals[r], generators[r], processors[r])
                     for r in asking]  # (1, V) rows: after each whole context
            for r, drafted in zip(asking, settle(picks)):  # the drafting step's one host sync
                proposals[r].give(drafted)
                took[r] += 1
            self.forwards += 1
            self.seconds += time.perf_counter() - start
            asking = [r for r in asking if proposals[r].fill()]
        return took

    def _pick(self, logits, proposal: Proposal, generator, processors):
        context = proposal.context if processors else None  # built only for processors: no copy per step
        return pick(logits, self.masks(proposal.mask), self.warp, generator, processors, context)

    def rollback(self, valid: list[int]) -> None:
        """Row r committed only the first `valid[r]` tokens of its last context."""
        self.kv.crop_rows(valid)

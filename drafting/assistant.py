"""A small causal LM as drafter, masked by the guide at each position: `pick` / `settle` (its choice) and `Assistant`
(the engine's: one forward drafts a token for every row that asks, on a `drafting.row_kv.RowsKV` of one row or
many). What a row asks is its `Asker`: a `RowAsker` drafts the target's own tokens; an assistant with another
tokenizer drafts through `drafting.foreign_drafter.ForeignAsker`, in the same rounds."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

import torch

from drafting.base import DeviceMasks, Drafted
from drafting.draft_head import use_full_head
from drafting.kv_cache import input_device
from drafting.masked_head import only_allowed
from drafting.proposal import Proposal
from drafting.row_kv import RowsKV
from drafting.sampling import Warp, confidence, masked, probs, sample


@dataclass(frozen=True)
class Pick:
    """The assistant's choice at one position before the host sync."""

    found: torch.Tensor  # (2,) float64 [token, confidence] on the assistant's device
    q: torch.Tensor | None  # (1, V) the masked, warped distribution when sampling, else None
    logits: torch.Tensor  # (1, V) masked logits before the warpers


def pick(logits: torch.Tensor, mask: torch.Tensor | None, warp: Warp, generator: torch.Generator | None,
         processors=None, context: list[int] | None = None) -> Pick:
    """The assistant's next token from its logits (1, V): processors, the guide's mask, warpers, then a draw (sampling)
    or the argmax. One implementation for the engine's rows (`Assistant`) and a foreign assistant's own tokens
    (`drafting.foreign_drafter.ForeignDrafter`).

    `mask` (V,) bool on the logits' device or None; `processors(context, logits, len(context))` are the target's,
    so that drafts follow what the target will be asked (`context`: the sequence the logits follow). The confidence is
    the greedy token's probability under the masked distribution before the warpers (temperature 1): at a low sampling
    temperature the warped distribution is near one-hot wherever the assistant is unsure, and would hide the positions
    where it disagrees with the target. It depends on the distribution only, never on the token drawn from it, so a
    draft cut by confidence keeps sampling lossless (`drafting.proposal.Proposal`).
    """
    if processors:
        logits = processors(context, logits, len(context))
    logits = masked(logits.float(), None if mask is None else mask[None])  # (1, V)
    q = probs(logits, None, warp) if warp.do_sample else None  # (1, V), already masked
    token = sample(q, generator) if q is not None else logits.argmax(-1)  # (1,)
    return Pick(torch.cat([token.double(), confidence(logits).double()]), q, logits)


def settle(picks: list[Pick]) -> list[Drafted]:
    """The picks' tokens and confidences, in one host sync for all of them."""
    found = torch.stack([p.found for p in picks]).tolist()  # (n, 2)
    return [Drafted(int(token), p.q, conf, p.logits) for p, (token, conf) in zip(picks, found)]


class Asker(Protocol):
    """One row's side of the assistant's drafting rounds (`Assistant.rounds`): a row of the target's vocabulary
    (`RowAsker`) or of another (`drafting.foreign_drafter.ForeignAsker`)."""

    mask: torch.Tensor | None  # (V_assistant,) the guide's mask at its next assistant position, None: no guide
    processors: object  # logits processors run before the mask (None: none); the masked head is then not used
    seconds: float  # its own host work since it was made (respelling, ...), outside the rounds' timed forwards
    respelling: float  # ... of which tokenizer calls

    def asks(self) -> bool:
        """Do the row's free work; True when its next token needs an assistant forward."""

    def kept(self, cached: int) -> int:
        """How many of the `cached` entries of its row of the assistant's cache still hold."""

    def feed(self, cached: int) -> list[int]:
        """What its row's cache lacks after `cached` entries (assistant ids), its next token's logits after them."""

    def pick(self, logits: torch.Tensor, masks: DeviceMasks) -> Pick:
        """Its token from the logits (1, V) after its feed (`masks` moves a guide mask to the logits' device)."""

    def give(self, drafted: Drafted) -> None:
        """The token picked, after the round's host sync."""


class RowAsker:
    """A row whose assistant drafts the target's own tokens: its `Proposal` asks, each token picked by `warp` with
    the row's generator and logits processors (the target's)."""

    seconds = respelling = 0.0

    def __init__(self, proposal: Proposal, warp: Warp, generator: torch.Generator | None, processors):
        self.proposal, self.warp, self.generator, self.processors = proposal, warp, generator, processors

    @property
    def mask(self) -> torch.Tensor | None:
        return self.proposal.mask

    def asks(self) -> bool:
        return self.proposal.fill()

    def kept(self, cached: int) -> int:
        return cached  # its cache holds a prefix of its context (cropped after each step: `Assistant.rollback`)

    def feed(self, cached: int) -> list[int]:
        return self.proposal.tail(cached)

    def pick(self, logits: torch.Tensor, masks: DeviceMasks) -> Pick:
        context = self.proposal.context if self.processors else None  # built only for processors: no copy per step
        return pick(logits, masks(self.mask), self.warp, self.generator, self.processors, context)

    def give(self, drafted: Drafted) -> None:
        self.proposal.give(drafted)


class Assistant:
    """The assistant over the engine's rows cache: one forward drafts one token for every row that asks.

    Each row's `Asker` holds its rule (a `Proposal`: forced runs and prompt-lookup copies on the host, the cut; for
    an assistant with another tokenizer, its text kept in step with the target's); each row is asked for its tokens
    in its own order, so it drafts what it would draft alone.
    """

    def __init__(self, kv: RowsKV, warp: Warp):
        self.kv, self.warp = kv, warp
        self.masks = DeviceMasks(input_device(kv.model))
        self.forwards, self.seconds = 0, 0.0  # drafting rounds (assistant forwards) and their wall time
        self.positions = 0  # positions those forwards computed (`RowsKV.positions`: each row's catch-up included)

    def draft(self, proposals: list[Proposal], generators: list, processors: list) -> list[int]:
        """Complete every row's proposal (`rounds` over `RowAsker`s); returns how many assistant forwards each row
        took part in."""
        return self.rounds([RowAsker(p, self.warp, g, f) for p, g, f in zip(proposals, generators, processors)])

    def rounds(self, askers: list[Asker]) -> list[int]:
        """Draft until no row asks; returns how many assistant forwards each row took part in.

        Row r's assistant cache holds a prefix of its context (what `askers[r].kept` says still holds); each forward
        feeds every asking row what its cache lacks and picks its next token (`Asker.pick`): one host sync per round.
        The caches are left holding only what still holds.
        """
        took = [0] * len(askers)
        asking = [r for r, a in enumerate(askers) if a.asks()]
        while asking:
            start = time.perf_counter()
            self._crop(askers)
            feeds = [askers[r].feed(n) if r in asking else [] for r, n in enumerate(self.kv.lengths)]
            self.positions += self.kv.positions(feeds)
            use_full_head(self.kv.model, [askers[r].mask for r in asking])  # a draft vocabulary's exceptions
            with only_allowed(self.kv.model, self._masks([askers[r] for r in asking])):
                logits = self.kv.run(feeds, [1] * len(feeds))  # (1, V) per asking row: after its whole context
            drafted = settle([askers[r].pick(logits[r], self.masks) for r in asking])  # the round's one host sync
            # timed up to the sync: on a GPU that is the forward's kernels, not only their launch
            self.forwards, self.seconds = self.forwards + 1, self.seconds + time.perf_counter() - start
            for r, d in zip(asking, drafted):
                askers[r].give(d)
                took[r] += 1
            asking = [r for r in asking if askers[r].asks()]
        self._crop(askers)
        return took

    def _crop(self, askers: list[Asker]) -> None:
        """Crop each row's cache to the entries that still hold (a foreign row that respelled text since)."""
        kept = [a.kept(n) for a, n in zip(askers, self.kv.lengths)]
        if kept != self.kv.lengths:
            self.kv.crop_rows(kept)

    def _masks(self, asking: list[Asker]) -> list[torch.Tensor] | None:
        """The guide's mask (1, V) at each asking row's next position; None where some row's logits are read
        unmasked (no guide, or logits processors that run before the mask)."""
        if any(a.mask is None or a.processors for a in asking):
            return None
        return [self.masks(a.mask)[None] for a in asking]

    def rollback(self, valid: list[int]) -> None:
        """Row r committed only the first `valid[r]` tokens of its last context."""
        self.kv.crop_rows(valid)

"""What the cost-aware policy believes, and the cut it makes from it: acceptance per confidence (`Calibration`), the
costs and rates of one step (`Estimates`), and `cut_width`, the one cut for one row or the rows of a batch.

A draft's acceptance is predicted from the assistant's confidence in it, calibrated online per confidence bin.
The cut prices drafts by the positions they add to the target's forward: B rows decoded together share one forward
over B x n positions (each row fed n, padding included), whose measured cost is T(B n); a row's drafts past the
others' widen every row. `cut_width` chooses the per-row width n that maximizes the batch's expected committed tokens
minus a price times seconds (Dinkelbach's method for the best tokens per second), or asks for another drafting round.
With one row it is the single-row cut: verify the first i drafts, or draft on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

CONFIDENCE_BINS = (0.0, 0.3, 0.5, 0.7, 0.85, 0.95, 0.99)  # lower edges of the calibration bins
RUN_BINS = (0, 1, 2, 4)  # lower edges of a prompt-lookup draft's place in its copied run (0: the run's first token)


@dataclass(frozen=True)
class Calibration:
    """P(the target accepts a draft | the assistant's confidence in it): decayed counts per confidence bin.

    Each bin's estimate starts from the confidence itself, worth `prior_weight` judged tokens.
    """

    accepted: tuple[float, ...] = (0.0,) * len(CONFIDENCE_BINS)
    judged: tuple[float, ...] = (0.0,) * len(CONFIDENCE_BINS)
    prior_weight: float = 1.0

    def observed(self, confidence: tuple[float, ...], accepted: int, decay: float) -> Calibration:
        """After the target judged drafts of these confidences (NaN: none) and accepted the first `accepted`."""
        conf = np.asarray(confidence, dtype=float)  # (j,)
        known = ~np.isnan(conf)
        if not known.any():
            return self
        bins = confidence_bins(conf[known])
        hits = (np.arange(len(conf)) < accepted)[known].astype(float)
        touched = np.bincount(bins, minlength=len(CONFIDENCE_BINS)) > 0
        fade = np.where(touched, decay, 1.0)
        acc = fade * np.asarray(self.accepted) + np.bincount(bins, hits, len(CONFIDENCE_BINS))
        judged = fade * np.asarray(self.judged) + np.bincount(bins, minlength=len(CONFIDENCE_BINS))
        return replace(self, accepted=tuple(acc.tolist()), judged=tuple(judged.tolist()))

    def predict(self, confidence: np.ndarray, optimism: float = 0.0) -> np.ndarray:
        """(j,) acceptance probabilities for (j,) confidences; NaN stays NaN.

        The mean of the bin's Beta posterior, plus `optimism` times its standard deviation: an optimistic
        estimate is wide where the bin has little evidence, so one unlucky rejection cannot make a cut drop
        every later draft of that confidence unverified (and so never judged again).
        """
        known = ~np.isnan(confidence)
        bins = confidence_bins(np.where(known, confidence, 0.0))
        acc, judged = np.asarray(self.accepted)[bins], np.asarray(self.judged)[bins]
        evidence = judged + self.prior_weight
        mean = (acc + self.prior_weight * confidence) / evidence
        spread = np.sqrt(np.clip(mean * (1.0 - mean), 0.0, None) / (evidence + 1.0))
        return np.where(known, np.minimum(mean + optimism * spread, 1.0), np.nan)


def confidence_bins(confidence: np.ndarray) -> np.ndarray:
    """(j,) index into CONFIDENCE_BINS of each of (j,) confidences."""
    return np.clip(np.searchsorted(CONFIDENCE_BINS, confidence, side="right") - 1, 0, len(CONFIDENCE_BINS) - 1)


def run_bins(confidence: np.ndarray) -> np.ndarray:
    """(j,) index into RUN_BINS of each of (j,) drafts' place in its run of prompt-lookup drafts (NaN confidence):
    the NaNs right before it; -1 for a draft with a confidence. A copy is accepted more surely the more of it the
    target has already accepted."""
    at = np.arange(len(confidence))
    start = np.maximum.accumulate(np.where(np.isnan(confidence), 0, at + 1))  # (j,) the first index of each run
    return np.searchsorted(RUN_BINS, at - start, side="right") - 1


@dataclass(frozen=True)
class RowDrafts:
    """One row's model drafts so far, as the cut sees them."""

    accepts: np.ndarray  # (d,) predicted acceptance of each model draft so far (prompt-lookup copies included)
    acceptance: float  # the row's mean acceptance: drafts not drafted yet are predicted at least this
    cap: int  # the most model drafts it may have this step
    asking: bool = True  # it may still draft this step
    fixed: bool = False  # its schedule never cuts: every draft is verified
    to_come: bool = False  # not drafted yet: its free copies (`accepts`, up to its cap) will fill the width verified


def cut_width(rows: list[RowDrafts], seconds: np.ndarray, price: float, draft_seconds: float) -> int | None:
    """None: draft another round; else the per-row width n to verify at (row r keeps min(d_r, n - 1) drafts).

    `seconds[n]`: a target forward where every row is fed n positions (n >= 1; held flat past its end); `price`:
    tokens a second is worth; `draft_seconds`: one assistant forward (one round, every asking row). Value of verifying
    at n: the rows' expected accepted drafts minus price * seconds[1 + the longest kept]; of M more rounds: every
    asking row's drafts so far plus survival * (a + ... + a^M) up to its cap (a = max(its latest draft's predicted
    acceptance, its mean)) minus price * (seconds of the wider forward + M rounds). Drafting seconds already spent
    are sunk. A row whose copies are still `to_come` (prompt lookup fills row by row, all at once, after this one)
    fills whatever width the others choose, free: it counts its expected copies up to that width and widens nothing.
    """
    d = np.array([0 if r.to_come else len(r.accepts) for r in rows])  # (B,) drafted so far
    have = np.array([len(r.accepts) for r in rows])[:, None]  # (B, 1) drafts each may be verified with
    room = np.array([max(0, r.cap - len(r.accepts)) if r.asking else 0 for r in rows])  # (B,) rounds each may add
    need = 2 + int((d + room).max())
    seconds = np.concatenate([seconds, np.full(max(0, need - len(seconds)), seconds[-1])])  # flat past the end
    widths = np.arange(1, d.max() + 2)  # (N,) candidate widths
    fixed = np.array([r.fixed for r in rows])[:, None]
    kept = np.where(fixed, have, np.minimum(have, widths[None] - 1))  # (B, N)
    chains = [np.cumprod(r.accepts) for r in rows]  # (d,) each: P(the first i drafts are all accepted)
    value = sum(_gains(c)[k] for c, k in zip(chains, kept))
    value = value - price * seconds[1 + kept.max(0)]  # (N,)
    if room.max() > 0:
        m = np.arange(1, room.max() + 1)  # (M,)
        steps = np.minimum(m[None], room[:, None])  # (B, M) rounds each row takes part in
        wider = (d[:, None] + steps).max(0)  # (M,) the widest row's drafts after m more rounds
        more = sum(_gains(c)[np.minimum(wider, len(c))] if r.to_come else _projected(r, c, n)
                   for r, c, n in zip(rows, chains, steps))
        more = more - price * (seconds[1 + wider] + m * draft_seconds)
        if more.max() > value.max():
            return None
    return int(widths[np.argmax(value)])


def _gains(chain: np.ndarray) -> np.ndarray:
    """(d + 1,) expected accepted drafts of a row verified with its first 0..d drafts (`chain`: their survival)."""
    return np.concatenate([[0.0], np.cumsum(chain)])


def _projected(row: RowDrafts, chain: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """(M,) expected accepted drafts of `row` after `steps` more drafts of predicted acceptance a each."""
    last = float(row.accepts[-1]) if len(chain) else row.acceptance
    a = min(max(last, row.acceptance), 1.0 - 1e-9)
    reach = float(chain[-1]) if len(chain) else 1.0
    return chain.sum() + reach * a * (1.0 - a**steps) / (1.0 - a)


@dataclass(frozen=True)
class Estimates:
    """A cost-aware policy's beliefs: costs, acceptance, and the two modes' tokens per second.

    In a batch of B rows the seconds are the batch's (`target_seconds[n]`: every row fed n positions) and the rates
    the batch's tokens per second.
    """

    target_seconds: tuple[float, ...]  # [n]: seconds of a target forward over n tokens per row, n = 0..k_max + 1
    draft_per_token: float  # seconds per assistant token (one assistant forward)
    acceptance: float  # mean acceptance of the assistant's verified drafts (decayed)
    calibration: Calibration  # acceptance given the assistant's confidence
    plain_rate: float  # tokens per second of plain decoding, rows / target(1)
    drafting_rate: float | None  # measured tokens per second of this call's drafting steps (None: none yet)
    lookup_acceptance: tuple[float, ...] = (0.6,) * len(RUN_BINS)  # prompt-lookup drafts (no confidence): the
    # decayed acceptance given the copy so far was accepted, per place in the copied run (`RUN_BINS`)
    optimism: float = 0.0  # where the cut would verify nothing, it rereads acceptance this many stds above the mean
    window: int | None = None  # the most drafts of the next step (None: k_max)
    leaf_calibration: Calibration = Calibration()  # P(the target picks the runner-up | the sibling was rejected)
    worth: float = 1.0  # accepted drafts over those the estimates predicted: scales every predicted acceptance

    @property
    def price(self) -> float:
        """Tokens a second is worth: the better of plain decoding's rate and the measured drafting rate."""
        return max(self.plain_rate, self.drafting_rate or 0.0)

    def cap(self, k_max: int) -> int:
        """The most model drafts a step may have."""
        return min(k_max, len(self.target_seconds) - 2, k_max if self.window is None else self.window)

    def drafts(self, confidence: tuple[float, ...], k_max: int, optimism: float = 0.0, asking: bool = True
               ) -> RowDrafts:
        """This row's drafts of these confidences as `cut_width` sees them."""
        return RowDrafts(self.accepts(confidence, optimism), self.acceptance, self.cap(k_max), asking)

    def copies_to_come(self, k_max: int, optimism: float = 0.0) -> RowDrafts:
        """This row's prompt-lookup copies, not drafted yet (up to its cap), as `cut_width` sees them."""
        cap = self.cap(k_max)
        return RowDrafts(self.accepts((np.nan,) * cap, optimism), self.acceptance, cap, False, to_come=True)

    def cut(self, confidence: tuple[float, ...], k_max: int) -> int | None:
        """After j drafts with these confidences (NaN: none): None to draft on, else how many to verify (0..j).

        `cut_width` with this row alone. Acceptance is read at the calibration's mean; where that would verify
        nothing, at `optimism` standard deviations above it, and the drafts so far are verified if that pays: a draft
        that is not verified is never judged, so an estimate that one unlucky rejection pushed down could not recover.
        """
        width = shared_cut([self], [confidence], [True], k_max)
        return None if width is None else min(width - 1, len(confidence))

    def leaf_pays(self, before: tuple[float, ...], sibling: float, leaf: float, rows: int, beside: int = 0) -> bool:
        """Whether a side leaf's expected extra token is worth one more row in a forward over `rows` tokens (the
        other rows of a batch fed at most `beside`).

        Expected extra token: P(the drafts `before` its sibling are accepted) * P(the sibling, of confidence
        `sibling`, is rejected) * P(the target picks the leaf, of confidence `leaf` among the rest). Price:
        target(rows + 1) - target(rows) seconds at `price` (free where another row is as wide); past the curve's
        end a row is free, as the cost table holds its largest measured n. NaN in `before` marks a prompt-lookup
        draft.
        """
        reach = float(np.prod(self.accepts(before)))
        rejected = 1.0 - float(self.accepts((sibling,))[0])
        picked = float(self.leaf_calibration.predict(np.array([leaf]))[0])
        last = len(self.target_seconds) - 1
        wide, narrow = max(beside, rows + 1), max(beside, rows)
        extra = self.target_seconds[min(wide, last)] - self.target_seconds[min(narrow, last)]
        return reach * rejected * picked > self.price * extra

    def accepts(self, confidence: tuple[float, ...], optimism: float = 0.0, checked: bool = True) -> np.ndarray:
        """(j,) predicted acceptance of drafts with these confidences; NaN marks a prompt-lookup draft. `checked`:
        scaled by `worth` (what the target accepted over what was predicted), at most 1."""
        conf = np.asarray(confidence, dtype=float)
        acc = self.calibration.predict(conf, optimism)
        acc = np.where(np.isnan(acc), np.asarray(self.lookup_acceptance)[run_bins(conf)], acc)
        return np.minimum(acc * self.worth, 1.0) if checked else acc


def shared_cut(estimates: list[Estimates], confidences: list[tuple[float, ...]], asking: list[bool], k_max: int,
               fixed: int = 0, to_come: Sequence[Estimates] = ()) -> int | None:
    """`cut_width` over rows sharing one forward (their estimates share seconds, price and draft cost); `fixed`: the
    widest row whose schedule never cuts (its drafts are verified whatever this decides); `to_come`: rows whose
    prompt-lookup copies are drafted after these (`RowDrafts.to_come`).

    Where the cut at the mean verifies nothing, it is asked again at `optimism` standard deviations above it; if
    that would draft on, everything drafted so far is verified.
    """
    first = estimates[0]
    seconds, price, draft = np.asarray(first.target_seconds), first.price, first.draft_per_token
    extra = [RowDrafts(np.ones(fixed - 1), 1.0, 0, False, True)] if fixed else []
    rows = [e.drafts(c, k_max, 0.0, a) for e, c, a in zip(estimates, confidences, asking)] + extra
    width = cut_width(rows + [e.copies_to_come(k_max) for e in to_come], seconds, price, draft)
    if width == 1 and first.optimism:
        hopeful = [e.drafts(c, k_max, e.optimism, a) for e, c, a in zip(estimates, confidences, asking)] + extra
        found = cut_width(hopeful + [e.copies_to_come(k_max, e.optimism) for e in to_come], seconds, price, draft)
        width = 1 + max(map(len, confidences)) if found is None else found
    return width

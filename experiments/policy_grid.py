"""A replay grid that can fail: `auto` against plain decoding and every fixed draft length, on injected costs.

    python -m experiments.policy_grid [--steps 160] [--out experiments/results/<run>] [--tsv cells.tsv]

Each cell is a synthetic trace per row (acceptance and the assistant's confidence per position) and a cost model:
  acceptance  the mean chance a draft is accepted (each position's chance varies around it);
  temperature 0: greedy (a position is accepted or not, the same for every policy); > 0: the chance is drawn per
              position (common random numbers: every policy meets the same luck at a position); the confidence is
              over- (0.7) or under-stated (1.5) against the chance, as a warped target moves away from the
              assistant's T = 1 confidence;
  source      "assistant": confidence follows the chance; "point-mass": an assistant of another tokenizer, sure of
              its text whatever the target thinks (confidence 0.9-0.999, acceptance the target's p(x)); "lookup":
              prompt-lookup copies (no confidence, no assistant forward);
  ratio       an assistant round's seconds over a target step's, at the same rows;
  rows        B rows decoded in lock-step, sharing one target forward per step over B x (1 + widest draft) positions
              (padding included), as the engine does.
The target's seconds at m positions follow a CPU's curve (`cpu_seconds`: the int8 Qwen2.5-Coder-1.5B measured on a
2-core CPU). Rows draft through the real `Proposal` (the cut after every model draft, sampling drops at most the
last) and the real `Auto` priced by `SharedPrices`, as the engine drives them; the clock is the cost model.

A cell's score is `auto`'s committed tokens per second over the better of plain decoding's and the best fixed draft
length's (k = 1..8, never cut), each over the same steps and draws. `auto` starts as a warmed process does: the
costs measured, the calibration fresh.
"""

from __future__ import annotations

import itertools
import math
import sys
import zlib
from dataclasses import astuple, dataclass
from pathlib import Path

import numpy as np

from assisted.policy.auto import Auto, AutoConfig
from assisted.policy.costs import CostTable, StepCost
from assisted.policy.prices import SharedPrices, row_cuts
from drafting.base import Cursor, Drafted
from drafting.proposal import Proposal
from experiments.lib import cli
from experiments.lib.report import table

ACCEPTANCE = (0.1, 0.3, 0.5, 0.7, 0.85, 0.95)
TEMPERATURES = (0.0, 0.7, 1.5)
RATIOS = (0.05, 0.2, 0.5, 1.0)
ROWS = (1, 4, 16)
SOURCES = ("assistant", "point-mass", "lookup")
FIXED = tuple(range(1, 9))
LENGTH = 256  # positions per row's trace (read cyclically)
EOS = frozenset([0])
CONFIDENCE_BIAS = {0.0: 0.0, 0.7: 0.15, 1.5: -0.15}  # the assistant's T = 1 confidence against the chance


@dataclass(frozen=True)
class Cell:
    acceptance: float
    temperature: float
    ratio: float
    rows: int
    source: str = "assistant"
    curve: str = "int8"  # the target's cost curve (`CURVES`)

    @property
    def sampling(self) -> bool:
        return self.temperature > 0


@dataclass(frozen=True)
class RowTrace:
    """One row's text: what each position offers a draft."""

    chance: tuple[float, ...]  # [t]: P(a draft at t is accepted)
    confidence: tuple[float, ...]  # [t]: the assistant's confidence (NaN: a prompt-lookup copy)
    uniform: tuple[float, ...]  # [t]: the draw a draft at t is accepted under (chance > uniform)


def cpu_seconds(m: int) -> float:
    """Seconds of a target forward over m positions: the int8 Qwen2.5-Coder-1.5B on a 2-core CPU (stop 51:
    211/228/280/359/434 ms at 1/2/4/8/16 positions), continued linearly past 16."""
    xs, ys = [1, 2, 4, 8, 16], [0.211, 0.228, 0.280, 0.359, 0.434]
    return float(np.interp(m, xs, ys)) + (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) * max(m - xs[-1], 0)


def steep_seconds(m: int) -> float:
    """A float32 target unpacked on a CPU (issue 56's probe: a verify of 3.4 positions cost 2x a 0.5 s step)."""
    return 0.5 * (1.0 + (m - 1) / 2.4)


CURVES = {"int8": cpu_seconds, "steep": steep_seconds}


@dataclass(frozen=True)
class Clock:
    """The injected costs: a target forward over m positions, an assistant round over r rows (`ratio` of a target
    step over the same rows)."""

    ratio: float
    target: tuple[float, ...]  # [m], m = 0..

    def forward(self, positions: int) -> float:
        return self.target[positions]

    def round(self, rows: int) -> float:
        return self.ratio * self.target[rows]


def clock(cell: Cell, k_max: int = 20) -> Clock:
    seconds = CURVES[cell.curve]
    return Clock(cell.ratio, (0.0,) + tuple(seconds(m) for m in range(1, cell.rows * (k_max + 2) + 1)))


def traces(cell: Cell, seed: int = 0) -> list[RowTrace]:
    """Each row's trace for the cell (deterministic in the cell and `seed`)."""
    key = zlib.crc32(f"{cell} {seed}".encode())
    rng = np.random.default_rng(key)
    out = []
    for _ in range(cell.rows):
        chance = np.clip(cell.acceptance + rng.normal(0.0, 0.1, LENGTH), 0.0, 1.0)  # (L,)
        uniform = rng.random(LENGTH)
        if not cell.sampling:  # greedy: the position agrees or not
            chance, uniform = (uniform < chance).astype(float), np.full(LENGTH, 0.5)
        if cell.source == "point-mass":
            confidence = rng.uniform(0.9, 0.999, LENGTH)
        elif cell.source == "lookup":
            confidence = np.full(LENGTH, math.nan)
        else:
            base = chance if cell.sampling else np.clip(cell.acceptance + 0.3 * (chance - 0.5), 0.0, 1.0)
            confidence = np.clip(base + CONFIDENCE_BIAS[cell.temperature] + rng.normal(0.0, 0.05, LENGTH), 0.02, 0.999)
        out.append(RowTrace(tuple(chance.tolist()), tuple(confidence.tolist()), tuple(uniform.tolist())))
    return out


class Copies:
    """A stand-in for `drafting.lookup.PromptLookup`: always offers a copy (its acceptance is the trace's)."""

    def continuation(self, context: list[int], n: int) -> list[int]:
        return [2] * n


def replay(policies: list, rows: list[RowTrace], clk: Clock, cell: Cell, steps: int, prices=None) -> float:
    """Decode `steps` lock-step steps of every row with its policy; returns committed tokens per second.

    As the engine does: each row's proposal (`Proposal`, cut after every model draft), the assistant's tokens in
    rounds over the asking rows, one target forward over rows x (1 + the widest draft), each row judged up to its
    first rejection; the policies learn, then the shared prices book the forward."""
    lookup = cell.source == "lookup"
    pos, tokens, seconds = [0] * len(rows), 0, 0.0
    for _ in range(steps):
        if prices is not None:
            prices.begin(policies)
        proposals: list[Proposal] = []  # as the engine hands them to the rows' cuts
        cuts = row_cuts(policies, proposals, prices)
        proposals += [Proposal([1], Cursor(None, EOS), k=0 if lookup else p.k, lookup_k=p.lookup_k if lookup else 0,
                               limit=64, lookup=Copies() if lookup else None, sampling=cell.sampling, cut=cut)
                      for p, cut in zip(policies, cuts)]
        asking, rounds, round_seconds = [r for r, p in enumerate(proposals) if p.fill()], 0, 0.0
        while asking:
            rounds, round_seconds = rounds + 1, round_seconds + clk.round(len(asking))
            for r in asking:
                at = (pos[r] + proposals[r].model_drafts) % LENGTH
                proposals[r].give(Drafted(2, None, rows[r].confidence[at], None))
            asking = [r for r in asking if proposals[r].fill()]
        verified = [p.model_confidence for p in proposals]
        width = len(rows) * (1 + max(map(len, verified)))
        target = clk.forward(width)
        for r, (policy, conf) in enumerate(zip(policies, verified)):
            judged = accepted = 0
            while judged < len(conf):
                at = (pos[r] + judged) % LENGTH
                judged += 1
                if rows[r].uniform[at] >= rows[r].chance[at]:
                    break
                accepted += 1
            policy.update(judged, accepted, StepCost(len(conf) + 1, target, rounds, round_seconds), conf)
            pos[r], tokens = pos[r] + accepted + 1, tokens + accepted + 1
        if prices is not None:
            prices.observe(StepCost(width, target, rounds, round_seconds), list(zip(policies, verified)))
        seconds += target + round_seconds
    return tokens / seconds


def fixed_rate(k: int, rows: list[RowTrace], clk: Clock, cell: Cell, steps: int) -> float:
    """`replay` of `Constant(k)` on every row, short: k drafts per row and step, never cut, every row drafting (prompt
    lookup: k free copies)."""
    target = clk.forward(len(rows) * (k + 1)) + (0.0 if cell.source == "lookup" else k * clk.round(len(rows)))
    tokens = 0
    for row in rows:
        pos = 0
        for _ in range(steps):
            accepted = 0
            while accepted < k and row.uniform[(pos + accepted) % LENGTH] < row.chance[(pos + accepted) % LENGTH]:
                accepted += 1
            pos, tokens = pos + accepted + 1, tokens + accepted + 1
    return tokens / (steps * target)


def warmed(clk: Clock, rows: int, k_max: int, assistant: bool = True) -> CostTable:
    """The cost table a warmed process holds: every width measured once, the assistant's seconds per round (none
    without an assistant: prompt lookup alone)."""
    table = CostTable()
    for m in range(1, rows * (k_max + 2) + 1):
        table = table.with_target(m, clk.forward(m), 0.9, 64 * rows)
    return table.with_draft(clk.round(rows), 0.9) if assistant else table


def auto_rows(cell: Cell, clk: Clock, config: AutoConfig | None = None) -> tuple[list[Auto], SharedPrices]:
    config = config or AutoConfig()
    prices = SharedPrices(config, warmed(clk, cell.rows, config.k_max, cell.source != "lookup"), prefilled=True)
    return [Auto(5, config, prices=prices) for _ in range(cell.rows)], prices


@dataclass(frozen=True)
class Score:
    cell: Cell
    auto: float  # tokens per second
    plain: float
    fixed: dict  # k -> tokens per second

    @property
    def best_k(self) -> int:
        return max(self.fixed, key=self.fixed.get)

    @property
    def ratio(self) -> float:
        """`auto` over the better of plain decoding and the best fixed draft length."""
        return self.auto / max(self.plain, max(self.fixed.values()))


def score(cell: Cell, steps: int = 160, config: AutoConfig | None = None, seed: int = 0) -> Score:
    """`auto`, plain decoding and every fixed k on the cell's traces and draws."""
    rows, clk = traces(cell, seed), clock(cell)
    policies, prices = auto_rows(cell, clk, config)
    steps = steps if cell.rows == 1 else steps // 2  # B rows commit B tokens a step
    auto = replay(policies, rows, clk, cell, steps, prices)
    plain = fixed_rate(0, rows, clk, cell, steps)
    fixed = {k: fixed_rate(k, rows, clk, cell, steps) for k in FIXED}
    return Score(cell, auto, plain, fixed)


def grid(acceptance=ACCEPTANCE, temperatures=TEMPERATURES, ratios=RATIOS, rows=ROWS, sources=SOURCES,
         curves=tuple(CURVES)) -> list[Cell]:
    """Every cell; prompt lookup has no assistant round, so its cells ignore the ratio (one each)."""
    cells = []
    for a, t, r, b, s, c in itertools.product(acceptance, temperatures, ratios, rows, sources, curves):
        if s != "lookup" or r == ratios[0]:
            cells.append(Cell(a, t, r, b, s, c))
    return cells


def main(argv: list[str] | None = None) -> int:
    p = cli.parser("policy_grid", __doc__)
    p.add_argument("--steps", type=int, default=160)
    cli.add_out(p, required=False, help="write README.md with every cell here")
    p.add_argument("--tsv", type=Path, help="also write every cell here, grid order: the cell, auto / best, plain, the "
                   "best fixed k and auto tokens per second (tab-separated, no header)")
    args = p.parse_args(argv)
    scores = [score(c, args.steps) for c in grid()]
    if args.tsv:
        cells = ([*map(str, astuple(s.cell)), f"{s.ratio:.4f}", f"{s.plain:.4f}", f"{max(s.fixed.values()):.4f}",
                  f"{s.auto:.4f}"] for s in scores)
        args.tsv.write_text("".join("\t".join(cell) + "\n" for cell in cells))
    scores = sorted(scores, key=lambda s: s.ratio)
    best = lambda s: "plain" if s.plain >= max(s.fixed.values()) else f"k={s.best_k}"  # noqa: E731
    lines = [f"{len(scores)} cells, {sum(s.ratio < 0.97 for s in scores)} below 0.97x; worst {scores[0].ratio:.3f}",
             "", *table(["acceptance", "T", "ratio", "rows", "source", "curve", "auto / best", "best", "plain tok/s",
                         "auto tok/s"], [[*astuple(s.cell), f"{s.ratio:.3f}", best(s), f"{s.plain:.2f}",
                                          f"{s.auto:.2f}"] for s in scores])]
    print("\n".join(lines))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "README.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One benchmark run split over processes (one per core): shard I of N takes prompts I, I+N, I+2N, ...

Each shard writes its own folder `<out>/shard-I`; a report reads every shard's results.csv together.
"""

from __future__ import annotations

from pathlib import Path


def check(shard: tuple[int, int] | None) -> None:
    """Raise ValueError unless `shard` is None or (I, N) with 0 <= I < N."""
    if shard is not None and not 0 <= shard[0] < shard[1]:
        raise ValueError(f"--shard {shard[0]} {shard[1]}: need 0 <= I < N")


def pick(prompts: list, shard: tuple[int, int] | None) -> list:
    """The prompts of shard (I, N), or all of them."""
    return prompts if shard is None else prompts[shard[0] :: shard[1]]


def folder(out: Path, shard: tuple[int, int] | None) -> Path:
    """Where shard (I, N) of a run into `out` writes."""
    return out if shard is None else out / f"shard-{shard[0]}"


def results(out: Path) -> list[Path]:
    """The results.csv files of a run: every shard's, or the run's own."""
    return sorted(out.glob("shard-*/results.csv")) or [out / "results.csv"]

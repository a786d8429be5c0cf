"""Forced tokens from the guide: the tokens every valid continuation starts with, at no model cost."""

from __future__ import annotations

from drafting.base import Cursor


class ForcedTokens:
    """Hands out the guide's forced tokens one at a time.

    A run from `cursor.forced()` is used up before the guide is asked again, so a forced string is
    always taken in its canonical tokenization, whichever source drafted the token before it.
    """

    __slots__ = ("_run",)

    def __init__(self) -> None:
        self._run: list[int] = []

    def next(self, cursor: Cursor) -> int | None:
        """The next forced token at the cursor's state, or None if the model must choose."""
        if not self._run:
            self._run = list(cursor.forced())
        return self._run.pop(0) if self._run else None

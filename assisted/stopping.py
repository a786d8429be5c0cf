"""Stop strings and stopping criteria, checked after every committed token (a draft's tokens one by one).

A stop string ends generation at the token that completes it in the generated text, across token boundaries, as
plain decoding would: the committed text holds the stop string and nothing the model wrote after that token. The
check works on the tokens' bytes (`fsm.Vocabulary`), not the tokenizer: a bytes window as long as the longest stop
string plus the last token. Stopping criteria (transformers' `StoppingCriteria`) are called with the ids so far
(prompt included, (1, L)) and `scores=None`: a verified run has no scores for its coalesced tokens.
"""

from __future__ import annotations

import torch


class Stops:
    """Whether the sequence just committed ends generation: "stop_string", "criteria" or None."""

    def __init__(self, stop_strings, stopping_criteria, token_bytes: tuple[bytes, ...], device):
        self.strings = tuple(s.encode() for s in _strings(stop_strings))
        self.criteria, self.token_bytes, self.device = _criteria(stopping_criteria), token_bytes, device
        self.tail = b""  # the generated text's last bytes: long enough to hold any stop string

    def __bool__(self) -> bool:
        return bool(self.strings or self.criteria)

    def fresh(self) -> Stops:
        """The same stop strings and criteria for another sequence (a row of its own)."""
        found = Stops(None, None, self.token_bytes, self.device)
        found.strings, found.criteria = self.strings, self.criteria
        return found

    def after(self, seq: list[int]) -> str | None:
        """Book the last token of `seq` and say whether it ends generation."""
        if self.strings:
            new = self.token_bytes[seq[-1]]
            self.tail = (self.tail + new)[-(max(map(len, self.strings)) + len(new)):]
            if new and any(s in self.tail[-(len(s) + len(new) - 1):] for s in self.strings):  # a match ending in `new`
                return "stop_string"
        if self.criteria and bool(self.criteria(torch.tensor([seq], device=self.device), None).any()):
            return "criteria"
        return None


def _criteria(stopping_criteria):
    """A transformers StoppingCriteriaList, or None."""
    from transformers import StoppingCriteriaList

    if not stopping_criteria:
        return None
    if not isinstance(stopping_criteria, (list, tuple)) or not all(callable(c) for c in stopping_criteria):
        raise TypeError(f"stopping_criteria must be a list of transformers StoppingCriteria, got "
                        f"{type(stopping_criteria).__name__}")
    return StoppingCriteriaList(stopping_criteria)


def _strings(stop_strings) -> tuple[str, ...]:
    if stop_strings is None:
        return ()
    strings = (stop_strings,) if isinstance(stop_strings, str) else tuple(stop_strings)
    if not all(isinstance(s, str) and s for s in strings):
        raise ValueError(f"stop_strings must be a non-empty str or a list of them, got {stop_strings!r}")
    return strings


class Sink:
    """Where committed tokens go besides the sequence: the stop checks, and a streamer that gets the prompt first,
    then each step's committed tokens, and `end()` when the row ends (also on an error, so no reader waits)."""

    def __init__(self, stops: Stops, streamer, prompt: list[int]):
        check_streamer(streamer)
        self.stops, self.streamer, self.prompt = stops, streamer, prompt
        self.ended = False

    def open(self) -> None:
        """Stream the prompt: (1, L), as transformers' generate does."""
        if self.streamer is not None:
            self.streamer.put(torch.tensor([self.prompt]))

    def close(self) -> None:
        """End the stream (once; also when the call fails, so that no reader waits)."""
        if self.streamer is not None and not self.ended:
            self.ended = True
            self.streamer.end()

    def put(self, tokens: list[int]) -> None:
        """Stream tokens just committed (a step's accepted run at once)."""
        if self.streamer is not None and tokens:
            self.streamer.put(torch.tensor(tokens))


def check_streamer(streamer) -> None:
    """TypeError unless `streamer` is None or has put() and end() (transformers' streamer API)."""
    if streamer is not None and not (callable(getattr(streamer, "put", None)) and
                                     callable(getattr(streamer, "end", None))):
        raise TypeError(f"streamer must have put() and end() (a transformers streamer), got {type(streamer).__name__}")

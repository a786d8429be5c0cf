"""Logits processors applied position by position: row i of a forward's logits is processed with its own prefix.

transformers' processors (`RepetitionPenaltyLogitsProcessor`, a user's `LogitsProcessor`) take `(input_ids, scores)`
for the position after `input_ids`. A verification forward scores k + 1 positions whose prefixes differ by the draft
tokens before each, so each row is processed with its own prefix, exactly as plain decoding would process it at that
position: the reference of lossless verification includes the processors. They see the scores before the guide's
mask and the warpers (temperature, top-k, top-p), as a processor list before warpers does in transformers.
"""

from __future__ import annotations

import torch


class Processors:
    """A list of transformers logits processors, called once per scored position.

    Processors must be functions of `(input_ids, scores)`: a stateful one would see positions that are later
    rejected (drafts) in the order the loop scores them, as under transformers' assisted generation.
    """

    def __init__(self, processors: list):
        from transformers import LogitsProcessorList

        self.processors = LogitsProcessorList(processors)

    def __bool__(self) -> bool:
        return len(self.processors) > 0

    def __call__(self, ids: list[int], logits: torch.Tensor, first: int) -> torch.Tensor:
        """Process logits (n, V) whose row i scores the position after `ids[: first + i]`; returns (n, V) float."""
        x = torch.tensor([ids[: first + logits.shape[0] - 1]], dtype=torch.long, device=logits.device)  # (1, L)
        rows = [self.processors(x[:, : first + i], logits[i : i + 1].float()) for i in range(logits.shape[0])]
        return torch.cat(rows)  # (n, V)


def built_in(repetition_penalty: float | None, no_repeat_ngram_size: int | None) -> list:
    """transformers' processors for the penalties a generation config names (none when unset or neutral)."""
    from transformers import NoRepeatNGramLogitsProcessor, RepetitionPenaltyLogitsProcessor

    out = []
    if repetition_penalty is not None and repetition_penalty != 1.0:
        out.append(RepetitionPenaltyLogitsProcessor(float(repetition_penalty)))
    if no_repeat_ngram_size:
        out.append(NoRepeatNGramLogitsProcessor(int(no_repeat_ngram_size)))
    return out

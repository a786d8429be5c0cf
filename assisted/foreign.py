"""The engine's side of an assistant with another tokenizer: the pair checked before any model call (`is_foreign`),
what the rows share (`Foreign`), each row's assistant prompt and guide (`ForeignRow`, set up with the row's other
inputs, so that a bad row gets its own error) and its drafter (`drafting.foreign_drafter.ForeignDrafter`). The
engine's assistant runs the drafters' forwards, every row's together (`drafting.foreign_drafter.ForeignAsker`).

The assistant sees its own prompt: a text prompt in its tokens, chat messages through its own chat template where it
has one, else the target's prompt text respelled. The output is shared as text from there on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import fsm
from assisted.eos import eos_ids
from assisted.inputs import make_cursor, prompt_ids
from drafting.base import Cursor
from drafting.foreign_drafter import ForeignDrafter
from drafting.kv_cache import logits_size
from drafting.respell import Speller, speller


def is_foreign(model, assistant_model, tokenizer, assistant_tokenizer) -> bool:
    """Whether `assistant_model` drafts with a vocabulary other than the target's (only when `assistant_tokenizer`
    is given: without it the assistant must share the target's).

    Raises
    ------
    ValueError, TypeError
        For an `assistant_tokenizer` without an assistant, one that is not a tokenizer or is larger than the
        assistant's logits, and an assistant that is not a causal LM.
    """
    if assistant_tokenizer is None:
        return False
    if assistant_model is None:
        raise ValueError("assistant_tokenizer is the tokenizer of an assistant_model: pass the assistant_model too")
    if not all(callable(getattr(assistant_tokenizer, m, None)) for m in ("__call__", "__len__", "decode")):
        raise TypeError("assistant_tokenizer must be the assistant_model's transformers tokenizer, got "
                        f"{type(assistant_tokenizer).__name__}")
    check_causal(assistant_model, "assistant_model")
    size = logits_size(assistant_model)
    if len(assistant_tokenizer) > size:
        raise ValueError(f"assistant_tokenizer has {len(assistant_tokenizer)} tokens but assistant_model's logits only "
                         f"{size}: is it the assistant's tokenizer?")
    return not _same_vocabulary(model, tokenizer, assistant_tokenizer, size)


def check_causal(model, name: str) -> None:
    """TypeError unless `model` is a loaded decoder-only LM that can generate (no masked LM, no encoder-decoder)."""
    import torch

    config = getattr(model, "config", None)
    can_generate = getattr(model, "can_generate", None)
    if (not isinstance(model, torch.nn.Module) or getattr(config, "is_encoder_decoder", False)
            or not callable(can_generate) or not can_generate()):
        raise TypeError(f"{name} must be a loaded causal LM (AutoModelForCausalLM), got {type(model).__name__}")


def _same_vocabulary(model, tokenizer, assistant_tokenizer, size: int) -> bool:
    """Same logits width and the same bytes for every id: the assistant can draft target ids directly."""
    if logits_size(model) != size or len(tokenizer) > size:
        return False
    if tokenizer is assistant_tokenizer:
        return True
    ours = fsm.vocabulary_from_tokenizer(tokenizer, size).token_bytes
    return ours == fsm.vocabulary_from_tokenizer(assistant_tokenizer, size).token_bytes


@dataclass(frozen=True)
class Foreign:
    """What every row drafted by an assistant with another tokenizer shares: the assistant, its tokenizer and EOS ids,
    spellers of both vocabularies, its position limit, and how the call's schemas are read."""

    model: Any
    tokenizer: Any
    size: int  # the assistant's logits width
    eos: frozenset[int]
    target: Speller
    own: Speller
    limit: int | None  # the assistant's position limit
    guide_options: dict | None

    def row(self, item, ids: list[int], tokenizer) -> ForeignRow:
        """A row's assistant prompt and guide (`item`: an `assisted.rows.row_inputs.Item`; `ids`: the target's prompt);
        ValueError when the assistant's prompt leaves it no room to draft."""
        kwargs = {item.form: item.value}
        own = assistant_prompt(self.tokenizer, tokenizer, ids, kwargs.get("prompt"), kwargs.get("messages"), self.size)
        if self.limit is not None and len(own) >= self.limit:
            raise ValueError(f"the assistant's prompt has {len(own)} tokens but assistant_model takes at most "
                             f"{self.limit} positions: no room to draft; shorten the prompt")
        cursor = make_cursor(item.schema, item.regex, self.tokenizer, self.size, self.eos, self.guide_options)
        return ForeignRow(self, own, cursor, len(ids))


@dataclass(frozen=True)
class ForeignRow:
    """One row's assistant prompt (its own tokens) and guide (compiled for its tokenizer)."""

    foreign: Foreign
    prompt: list[int]
    cursor: Cursor
    start: int  # the target's prompt length

    def drafter(self) -> ForeignDrafter:
        f = self.foreign
        return ForeignDrafter(self.prompt, self.cursor, f.target, f.own, self.start, self.cursor.eos or f.eos, f.limit)


def foreign_setup(assistant_model, assistant_tokenizer, tokenizer, vocab_size: int, guide_options) -> Foreign:
    """The call's `Foreign` (runs no model)."""
    size = logits_size(assistant_model)
    limit = getattr(getattr(assistant_model, "config", None), "max_position_embeddings", None)
    eos = frozenset(i for i in eos_ids(assistant_model, assistant_tokenizer) if i < size)
    return Foreign(assistant_model, assistant_tokenizer, size, eos,
                   speller(fsm.vocabulary_from_tokenizer(tokenizer, vocab_size)),
                   speller(fsm.vocabulary_from_tokenizer(assistant_tokenizer, size)),
                   limit if isinstance(limit, int) and limit > 0 else None, guide_options)


def assistant_prompt(assistant_tokenizer, tokenizer, ids: list[int], prompt, messages, size: int) -> list[int]:
    """The assistant's prompt: `prompt` in its tokens, `messages` through its chat template, else the target's prompt
    `ids` decoded and respelled."""
    if prompt is not None:
        return prompt_ids(assistant_tokenizer, prompt, None, None, size)
    if messages is not None and getattr(assistant_tokenizer, "chat_template", None) is not None:
        return prompt_ids(assistant_tokenizer, None, messages, None, size)
    text = tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    found = [i for i in assistant_tokenizer(text, add_special_tokens=False)["input_ids"] if i < size]
    first = assistant_tokenizer.bos_token_id if assistant_tokenizer.bos_token_id is not None else \
        assistant_tokenizer.eos_token_id
    return found or ([first] if first is not None else [0])

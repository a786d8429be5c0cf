"""The independent plain reference for every greedy identity claim (docs/design.md section 1).

Written for the tests from the definitions, importing nothing from `assisted` or `drafting` (checked by
tests/test_reference.py): each new token is the argmax of the target's logits from a full-sequence forward
without a cache, masked with `fsm.Guide.mask()`; with `coalesce=True` the forced text of the guide's state is
appended first, without asking the target, in its coalesced spelling:

- the forced string: the longest byte string every valid continuation starts with, read off the guide's masks
  (not final, and every allowed token starts with the same byte; one byte at a time through single-byte tokens);
- the forced tokens: the tokenizer's own tokenization of that string, minus the tail from the first token at
  whose start an allowed token longer than the rest of the string could span its end.

Only `Guide.mask()`, `allowed()`, `advance()`, `is_final()` and `eos_token_ids` are used, never `Guide.forced()`:
a wrong forced spelling in the library cannot hide in the reference.

With `close_within_budget` the reference is the budget-aware one (DESIGN.md): the masks come from the guide counting
the tokens left (`Guide.within(max_new_tokens)`, one token spent per advance); the forced tokens are the
constraint's own (read off the masks without the budget), cut before the first one the budget's mask forbids.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

import fsm


def _gpt2_byte_chars() -> dict[int, str]:
    """GPT-2's printable stand-in for each byte (byte-level BPE pieces are written in these characters)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1), *range(ord("\xae"), ord("\xff") + 1)]
    extra = [b for b in range(256) if b not in keep]
    return {**{b: chr(b) for b in keep}, **{b: chr(256 + i) for i, b in enumerate(extra)}}


@functools.lru_cache(maxsize=8)
def token_bytes(tokenizer, vocab_size: int) -> tuple[bytes, ...]:
    """Each id's bytes, from the tokenizer's pieces: byte-level pieces through GPT-2's byte table, others as UTF-8
    (ids past the tokenizer spell b"")."""
    table = {c: b for b, c in _gpt2_byte_chars().items()}
    pieces = tokenizer.convert_ids_to_tokens(list(range(min(vocab_size, len(tokenizer)))))
    out = [bytes(table[c] for c in p) if all(c in table for c in p) else p.encode() for p in pieces]
    return tuple(out + [b""] * (vocab_size - len(out)))


@functools.lru_cache(maxsize=8)
def _byte_tables(tokenizer, vocab_size: int) -> tuple[np.ndarray, np.ndarray, dict[int, int]]:
    """(first byte of each id or -1, length of each id, byte -> the id that spells it alone)."""
    spelled = token_bytes(tokenizer, vocab_size)
    first = np.array([b[0] if b else -1 for b in spelled], dtype=np.int64)
    length = np.array([len(b) for b in spelled], dtype=np.int64)
    single = {}
    for i, b in enumerate(spelled):
        if len(b) == 1:
            single.setdefault(b[0], i)
    return first, length, single


def _allowed_text_ids(guide: fsm.Guide) -> np.ndarray:
    """Allowed ids at the guide's state, EOS ids left out."""
    mask = guide.mask().clone()
    mask[list(guide.eos_token_ids)] = False
    return np.flatnonzero(mask.numpy())


def forced_string(guide: fsm.Guide, tokenizer) -> bytes:
    """The longest byte string every valid continuation from `guide`'s state starts with, cut to whole UTF-8
    characters: while the state is not final and all allowed tokens start with one byte, that byte is forced."""
    first, _, single = _byte_tables(tokenizer, guide.vocab_size)
    g, out = guide.copy(), bytearray()
    while not g.is_final():
        starts = np.unique(first[_allowed_text_ids(g)])
        if len(starts) != 1 or int(starts[0]) not in single:
            break
        out.append(int(starts[0]))
        g.advance(single[int(starts[0])])
    for end in range(len(out), -1, -1):  # whole characters only
        try:
            bytes(out[:end]).decode("utf-8")
            return bytes(out[:end])
        except UnicodeDecodeError:
            continue
    return b""


def forced_tokens(guide: fsm.Guide, tokenizer) -> list[int]:
    """The coalesced spelling of the forced string: its canonical tokenization, cut before the first token at whose
    start an allowed token is longer than what is left of the string (it could merge with what follows)."""
    text = forced_string(guide, tokenizer)
    if not text:
        return []
    _, length, _ = _byte_tables(tokenizer, guide.vocab_size)
    spelled = token_bytes(tokenizer, guide.vocab_size)
    ids = tokenizer.encode(text.decode("utf-8"), add_special_tokens=False)
    assert b"".join(spelled[i] for i in ids) == text, f"the tokenizer does not spell {text!r} back"
    g, offset = guide.copy(), 0
    for i, token in enumerate(ids):
        allowed = _allowed_text_ids(g)
        if int(length[allowed].max()) > len(text) - offset or token not in set(allowed.tolist()):
            return ids[:i]
        g.advance(token)
        offset += len(spelled[token])
    return ids


def eos_of(model, tokenizer) -> list[int]:
    """EOS ids: the tokenizer's and the model's generation config's."""
    found = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = {tokenizer.eos_token_id, *(found if isinstance(found, (list, tuple)) else [found])}
    return sorted(i for i in ids if i is not None)


def _logits_size(model) -> int:
    """Length of the model's logits: its head's outputs (an int8 head keeps no float weight)."""
    head = model.get_output_embeddings()
    return int(getattr(head, "out_features", None) or head.weight.shape[0])


def make_guide(model, tokenizer, schema=None, regex=None, guide_options=None) -> fsm.Guide | None:
    """The constraint's guide over the model's logits width (None without a constraint)."""
    if schema is None and regex is None:
        return None
    vocab, eos = _logits_size(model), eos_of(model, tokenizer)
    if regex is not None:
        return fsm.Guide.from_regex(regex, tokenizer, vocab_size=vocab, eos_token_ids=eos, **(guide_options or {}))
    return fsm.Guide.from_schema(schema, tokenizer, vocab_size=vocab, eos_token_ids=eos, **(guide_options or {}))


def _only_eos_left(guide: fsm.Guide | None) -> bool:
    """Final and nothing but EOS allowed: the output is complete."""
    return guide is not None and guide.is_final() and len(_allowed_text_ids(guide)) == 0


def _forced_within(guide: fsm.Guide, tokenizer) -> list[int]:
    """The forced tokens of the constraint alone (no budget), up to the first one the guide's mask forbids."""
    walk, out = guide.copy(), []
    for token in forced_tokens(guide.within(None), tokenizer):
        if not walk.mask()[token]:
            break
        walk.advance(token)
        out.append(token)
    return out


@torch.no_grad()
def plain_decode(model, tokenizer, input_ids: list[int], max_new_tokens: int, schema=None, regex=None,
                 coalesce: bool = True, guide_options=None, close_within_budget: bool = False
                 ) -> tuple[list[int], str]:
    """Plain constrained greedy decoding: (new token ids, stop reason "eos" | "final" | "length").

    One full-sequence forward per model-chosen token (no cache); with `coalesce`, forced tokens are appended
    without a forward. EOS is kept in the output and ends it; so does a state where only EOS is allowed.
    """
    guide = make_guide(model, tokenizer, schema, regex, guide_options)
    if close_within_budget:
        guide = guide.within(max_new_tokens)
    eos = set(eos_of(model, tokenizer) if guide is None else guide.eos_token_ids)
    out: list[int] = []
    if _only_eos_left(guide):
        return out, "final"
    while True:
        run = _forced_within(guide, tokenizer) if coalesce and guide is not None else []
        if not run:
            device = next(model.parameters()).device
            logits = model(torch.tensor([list(input_ids) + out], device=device)).logits[0, -1].float()
            if guide is not None:
                logits = logits.masked_fill(~guide.mask().to(device), float("-inf"))
            run = [int(logits.argmax())]
        for token in run:
            out.append(token)
            if token in eos:
                return out, "eos"
            if guide is not None:
                guide.advance(token)
            if _only_eos_left(guide):
                return out, "final"
            if len(out) >= max_new_tokens:
                return out, "length"


@torch.no_grad()
def plain_distribution(model, tokenizer, input_ids: list[int], max_new_tokens: int, probs, regex=None,
                       coalesce: bool = True, close_within_budget: bool = False) -> dict[tuple[int, ...], float]:
    """Exact probability of every whole output of plain constrained sampling (the sampled twin of `plain_decode`).

    `probs(logits (1, V), mask (1, V) | None) -> (1, V)` is the masked, warped next-token distribution. With
    `coalesce`, forced runs are appended with probability 1. Only for tiny vocabularies and short outputs: the
    tree of outputs is walked in full.
    """
    table: dict[tuple[int, ...], float] = {}
    root = make_guide(model, tokenizer, regex=regex)
    if close_within_budget:
        root = root.within(max_new_tokens)
    eos = set(eos_of(model, tokenizer) if root is None else root.eos_token_ids)

    def extend(out: list[int], guide, p: float, run: list[int]) -> None:
        """Append `run` to `out`, then branch on the model's next token until a stop."""
        out, guide = list(out), None if guide is None else guide.copy()
        for token in run:
            out.append(token)
            if token not in eos and guide is not None:
                guide.advance(token)
            if token in eos or _only_eos_left(guide) or len(out) >= max_new_tokens:
                table[tuple(out)] = table.get(tuple(out), 0.0) + p
                return
        forced = _forced_within(guide, tokenizer) if coalesce and guide is not None else []
        if forced:
            return extend(out, guide, p, forced)
        logits = model(torch.tensor([list(input_ids) + out])).logits[0, -1:].float()
        row = probs(logits, None if guide is None else guide.mask()[None])[0]
        for token in torch.nonzero(row > 0).flatten().tolist():
            extend(out, guide, p * float(row[token]), [token])

    if _only_eos_left(root):
        return {(): 1.0}
    extend([], root, 1.0, [])
    return table


"""Reduced output heads for the assistant: logits over a few rows of its LM head, from the decoder's hidden state.

A drafter only has to propose tokens; the target verifies them. So the assistant may draft from any
distribution, as long as `q` (under sampling) is the one it drew from. Two reductions, both exact about
what they compute and lossless by verification:

* a kept vocabulary (`draft_vocab`): the assistant drafts over N frequent token ids (see
  `drafting.ranking`) plus the ids of the prompt, never outside them. Where the guide's mask allows
  nothing among them, that position falls back to the full head, from the same hidden state.
* mask-sparse rows: where the mask allows at most `SPARSE_ROWS` tokens, only those rows are computed
  (the other logits are -inf after the mask anyway); these logits equal the full head's on the allowed ids.

The body runs once per token (`hidden_state`); the head is applied to its last hidden state. Sliced heads
are copies of rows of the assistant's head in its own form (float, or dynamically quantized int8 with the
same scale, so an int8 slice holds exactly the full head's int8 rows); the kept vocabulary's slice is made
once per model and size and cached (`WeakKeyDictionary`).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from torch.ao.nn.quantized.dynamic import Linear as DynamicInt8Linear

from drafting.cache import cache_argument, input_device

SPARSE_ROWS = 1024  # a mask allowing at most this many tokens gets only those rows of the head
NEG_INF = float("-inf")
_SCALING_ATTRIBUTES = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")

_SLICES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {kept ids key: Rows}
_SPARSE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {id(mask): (mask, Rows)}
_SPARSE_KEPT = 256  # mask-sparse slices kept per model (<= 1024 rows each; the guide caches masks: they recur)
_UNPACKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # int8 head -> its (V, H) weight and bias


@dataclass(frozen=True)
class Rows:
    """Some rows of an output head: their token ids and a module mapping (n, H) -> (n, len(ids))."""

    ids: torch.Tensor  # (N,) long, on the head's device
    linear: torch.nn.Module

    def logits(self, hidden: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """(1, H) hidden state -> (1, V) float logits, -inf outside `ids`."""
        small = self.linear(hidden).float()  # (1, N)
        full = torch.full((1, vocab_size), NEG_INF, device=small.device)  # (1, V)
        return full.index_copy_(1, self.ids, small)


def reducible(model) -> str | None:
    """Why `model`'s head cannot be reduced, or None when it can (a plain or int8 Linear right after the body)."""
    head = model.get_output_embeddings()
    if not isinstance(head, (torch.nn.Linear, DynamicInt8Linear)):
        return f"its output head is a {type(head).__name__}, not a Linear or a dynamic int8 Linear"
    config = model.config.get_text_config()
    for name in _SCALING_ATTRIBUTES:
        if getattr(config, name, None) not in (None, 1, 1.0):
            return f"its logits are rescaled after the head ({name})"
    if not hasattr(model, model.base_model_prefix):
        return "its decoder body is not reachable"
    return None


def hidden_state(model, cache, ids: list[int]) -> torch.Tensor:
    """Run `ids` (not yet in `cache`) through the decoder body of `model`; the last hidden state, (1, H)."""
    body = getattr(model, model.base_model_prefix)
    x = torch.tensor([ids], dtype=torch.long, device=input_device(model))  # (1, m)
    out = body(input_ids=x, use_cache=True, **{cache_argument(type(body)): cache})
    return out.last_hidden_state[0, -1:]  # (1, H)


def full_rows(model) -> Rows:
    """The whole head as `Rows` (ids 0..V-1)."""
    head = model.get_output_embeddings()
    size = _weight(head).shape[0]
    return Rows(torch.arange(size, device=_weight(head).device), head)


@dataclass(frozen=True)
class JoinedRows:
    """Disjoint `Rows` computed one after the other: a cached large slice and a small per-call one."""

    parts: tuple[Rows, ...]

    @property
    def ids(self) -> torch.Tensor:
        return torch.cat([part.ids for part in self.parts])  # (N,)

    def logits(self, hidden: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """(1, H) hidden state -> (1, V) float logits, -inf outside the parts' ids."""
        full = self.parts[0].logits(hidden, vocab_size)  # (1, V)
        for part in self.parts[1:]:
            full.index_copy_(1, part.ids, part.linear(hidden).float())
        return full


def cached_rows(model, ids: torch.Tensor) -> Rows:
    """The head's rows `ids` ((N,) long), sliced once per model and id set and kept while the model lives."""
    per_model = _SLICES.setdefault(model, {})
    key = (ids.numel(), hash(ids.cpu().numpy().tobytes()))
    if key not in per_model:
        per_model[key] = slice_rows(model, ids)
    return per_model[key]


def kept_rows(model, top: torch.Tensor, extra: torch.Tensor, vocab_size: int) -> Rows | JoinedRows:
    """The cached slice `top` and a fresh slice of the `extra` ids not in it (e.g. the prompt's tokens)."""
    top_rows = cached_rows(model, top)
    extra = extra[~_membership(top, vocab_size)[extra]].unique()  # (e,)
    return top_rows if extra.numel() == 0 else JoinedRows((top_rows, slice_rows(model, extra)))


def slice_rows(model, ids: torch.Tensor) -> Rows:
    """A fresh copy of the head's rows `ids` ((N,) long), in the head's own form (float or int8)."""
    head = model.get_output_embeddings()
    weight, bias = _weight_bias(head)
    ids = ids.to(weight.device)
    bias = None if bias is None else bias.index_select(0, ids)
    if isinstance(head, DynamicInt8Linear):
        linear = DynamicInt8Linear(weight.shape[1], ids.numel(), dtype=torch.qint8)
        linear.set_weight_bias(weight.index_select(0, ids), bias)  # the same int8 values and scale
    else:
        linear = torch.nn.Linear(weight.shape[1], ids.numel(), bias=bias is not None, device=weight.device,
                                 dtype=weight.dtype)
        with torch.no_grad():
            linear.weight.copy_(weight.index_select(0, ids))
            if bias is not None:
                linear.bias.copy_(bias)
    return Rows(ids, linear.eval())


class DraftHead:
    """Chooses, per guide mask, which rows of the assistant's head to compute; see the module docstring.

    `top` ((N,) long ids, or None for the whole vocabulary) and `extra` (e.g. the prompt's ids) are where
    the assistant drafts when it can; `sparse` enables the mask-sparse rows. Choices are made on the guide's CPU mask and
    remembered per mask object (the guide caches one mask per state), so a step costs no host sync.
    """

    def __init__(self, model, vocab_size: int, top: torch.Tensor | None, extra: torch.Tensor | None = None,
                 sparse: bool = True):
        self.model, self.vocab_size, self.sparse = model, vocab_size, sparse
        self.full = full_rows(model)
        extra = torch.zeros(0, dtype=torch.long) if extra is None else extra.long().cpu()
        self.kept = None if top is None else kept_rows(model, top.long().cpu(), extra, vocab_size)
        self.in_kept = None if self.kept is None else _membership(self.kept.ids.cpu(), vocab_size)  # (V,) bool
        self._choices: dict[int, tuple[torch.Tensor, Rows]] = {}
        self.fallbacks, self.sparse_steps = 0, 0  # positions that used the full head / mask-sparse rows

    def rows(self, mask: torch.Tensor | None) -> Rows:
        """The rows to compute under `mask` ((V,) bool on CPU, or None)."""
        if mask is None:
            return self.full if self.kept is None else self.kept
        if id(mask) not in self._choices:
            self._choices[id(mask)] = (mask, self._choose(mask))
        rows = self._choices[id(mask)][1]
        self.fallbacks += rows is self.full and self.kept is not None
        self.sparse_steps += rows is not self.full and rows is not self.kept
        return rows

    def logits(self, hidden: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """(1, H) hidden state -> (1, V) float logits (-inf on the rows not computed)."""
        rows = self.rows(mask)
        return rows.logits(hidden, self.vocab_size)

    def _choose(self, mask: torch.Tensor) -> Rows:
        allowed = mask.nonzero().squeeze(-1)  # (a,) once per mask object
        if self.sparse and 0 < allowed.numel() <= SPARSE_ROWS:
            return self._sparse_rows(mask, allowed)
        if self.kept is None or not bool((mask & self.in_kept).any()):
            return self.full  # no allowed token among the kept ones: draft from the full head
        return self.kept

    def _sparse_rows(self, mask: torch.Tensor, allowed: torch.Tensor) -> Rows:
        """The rows `allowed` of `mask`, sliced once per model and mask object (kept while the model lives)."""
        per_model = _SPARSE.setdefault(self.model, {})
        if id(mask) not in per_model:
            if len(per_model) >= _SPARSE_KEPT:
                per_model.clear()
            per_model[id(mask)] = (mask, slice_rows(self.model, allowed))  # the mask kept: its id stays unique
        return per_model[id(mask)][1]


def _membership(ids: torch.Tensor, size: int) -> torch.Tensor:
    """(size,) bool, True at `ids`."""
    member = torch.zeros(size, dtype=torch.bool)  # (size,)
    member[ids.cpu()] = True
    return member


def _weight(head) -> torch.Tensor:
    """The head's weight: float (V, H), or the int8 quantized (V, H) of a dynamic int8 Linear."""
    return _weight_bias(head)[0]


def _weight_bias(head) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The head's weight and bias; an int8 head's unpacked copy.

    Unpacking an int8 head copies all of it (~0.9 s for Qwen's 151,936 x 896 on one thread): done once per head
    and kept while the head lives.
    """
    if not isinstance(head, DynamicInt8Linear):
        return head.weight.detach(), None if head.bias is None else head.bias.detach()
    if head not in _UNPACKED:
        _UNPACKED[head] = head._weight_bias()
    return _UNPACKED[head]

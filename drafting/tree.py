"""Draft trees: the chain draft plus one side branch where the assistant is unsure.

The tree is the usual chain of k draft tokens plus one leaf, `Branch.token`, a sibling of chain token
`at`: the assistant's runner-up there (greedy: its second choice; sampling: a second draw from the same q
row without replacement). The target verifies the chain and the leaf in one forward: the leaf sees the
committed tokens and chain[:at] (an additive 4D attention mask) and sits at the position of chain token
`at` (explicit `position_ids`). After acceptance, a taken leaf's key/value entries are moved to the
position it was committed at, and the cache is cropped as after a chain step.

Where to branch must not depend on the token drawn there (or the accepted tokens would lean towards likely
ones): the branch goes at the first assistant token whose confidence (a function of the distribution only,
which depends on chain[:at] only) is below `threshold`. For the same reason the leaf's own confidence, by
which `assisted.policy.auto` prices it, is the max of the assistant's distribution without chain token `at`: greedy,
the runner-up's share of what the chain token leaves; sampling, a function of q and the chain token only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache

from drafting.base import Cursor, Draft
from drafting.kv_cache import cache_argument, input_device
from drafting.sampling import NEG_INF, confidence, sample
from structspec_ops.attention import MASKED_ATTENTIONS

BRANCH_BELOW = 0.8  # default: branch at the first assistant token whose confidence is below this


@dataclass(frozen=True)
class Branch:
    """One extra leaf of the draft tree: an alternative to chain token `at`."""

    at: int  # chain index of the sibling token (an assistant token)
    token: int  # the alternative token
    mask_after: torch.Tensor | None  # (V,) bool on the target's device: the guide state after chain[:at] + token
    bonus: bool  # whether the target's token after the leaf may be committed (not after EOS or a forced run)
    confidence: float  # max of the assistant's distribution at `at` without chain token `at`, renormalized


def branch_position(draft: Draft, threshold: float) -> int | None:
    """The first assistant token whose confidence is below `threshold` (None: no branch)."""
    return next((i for i, (s, c) in enumerate(zip(draft.sources, draft.confidence))
                 if s == "assistant" and c < threshold), None)


def runner_up(logits: torch.Tensor, q: torch.Tensor | None, token: int, generator) -> tuple[int, float] | None:
    """The alternative to `token` and the assistant's confidence among the rest; None when `token` was the only
    possible one.

    The alternative is the second draw from `q` without replacement when sampling, else the second largest of
    the masked `logits` (1, V). The confidence is the max of softmax(logits) without `token`, renormalized
    (temperature 1, like `Draft.confidence`): it never depends on the alternative drawn.
    """
    rest = logits.float().clone()  # (1, V)
    rest[0, token] = NEG_INF
    if q is not None:
        weights = q.clone()  # (1, V)
        weights[0, token] = 0.0
        possible = weights.sum() > 0
        choice = sample(torch.where(possible, weights, q), generator)  # (1,): a draw either way, one sync below
    else:
        possible, choice = rest.max() > NEG_INF, rest.argmax(-1)
    alt, ok, sure = torch.cat([choice.double(), possible.double()[None], confidence(rest).double()]).tolist()
    return (int(alt), sure) if ok else None


def grow_branch(draft: Draft, cursor: Cursor, coalesce: bool, generator, to_target=None,
                threshold: float = BRANCH_BELOW) -> Branch | None:
    """The branch of `draft` from the committed guide state `cursor` (not advanced), or None.

    The runner-up comes from the assistant's masked logits at `at` (`draft.logits`), or from its q row and
    `generator` (the assistant's) when sampling. `to_target` copies the leaf's mask to the target's device.
    """
    at = branch_position(draft, threshold)
    if at is None:
        return None
    q = None if draft.q is None else draft.q[at : at + 1]  # (1, V)
    found = runner_up(draft.logits[at], q, draft.tokens[at], generator)
    if found is None:
        return None
    alt, sure = found
    cursor = cursor.copy()
    for token in draft.tokens[:at]:
        cursor.advance(token)
    ends = alt in cursor.eos
    if not ends:
        cursor.advance(alt)
    mask = None if draft.masks is None else draft.masks[at] if ends else cursor.mask()
    mask = mask if to_target is None else to_target(mask)
    forced_next = coalesce and bool(cursor.forced())  # coalescence appends those, not the target's choice
    return Branch(at, alt, mask, not ends and not forced_next and not cursor.only_eos_left(), sure)


def check_tree_attention(model) -> None:
    """Raise ValueError unless `model`'s attention applies a custom 4D mask (flash kernels would ignore it)."""
    attention = getattr(model.config, "_attn_implementation", None)
    if attention not in MASKED_ATTENTIONS:
        raise ValueError(f"tree=True needs attn_implementation in {MASKED_ATTENTIONS}, the target has {attention!r}")


def tree_attention(past: int, length: int, hidden: range, dtype: torch.dtype, device) -> torch.Tensor:
    """Additive mask (1, 1, length, past + length): causal, except that the last query (the leaf) does not
    see the query positions in `hidden` (the chain from its sibling on)."""
    low = torch.finfo(dtype).min
    mask = torch.full((length, past + length), low, dtype=dtype, device=device).triu(past + 1)
    mask[-1, past + hidden.start : past + hidden.stop] = low
    return mask[None, None]


def tree_forward(model, cache: DynamicCache, seq_len: int, ids: list[int], branch: Branch) -> torch.Tensor:
    """One target forward over `ids` = [uncached committed tokens, *chain, leaf] with the leaf at its depth.

    Returns the logits of the chain's k+1 rows and the leaf's row, (k+2, V).
    """
    device, past = input_device(model), cache.get_seq_length()
    chain_start = seq_len - past  # query index of chain[0]
    k = len(ids) - chain_start - 1
    dtype = model.get_input_embeddings().weight.dtype
    dtype = dtype if dtype.is_floating_point else torch.float32
    mask = tree_attention(past, len(ids), range(chain_start + branch.at, chain_start + k), dtype, device)
    positions = torch.arange(past, past + len(ids), device=device)
    positions[-1] = seq_len + branch.at
    x = torch.tensor([ids], dtype=torch.long, device=device)  # (1, m)
    out = model(input_ids=x, attention_mask=mask, position_ids=positions[None], use_cache=True, logits_to_keep=k + 2,
                **{cache_argument(type(model)): cache})
    return out.logits[0, -(k + 2):]


def move_leaf(cache: DynamicCache, source: int, target: int) -> None:
    """Copy the cached keys and values at position `source` to `target`, in every layer (crop afterwards)."""
    for layer in cache.layers:
        layer.keys[..., target, :] = layer.keys[..., source, :]
        layer.values[..., target, :] = layer.values[..., source, :]

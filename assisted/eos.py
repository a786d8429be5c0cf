"""Which token ids end the output: the one place that decides it, for `generate`, the loaders and the
logits processor."""

from __future__ import annotations

import numbers

EXTRA_EOS_TOKENS = ("<|im_end|>", "<|endoftext|>")  # chat turn enders (Qwen's) that end an answer too


def eos_ids(model, tokenizer, eos_token_id=None, *, turn_enders: bool = False, name: str = "eos_token_id"
            ) -> frozenset[int]:
    """EOS ids: `eos_token_id` where the caller sets one, else the tokenizer's and `model`'s generation config's.

    Parameters
    ----------
    model : transformers model or None
        Its ``generation_config.eos_token_id`` (int or list) joins the tokenizer's EOS.
    tokenizer : transformers tokenizer
    eos_token_id : int or sequence of int, optional
        Overrides both; must be non-negative ints (ValueError naming `name` otherwise).
    turn_enders : bool
        Also the chat turn enders in `EXTRA_EOS_TOKENS` that the vocabulary has (what the loaders make every
        model stop on).

    Returns
    -------
    frozenset of int
        Empty only when neither the tokenizer nor the model has an EOS and none was given.
    """
    if eos_token_id is not None:
        return _checked(eos_token_id, name)
    ids = {tokenizer.eos_token_id}
    found = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids.update(found if isinstance(found, (list, tuple)) else [found])
    if turn_enders:
        vocab = tokenizer.get_vocab()
        ids.update(vocab[t] for t in EXTRA_EOS_TOKENS if t in vocab)
    return frozenset(i for i in ids if i is not None)


def _checked(eos_token_id, name: str) -> frozenset[int]:
    """A caller's EOS: an int or a non-empty list of non-negative ints."""
    found = list(eos_token_id) if isinstance(eos_token_id, (list, tuple)) else [eos_token_id]
    if not found or not all(isinstance(i, numbers.Integral) and not isinstance(i, bool) and i >= 0 for i in found):
        raise ValueError(f"{name} must be a non-negative int or a list of them, got {eos_token_id!r}")
    return frozenset(int(i) for i in found)

"""Pairs of models with different tokenizers for the foreign-assistant tests.

`permuted(model, tokenizer)` is the same text model behind another vocabulary: the ids of every non-special token
shuffled, in the tokenizer and in the model's embedding and head rows. As an assistant it writes exactly the target's
greedy text, yet none of its ids means what the target's does: a foreign assistant whose drafts should be accepted
wherever the target's own choice is its tokenizer's spelling of the text.
"""

from __future__ import annotations

import copy
import functools
import json

import torch

CHARS = ["<eos>", "a", "b", "c", "d"]  # id 0 is EOS


@functools.lru_cache(maxsize=1)
def char_tokenizer():
    """A 5-token tokenizer without merges (EOS, a b c d): every text has one spelling."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE(vocab={w: i for i, w in enumerate(CHARS)}, merges=[], unk_token=None))
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>")


def permuted(model, tokenizer, seed: int = 0):
    """(model copy, tokenizer) with the non-special ids shuffled by `seed`; special tokens keep their ids."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    special = {t["id"] for t in spec["added_tokens"]}
    ids = sorted(i for i in spec["model"]["vocab"].values() if i not in special)
    order = torch.randperm(len(ids), generator=torch.Generator().manual_seed(seed)).tolist()
    new_of = {old: ids[j] for old, j in zip(ids, order)}
    spec["model"]["vocab"] = {piece: new_of.get(i, i) for piece, i in spec["model"]["vocab"].items()}
    names = {k: getattr(tokenizer, k) for k in ("bos_token", "eos_token", "unk_token", "pad_token")}
    shuffled = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(spec)),
                                       **{k: v for k, v in names.items() if v is not None})
    shuffled.chat_template = tokenizer.chat_template
    return _permuted_model(model, new_of), shuffled


@torch.no_grad()
def _permuted_model(model, new_of: dict[int, int]):
    """A copy whose embedding row and head row `new_of[i]` are the original's row i."""
    helper = copy.deepcopy(model)
    rows = torch.arange(helper.get_input_embeddings().weight.shape[0])
    source = rows.clone()
    source[list(new_of.values())] = torch.tensor(list(new_of.keys()))  # new row -> the old row it takes
    embedding, head = helper.get_input_embeddings(), helper.get_output_embeddings()
    tied = head.weight.data_ptr() == embedding.weight.data_ptr()
    embedding.weight.copy_(embedding.weight[source])
    if not tied:
        head.weight.copy_(head.weight[source])
    if getattr(head, "bias", None) is not None:
        head.bias.copy_(head.bias[source])
    return helper

"""drafting.masked_head: under the guide's masks a 4-bit or Q6_K head computes only the blocks of columns they
allow; the masked logits, and so every output, are the same."""

from __future__ import annotations

import pytest
import torch

from assisted import generate
from assisted.models.int4_linear import Int4Linear
from assisted.models.int4_models import quantize_int4
from drafting import masked_head
from drafting.masked_head import allowed_blocks, only_allowed
from assisted.models.q6k_linear import Q6KLinear
from structspec_ops import int4
from tests.assisted.test_int8 import SCHEMA
from tests.helpers_models import tiny_llama

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.skipif(not int4.built().ok, reason=f"int4 kernel unavailable: {int4.built().reason}")]


@pytest.mark.parametrize("make", [Q6KLinear.quantized, Int4Linear.quantized], ids=["q6k", "int4"])
def test_the_chosen_blocks_are_bitwise_the_full_heads_and_the_rest_is_minus_infinity(make):
    torch.manual_seed(0)
    head = make(torch.nn.Linear(256, 100))  # 7 blocks of 16, the last of 4 columns
    x = torch.randn(3, 256)
    full = head(x)
    head.only_blocks = torch.tensor([6, 1])
    part = head(x)
    head.only_blocks = None
    kept = torch.zeros(100, dtype=torch.bool)
    kept[16:32] = kept[96:] = True
    assert part.shape == full.shape and torch.equal(part[:, kept], full[:, kept])
    assert torch.isneginf(part[:, ~kept]).all()


def test_the_blocks_are_those_any_row_allows_unless_they_are_most_of_the_head():
    masks = torch.zeros(2, 100, dtype=torch.bool)
    masks[0, 17] = masks[1, 99] = True  # blocks 1 and 6
    assert allowed_blocks([masks], 100).tolist() == [1, 6]
    assert allowed_blocks([masks[:1], masks[1:]], 100).tolist() == [1, 6]  # rows of several forwards' rows
    masks[0, :64] = True  # blocks 0-3 and 6 of 7: more than half
    assert allowed_blocks([masks], 100) is None


def test_only_allowed_sets_the_head_inside_and_clears_it_after():
    model = quantize_int4(tiny_llama(300, seed=0, hidden=256))
    assert isinstance(model.lm_head, Q6KLinear)
    masks = torch.zeros(1, 300, dtype=torch.bool)
    masks[0, 5] = True
    with only_allowed(model, [masks]):
        assert model.lm_head.only_blocks.tolist() == [0]
    assert model.lm_head.only_blocks is None
    with only_allowed(model, None):  # unconstrained, or read by logits processors: the whole head
        assert model.lm_head.only_blocks is None
    float_model = tiny_llama(300, seed=0, hidden=64)
    with only_allowed(float_model, [masks]):  # a float head: untouched
        assert not hasattr(float_model.lm_head, "only_blocks")


@pytest.mark.parametrize("penalty", [None, 1.3])
def test_a_schema_over_an_int4_target_decodes_the_same_with_a_narrowed_head(smol_tokenizer, monkeypatch, penalty,
                                                                            plain_reference):
    target = quantize_int4(tiny_llama(len(smol_tokenizer), seed=3, layers=2, hidden=256, init=0.2))
    assert isinstance(target.lm_head, Q6KLinear)
    options = dict(tokenizer=smol_tokenizer, prompt="Once upon a time", max_new_tokens=24, schema=SCHEMA,
                   repetition_penalty=penalty)
    narrowed = []
    kernel = Q6KLinear.kernel

    def spy(x, layout, bias, blocks=None):
        narrowed.append(blocks is not None)
        return kernel(x, layout, bias, blocks)

    monkeypatch.setattr(Q6KLinear, "kernel", staticmethod(spy))
    out = generate(target, **options)
    assert any(narrowed) != (penalty is not None)  # a processor reads the logits before the mask: the whole head
    if penalty is None:  # the independent plain loop (full logits, masked) agrees
        assert plain_reference(target, **options).token_ids == out.token_ids
    monkeypatch.setattr(masked_head, "FULL_SHARE", -1.0)  # never narrowed
    narrowed.clear()
    assert generate(target, **options).token_ids == out.token_ids and not any(narrowed)

"""Random-weight models with the published architectures of the project's real models, for device checks.

Weights cannot travel to a lent GPU, configs can: timing a forward needs the architecture, not trained weights.
`build` makes Qwen2.5-Coder-1.5B (the target), Qwen2.5-Coder-0.5B (the assistant) or SmolLM2-135M from their
configs with seeded random weights, directly on the device. Random heads give nearly flat next-token
distributions (logit spread ~0.8 over 152k ids), so no draft would pass transformers' 0.4 confidence stop:
`head_scale` multiplies the output head to give them a trained model's peaks. `smoke` shrinks every model to
two tiny layers (the vocabulary stays), so the same code runs on a CPU in seconds.
"""

from __future__ import annotations

import torch

ARCHITECTURES = {  # the published configs (hub config.json) of the models in ../shared/MODELS.md
    "qwen2.5-coder-1.5b": dict(model_type="qwen2", hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                               num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=32768,
                               rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=False),
    "qwen2.5-coder-0.5b": dict(model_type="qwen2", hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                               num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                               rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True),
    "smollm2-135m": dict(model_type="llama", hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                         rope_theta=1e5, rms_norm_eps=1e-5, tie_word_embeddings=True),
}
SMOKE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def build(name: str, tokenizer, *, device: str, dtype: str = "bfloat16", seed: int = 0, head_scale: float = 1.0,
          smoke: bool = False):
    """A random model of architecture `name` over `tokenizer`'s ids, in eval mode on `device`.

    EOS is the tokenizer's, and its head rows are zeroed (logit 0, never the argmax of a peaked head), so every
    greedy run writes its whole budget and runs compare over the same number of tokens.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = {**ARCHITECTURES[name], **(SMOKE if smoke else {})}
    model_type = spec.pop("model_type")
    eos = tokenizer.eos_token_id
    config = AutoConfig.for_model(model_type, vocab_size=len(tokenizer), bos_token_id=eos, eos_token_id=eos,
                                  pad_token_id=eos, **spec)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=DTYPES[dtype]).eval()
    with torch.no_grad():
        head = model.get_output_embeddings().weight
        if model.config.tie_word_embeddings:  # scale a copy: the input embeddings stay as initialized
            model.get_output_embeddings().weight = torch.nn.Parameter(head.detach().clone())
            head = model.get_output_embeddings().weight
        head.mul_(head_scale)
        head[eos] = 0
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = eos
    return model


def random_prompt(tokenizer, length: int, seed: int) -> list[int]:
    """`length` ids drawn uniformly from the tokenizer's ordinary tokens (special ids excluded)."""
    special = set(tokenizer.all_special_ids)
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, len(tokenizer), (4 * length,), generator=generator).tolist()
    return [i for i in ids if i not in special][:length]

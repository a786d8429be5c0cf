"""Probe: is a lean one-row decode step (a few torch calls per layer) faster than transformers' module calls?

    python -m experiments.lean_step --model smollm2-135m --threads 1 --steps 40 --rounds 5

For a Llama-family model (Llama, Qwen2, SmolLM2: RMSNorm, rotary, grouped-query attention, SiLU-gated MLP), one
decode step written as plain torch calls over the model's own float weights (q/k/v and gate/up fused into one
matmul each, the KV cache preallocated and written in place, `scaled_dot_product_attention` over the filled
prefix) against transformers' eager forward with a `DynamicCache`, on the same prompt and the same greedy tokens.
Both decode `--steps` tokens after the prompt; the two alternate `--rounds` times (interleaved, on one machine).
It reports ms per step for each, and how far the lean logits are from transformers' (max abs difference and
whether they are bitwise equal). A probe only: nothing in the library uses it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

FAMILIES = ("LlamaForCausalLM", "Qwen2ForCausalLM")


class LeanDecoder:
    """One-row greedy decoding of a Llama-family model as plain torch calls over its weights."""

    def __init__(self, model, capacity: int, fuse: bool = True):
        if type(model).__name__ not in FAMILIES:
            raise ValueError(f"lean step knows {FAMILIES}, not {type(model).__name__}")
        config, inner = model.config, model.model
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.embed = inner.embed_tokens.weight
        self.norm_w, self.eps = inner.norm.weight, inner.norm.variance_epsilon
        self.head_w = model.get_output_embeddings().weight
        self.layers, self.fuse = [], fuse
        for layer in inner.layers:
            att, mlp = layer.self_attn, layer.mlp
            qkv = [att.q_proj.weight, att.k_proj.weight, att.v_proj.weight]
            biases = [att.q_proj.bias, att.k_proj.bias, att.v_proj.bias]
            qkv_w = torch.cat(qkv).contiguous() if fuse else qkv
            qkv_b = None if biases[0] is None else (torch.cat(biases) if fuse else biases)
            gate_up = [mlp.gate_proj.weight, mlp.up_proj.weight]
            gate_up = torch.cat(gate_up).contiguous() if fuse else gate_up
            self.layers.append((layer.input_layernorm.weight, qkv_w, qkv_b, att.o_proj.weight,
                                layer.post_attention_layernorm.weight, gate_up, mlp.down_proj.weight))
        shape = (1, self.kv_heads, capacity, self.dim)
        self.keys = [torch.zeros(shape) for _ in self.layers]
        self.values = [torch.zeros(shape) for _ in self.layers]
        rotary = inner.rotary_emb
        freqs = torch.outer(torch.arange(capacity, dtype=torch.float32), rotary.inv_freq.float())  # (cap, d/2)
        angles = torch.cat([freqs, freqs], -1)  # (cap, d)
        self.cos, self.sin = angles.cos() * rotary.attention_scaling, angles.sin() * rotary.attention_scaling
        self.length = 0

    def _norm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))

    def _linears(self, x: torch.Tensor, w, b) -> torch.Tensor:
        """One matmul over fused weights, or one per weight (as the modules run them), concatenated."""
        if self.fuse:
            return F.linear(x, w, b)
        return torch.cat([F.linear(x, wi, None if b is None else b[i]) for i, wi in enumerate(w)], -1)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin

    def step(self, token: int) -> torch.Tensor:
        """Logits (V,) after feeding `token` at the next position."""
        pos, h, kv = self.length, self.heads, self.kv_heads
        x = self.embed[token][None]  # (1, H)
        cos, sin = self.cos[pos], self.sin[pos]  # (d,)
        q_end, k_end = h * self.dim, (h + kv) * self.dim
        for (w_in, qkv_w, qkv_b, o_w, w_post, gu_w, down_w), keys, values in zip(self.layers, self.keys, self.values):
            qkv = self._linears(self._norm(x, w_in), qkv_w, qkv_b)  # (1, (h + 2 kv) d)
            q = self._rotate(qkv[:, :q_end].view(1, h, 1, self.dim), cos, sin)
            keys[:, :, pos] = self._rotate(qkv[:, q_end:k_end].view(1, kv, self.dim), cos, sin)
            values[:, :, pos] = qkv[:, k_end:].view(1, kv, self.dim)
            a = F.scaled_dot_product_attention(q, keys[:, :, : pos + 1], values[:, :, : pos + 1], enable_gqa=True)
            x = x + F.linear(a.reshape(1, h * self.dim), o_w)
            gate, up = self._linears(self._norm(x, w_post), gu_w, None).chunk(2, -1)
            x = x + F.linear(F.silu(gate) * up, down_w)
        self.length += 1
        return F.linear(self._norm(x, self.norm_w), self.head_w)[0]


@torch.inference_mode()
def run_lean(model, prompt: list[int], steps: int, fuse: bool = True
             ) -> tuple[list[float], list[int], list[torch.Tensor]]:
    lean = LeanDecoder(model, len(prompt) + steps + 1, fuse)
    for t in prompt[:-1]:
        lean.step(t)
    token, seconds, out, logits = prompt[-1], [], [], []
    for _ in range(steps):
        start = time.perf_counter()
        row = lean.step(token)
        token = int(row.argmax())
        seconds.append(time.perf_counter() - start)
        out.append(token)
        logits.append(row)
    return seconds, out, logits


@torch.inference_mode()
def run_eager(model, prompt: list[int], steps: int) -> tuple[list[float], list[int], list[torch.Tensor]]:
    from drafting.kv_cache import forward, new_cache
    cache = new_cache()
    for t in prompt[:-1]:  # one position at a time, as the lean decoder prefills: a float model is not row-invariant
        forward(model, cache, [t], 1)
    token, seconds, out, logits = prompt[-1], [], [], []
    for _ in range(steps):
        start = time.perf_counter()
        row = forward(model, cache, [token], 1)[0]
        token = int(row.argmax())
        seconds.append(time.perf_counter() - start)
        out.append(token)
        logits.append(row)
    return seconds, out, logits


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.lean_step", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--prompt", default="Write a JSON object describing a hero with a name and an age:")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    from assisted.models.loading import load_model, load_tokenizer
    model, tok = load_model(args.model), load_tokenizer(args.model)
    prompt = tok(args.prompt)["input_ids"]
    runs = {"eager": run_eager, "lean-fused": run_lean,
            "lean-unfused": lambda m, ids, n: run_lean(m, ids, n, fuse=False)}
    times, outputs = {name: [] for name in runs}, {}
    for r in range(args.rounds):
        for name in list(runs)[r % len(runs):] + list(runs)[: r % len(runs)]:  # rotated each round
            seconds, out, logits = runs[name](model, prompt, args.steps)
            times[name] += seconds[2:]  # the first steps warm up
            outputs[name] = (out, logits)
    print(f"{args.model}, {args.threads} thread(s), {args.steps} steps x {args.rounds} rounds, interleaved")
    for name, t in times.items():
        print(f"{name:12} ms per step: median {1e3 * statistics.median(t):.2f}, "
              f"p10 {1e3 * statistics.quantiles(t, n=10)[0]:.2f}, p90 {1e3 * statistics.quantiles(t, n=10)[-1]:.2f}")
    eager_out, eager_logits = outputs["eager"]
    for name in ("lean-fused", "lean-unfused"):
        out, logits = outputs[name]
        same = next((i for i, (a, b) in enumerate(zip(eager_out, out)) if a != b), len(eager_out))
        diff = max(float((a - b).abs().max()) for a, b in zip(eager_logits[:same], logits[:same]))
        bitwise = all(torch.equal(a, b) for a, b in zip(eager_logits[:same], logits[:same]))
        print(f"{name}: greedy tokens equal for {same} of {args.steps} steps; logits max abs diff {diff:.3g} from "
              f"eager, bitwise {bitwise}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

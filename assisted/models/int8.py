"""Row-invariant int8 models for the CPU: exactly lossless speculation over a quantized target.

Verification scores k + 1 positions in one forward and is lossless only if each position's logits are those a
one-token decoding step computes for it (docs/design.md, section 1, "Row invariance"). Two things break that in an
int8 model, and this module removes both:

- **Activation ranges.** fbgemm's dynamic int8 kernel (`torch.ops.quantized.linear_dynamic`) quantizes its whole
  input with one range, so a row's codes depend on its neighbours. `Int8Linear` divides each row by its own
  max-abs value and appends two constant columns, +1 and -1, whose weights are zero: every call's range is then
  exactly [-1, 1], each row is quantized on its own, the int32 products are exact, and the output is scaled back
  per row. A row's output is bitwise the same whatever rows share the call.
- **Attention reductions.** A float rounding difference in attention can flip an activation across a
  quantization step, and the layers amplify it. `quantize_int8` sets the model's attention to
  `structspec_ops.attention.row_invariant_attention` (``"row_invariant"``): one C++ call computes every query row
  against its own keys in one fixed order, the same in a prefill, a batch or a one-position step.

Norms, rotary embeddings and activations work row by row already; the bitwise tests
(`tests/assisted/test_int8.py`) check the whole forward: n positions at once against n single steps, and a row
of a batch against the row alone.

    from assisted.models.int8 import quantize_int8
    quantize_int8(model)  # in place: every Linear (the head included) int8, attention "row_invariant"
"""

from __future__ import annotations

import copy
import warnings

import torch
from transformers.pytorch_utils import Conv1D

from structspec_ops.attention import ATTENTION, MASKED_ATTENTIONS, built

_ENDS = torch.tensor([[1.0, -1.0]])  # (1, 2): the constant columns that pin every call's range to [-1, 1]


class Int8Linear(torch.nn.Module):
    """(..., in) -> (..., out): per-channel int8 weights, per-row int8 activations (fbgemm, CPU).

    The weight keeps one symmetric scale per output channel; each input row is scaled to [-1, 1] by its own
    max-abs value before the kernel quantizes it, so each row's output depends on that row alone.
    """

    def __init__(self, linear: torch.nn.Linear, reduce_range: bool = False):
        super().__init__()
        self._set(quantize_weight(linear.weight), linear.bias, reduce_range)

    @classmethod
    def from_codes(cls, codes: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None,
                   reduce_range: bool = False) -> Int8Linear:
        """The module whose weight is `quantize_weight`'s (codes, scales), e.g. made a few rows at a time or read
        back from a cache: bitwise the module ``Int8Linear(linear)`` makes of that weight."""
        module = cls.__new__(cls)
        torch.nn.Module.__init__(module)
        module._set(_per_channel(codes, scales), bias, reduce_range)
        return module

    def _set(self, codes: torch.Tensor, bias: torch.Tensor | None, reduce_range: bool) -> None:
        self._packed = torch.ops.quantized.linear_prepack(codes, None)
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())
        self.out_features, self.in_features = codes.shape[0], codes.shape[1] - 2
        self.reduce_range = reduce_range

    def codes(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(out, in + 2) int8 codes and (out,) float64 scales: the weight as `from_codes` takes it."""
        weight, _ = torch.ops.quantized.linear_unpack(self._packed)
        return weight.int_repr(), weight.q_per_channel_scales()

    @torch.no_grad()  # an inference kernel: fbgemm's int8 op has no gradient
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).float()  # (n, in)
        scale = torch.linalg.vector_norm(rows, float("inf"), dim=1, keepdim=True).clamp_min_(1e-30)  # (n, 1)
        pinned = rows.new_empty(rows.shape[0], self.in_features + 2)  # (n, in + 2), every row's range [-1, 1]
        torch.div(rows, scale, out=pinned[:, : self.in_features])
        pinned[:, self.in_features :] = _ENDS
        y = torch.ops.quantized.linear_dynamic(pinned, self._packed, self.reduce_range).mul_(scale)  # (n, out)
        if self.bias is not None:
            y = y.add_(self.bias)
        return y.to(x.dtype).view(*x.shape[:-1], self.out_features)

    def dequantized(self) -> torch.Tensor:
        """(out, in) float32: the weight this module multiplies by (for tests and reports)."""
        weight, _ = torch.ops.quantized.linear_unpack(self._packed)
        return weight.dequantize()[:, : self.in_features]

    def __deepcopy__(self, memo):
        clone = torch.nn.Linear(self.in_features, self.out_features, bias=self.bias is not None)
        clone.weight.data = self.dequantized()
        if self.bias is not None:
            clone.bias.data = self.bias.clone()
        return Int8Linear(clone, self.reduce_range)


def quantize_weight(weight: torch.Tensor) -> torch.Tensor:
    """(out, in) float -> (out, in + 2) per-channel qint8: one symmetric scale per row, two zero end columns. Each
    row's codes depend on that row alone, so a weight quantized a few rows at a time gives the same codes."""
    weight = weight.detach().float()  # (out, in)
    out_features = weight.shape[0]
    scale = (weight.abs().amax(dim=1) / 127).clamp_min(1e-12).double()  # (out,)
    padded = torch.cat([weight, weight.new_zeros(out_features, 2)], dim=1)  # (out, in + 2): zero end columns
    with warnings.catch_warnings():  # quantized tensors are deprecated in favour of torchao, not installed here
        warnings.simplefilter("ignore")
        return torch.quantize_per_channel(padded, scale, torch.zeros(out_features, dtype=torch.long), 0, torch.qint8)


def _per_channel(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """(out, in + 2) int8 codes and (out,) scales -> the per-channel qint8 tensor `quantize_weight` makes."""
    zero = torch.zeros(codes.shape[0], dtype=torch.long)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch._make_per_channel_quantized_tensor(codes.contiguous(), scales.double(), zero, 0)


def check_engine() -> None:
    """Raise ValueError if this torch build has no fbgemm engine (int8 models need an x86 CPU build)."""
    if "fbgemm" not in torch.backends.quantized.supported_engines:
        raise ValueError("this torch build has no fbgemm quantized engine (int8 models need an x86 CPU build of torch)")


def check_attention(model_class: type, attention: str | None = None) -> None:
    """Raise ValueError unless `model_class` calls attention through transformers' `AttentionInterface` with a
    standard (sdpa / eager) mask, so that `row_invariant_attention` can replace its attention."""
    if not getattr(model_class, "is_backend_compatible", lambda: False)():
        raise ValueError(f"{model_class.__name__} does not use transformers' attention interface, so its attention "
                         "cannot be made row-invariant (int8 needs a causal LM with the standard interface)")
    if attention is not None and attention not in MASKED_ATTENTIONS:
        raise ValueError(f"a row-invariant int8 model needs sdpa or eager attention to replace, not {attention!r}")


def check_quantizable(model: torch.nn.Module) -> None:
    """Raise ValueError, naming the reason, if `model` cannot be made a row-invariant int8 model."""
    check_engine()
    off_cpu = sorted({str(p.device) for p in model.parameters() if p.device.type != "cpu"})
    if off_cpu:
        raise ValueError(f"int8 models run fbgemm's CPU kernel; the model is on {off_cpu}")
    check_attention(type(model), getattr(model.config, "_attn_implementation", None))


def quantize_int8(model: torch.nn.Module, reduce_range: bool = False) -> torch.nn.Module:
    """Turn every Linear of `model` (the output head and GPT-2's Conv1D included) into `Int8Linear`, in place.

    The model's attention becomes ``"row_invariant"``, so that a forward over any number of positions, rows,
    padding or holes gives each position bitwise the logits a one-token step gives it: speculation over the
    result is exactly lossless with respect to plain decoding of the same int8 model. The attention's C++ op is
    built here on first use (`structspec_ops.attention.implementation()` says whether it runs or, where it cannot build,
    the Python loop that keeps the same contract).

    Parameters
    ----------
    model : torch.nn.Module
        A float causal LM on the CPU with the standard attention interface (sdpa or eager).
    reduce_range : bool
        Quantize activations to 7 bits (fbgemm's default for dynamic int8; no int16 saturation on any CPU).

    Raises
    ------
    ValueError
        If the model is off the CPU, uses another attention, or torch has no fbgemm engine.
    """
    check_quantizable(model)
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            linear = as_linear(child)
            if linear is not None:
                setattr(parent, name, Int8Linear(linear, reduce_range))
    model.set_attn_implementation(ATTENTION)
    built()  # the attention op is built (once per machine) now, not inside a timed forward
    return model.eval()


def as_linear(module: torch.nn.Module) -> torch.nn.Linear | None:
    """`module` as a Linear if it is one: a Linear, or GPT-2's Conv1D (the transposed weight); None otherwise."""
    if type(module) is torch.nn.Linear:
        return module
    if type(module) is Conv1D:
        linear = torch.nn.Linear(*module.weight.shape, bias=module.bias is not None)
        linear.weight.data = module.weight.detach().T
        if module.bias is not None:
            linear.bias.data = module.bias.detach()
        return linear
    return None


def int8_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A row-invariant int8 copy of `model` (`quantize_int8` on a deep copy); the original is left unchanged."""
    check_quantizable(model)
    return quantize_int8(copy.deepcopy(model))

"""Row-invariant 4-bit models for the CPU: a GGUF's own 4-bit groups times per-row int8 activations.

`Int4Linear` runs `structspec_ops.int4` (AVX-512 VNNI, AVX2 or plain C++: bitwise the same on every x86 CPU): groups of
32 weights ``scale * q + offset`` (q in 0..15), each input row quantized to int8 with its own scale inside the op,
each group summed in int32, the groups added in float in one fixed order. A row's output is bitwise the same
whatever else the call holds, as with `Int8Linear`, so a target built of both, with the row-invariant attention,
verifies drafts exactly losslessly (docs/design.md, "Row invariance").

- `quantize_int4(model, gguf=path)`: the target. Every Linear that the GGUF stores as Q4_K, Q4_1 or Q4_0 keeps
  those groups exactly (`assisted.models.gguf_groups`, checked bitwise against the weights transformers loaded);
  the others (Q6_K, Q8_0, ...) become `Int8Linear`. Without a GGUF, every Linear but the output head is quantized
  to Q4_K's form (the head int8, as Q4_K_M keeps it in Q6_K).
- `int4_copy(model)`: an assistant's 4-bit copy (every Linear that fits, the head included; attention untouched).

Only where the kernel cannot build (no C++ compiler or ninja) do both fall back to the int8 path, with a warning that
says why and that it is another model (other outputs); `linear_kernels(model)` reports what runs.

    from assisted.models.int4 import quantize_int4
    quantize_int4(model, gguf="model.gguf")  # in place; attention "row_invariant"
"""

from __future__ import annotations

import copy
import warnings
from collections import Counter
from pathlib import Path

import torch

from assisted.models.gguf_groups import module_groups
from assisted.models.int8 import Int8Linear, as_linear, check_quantizable, int8_copy, quantize_int8
from structspec_ops import attention, int4
from structspec_ops.attention import ATTENTION


class Int4Linear(torch.nn.Module):
    """(..., in) -> (..., out): a weight held as 4-bit `structspec_ops.int4.Groups`, per-row int8 activations.

    Row-invariant: each row's output depends on that row alone (bitwise), whatever the number of rows or threads.
    """

    def __init__(self, groups: int4.Groups, bias: torch.Tensor | None = None):
        super().__init__()
        self._set(int4.pack(groups), bias)

    @classmethod
    def from_packed(cls, packed: int4.Packed, bias: torch.Tensor | None = None) -> Int4Linear:
        """The module of weights already in the kernel's layout (packed a few rows at a time, or read back from a
        cache): bitwise ``Int4Linear(int4.unpack(packed), bias)``."""
        module = cls.__new__(cls)
        torch.nn.Module.__init__(module)
        module._set(packed, bias)
        return module

    def _set(self, packed: int4.Packed, bias: torch.Tensor | None) -> None:
        self.register_buffer("packed", packed.data)
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())
        self.out_features, self.in_features = packed.out_features, packed.in_features
        self.groups_per_block = packed.groups_per_block

    @classmethod
    def quantized(cls, linear: torch.nn.Linear) -> Int4Linear:
        """A float Linear quantized to Q4_K's form (super-blocks of 8 groups, or 1 where `in` is not a multiple of
        256); its `in_features` must be a multiple of 32 (`fits`)."""
        blocks = 8 if linear.in_features % (8 * int4.GROUP) == 0 else 1
        return cls(int4.quantize(linear.weight.detach(), blocks), linear.bias)

    def layout(self) -> int4.Packed:
        return int4.Packed(self.packed, self.out_features, self.in_features, self.groups_per_block)

    @torch.no_grad()  # an inference kernel: the op has no gradient
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).float()  # (n, in)
        y = int4.linear(rows, self.layout(), self.bias)  # (n, out)
        return y.to(x.dtype).view(*x.shape[:-1], self.out_features)

    def groups(self) -> int4.Groups:
        return int4.unpack(self.layout())

    def dequantized(self) -> torch.Tensor:
        """(out, in) float32: the weight this module multiplies by (for tests and reports)."""
        return self.groups().dequantize()

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, " \
               f"groups_per_block={self.groups_per_block}, bias={self.bias is not None}"


def fits(linear: torch.nn.Linear) -> bool:
    """Whether a Linear's inputs split into groups of 32."""
    return linear.in_features % int4.GROUP == 0


def unavailable() -> str | None:
    """Why the int4 kernel cannot run here (one line), or None when it can."""
    built = int4.built()
    return None if built.ok else built.reason


def _fall_back(to: str) -> None:
    warnings.warn(f"int4 kernel unavailable ({unavailable()}); {to} runs the int8 kernel instead: another model, "
                  "whose outputs differ from the int4 model's", stacklevel=3)


def quantize_int4(model: torch.nn.Module, gguf: str | Path | None = None) -> torch.nn.Module:
    """Turn every Linear of `model` into `Int4Linear` or `Int8Linear`, in place; attention ``"row_invariant"``.

    Speculation over the result is exactly lossless with respect to plain decoding of the same model: each
    position's logits are bitwise those of a one-token step.

    Parameters
    ----------
    model : torch.nn.Module
        A float32 causal LM on the CPU with the standard attention interface (sdpa or eager).
    gguf : str or Path, optional
        The GGUF file the model was loaded from (or converted from): its Q4_K / Q4_1 / Q4_0 tensors are kept as they
        are, its other tensors become int8. Without one, every Linear but the head is quantized to Q4_K's form.

    Raises
    ------
    ValueError
        If the model is off the CPU or uses another attention, if torch has no fbgemm engine, or if the GGUF's
        groups do not de-quantize bitwise to the model's weights (`assisted.models.gguf_groups.module_groups`).
    """
    check_quantizable(model)
    if unavailable():
        _fall_back("the target")
        return quantize_int8(model)
    kept = module_groups(model, gguf) if gguf is not None else {}
    head = model.get_output_embeddings()
    for name, parent, child_name, child in _linears(model):
        linear = as_linear(child)
        if name in kept:
            new = Int4Linear(kept[name], linear.bias)
        elif gguf is None and child is not head and fits(linear):
            new = Int4Linear.quantized(linear)
        else:
            new = Int8Linear(linear)
        setattr(parent, child_name, new)
    model.set_attn_implementation(ATTENTION)
    attention.built()  # the attention op is built (once per machine) now, not inside a timed forward
    return model.eval()


def _linears(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module, str, torch.nn.Module]]:
    """(full name, parent, name in parent, module) of every Linear (or GPT-2 Conv1D) of `model`."""
    return [(f"{prefix}.{name}" if prefix else name, parent, name, child)
            for prefix, parent in list(model.named_modules()) for name, child in parent.named_children()
            if as_linear(child) is not None]


def int4_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A 4-bit copy of `model` for drafting on a CPU: every Linear whose inputs split into groups of 32 (the head
    included) becomes `Int4Linear`, quantized to Q4_K's form; the attention and other layers are left as they are.

    The original is left unchanged. Where the int4 kernel is unavailable, warns once and returns `int8_copy(model)`.

    Raises
    ------
    ValueError
        For a model off the CPU, or when no Linear fits.
    """
    off_cpu = {str(p.device) for p in model.parameters() if p.device.type != "cpu"}
    if off_cpu:
        raise ValueError(f"int4_copy needs the model on the CPU (the int4 kernel is a CPU kernel), not {off_cpu}")
    if unavailable():
        _fall_back("the assistant copy")
        return int8_copy(model)
    model = copy.deepcopy(model)
    replaced = 0
    for _, parent, child_name, child in _linears(model):
        linear = as_linear(child)
        if fits(linear):
            setattr(parent, child_name, Int4Linear.quantized(linear))
            replaced += 1
    if not replaced:
        raise ValueError("no Linear layer of this model has inputs in groups of 32 (int4 needs in_features % 32 == 0)")
    return model.eval()


def linear_kernels(model: torch.nn.Module) -> str:
    """Which kernels run `model`'s Linear layers, e.g. "int4 (AVX-512 VNNI) x196, int8 (fbgemm) x57"."""
    names = {Int4Linear: int4.kernel_name(), Int8Linear: "int8 (fbgemm)", torch.nn.Linear: "float"}
    counts = Counter(names.get(type(m), type(m).__name__) for m in model.modules() if type(m) in names)
    return ", ".join(f"{kind} x{count}" for kind, count in counts.most_common()) or "none"

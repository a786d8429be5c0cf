"""Row-invariant 4-bit models for the CPU: a GGUF's own 4-bit groups times per-row int8 activations.

`Int4Linear` runs `structspec_ops.int4` (AMX, AVX-512 VNNI, AVX2 or plain C++: bitwise the same on every x86 CPU):
groups of 32 weights ``scale * q + offset`` (q in 0..15), each input row quantized to int8 with its own scale inside
the op, each group summed in int32, the groups added in float in one fixed order. A row's output is bitwise the same
whatever else the call holds, as with `Int8Linear`, so a target built of both, with the row-invariant attention,
verifies drafts exactly losslessly (docs/design.md, "Row invariance").

- `quantize_int4(model, gguf=path)`: the target. Every Linear that the GGUF stores as Q4_K, Q4_1 or Q4_0 keeps
  those groups exactly, and every Q6_K one its 6-bit groups (`Q6KLinear`; `assisted.models.gguf_groups`, checked
  bitwise against the weights transformers loaded); the others (Q8_0, Q5_0, ...) become `Int8Linear`. Without a
  GGUF, every Linear but the output head is quantized to Q4_K's form, the head to Q6_K's (as Q4_K_M keeps it).
- `int4_copy(model)`: an assistant's 4-bit copy (every Linear that fits, the head included; attention untouched).

Both then run each Llama / Qwen2 decoder layer as two C++ calls around its attention (`assisted.models.fused_layers`).

Only where the kernel cannot build (no C++ compiler or ninja) do both fall back to the int8 path, with a warning that
says why and that it is another model (other outputs); `linear_kernels(model)` reports what runs.

    from assisted.models.int4_models import quantize_int4
    quantize_int4(model, gguf="model.gguf")  # in place; attention "row_invariant"
"""

from __future__ import annotations

import copy
import warnings
from collections import Counter
from pathlib import Path

import torch

from assisted.models.fused_layers import fuse_layers, fused_layer_count
from assisted.models.gguf_groups import module_groups
from assisted.models.int4_linear import Int4Linear, fits
from assisted.models.int8 import Int8Linear, as_linear, check_quantizable, int8_copy, quantize_int8
from assisted.models.q6k_linear import Q6KLinear
from structspec_ops import attention, int4, q6k
from structspec_ops.attention import ATTENTION


def unavailable() -> str | None:
    """Why the 4-bit or 6-bit kernel cannot run here (one line), or None when both can."""
    failed = [built.reason for built in (int4.built(), q6k.built()) if not built.ok]
    return failed[0] if failed else None


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
        The GGUF file the model was loaded from (or converted from): its Q4_K / Q4_1 / Q4_0 / Q6_K tensors are kept
        as they are, its other tensors become int8. Without one, every Linear but the head is quantized to Q4_K's
        form and the head to Q6_K's.

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
            new = (Q6KLinear if isinstance(kept[name], q6k.Groups) else Int4Linear)(kept[name], linear.bias)
        elif gguf is None and child is not head and fits(linear):
            new = Int4Linear.quantized(linear)
        elif gguf is None and Q6KLinear.fits(linear):
            new = Q6KLinear.quantized(linear)
        else:
            new = Int8Linear(linear)
        setattr(parent, child_name, new)
    model.set_attn_implementation(ATTENTION)
    attention.built()  # the attention op is built (once per machine) now, not inside a timed forward
    return fuse_layers(model).eval()


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
    return fuse_layers(model).eval()


def linear_kernels(model: torch.nn.Module) -> str:
    """Which kernels run `model`'s Linear layers, e.g. "int4 (AVX-512 VNNI) x196, int8 (fbgemm) x57"."""
    names = {Int4Linear: int4.kernel_name(), Q6KLinear: q6k.kernel_name(),
             Int8Linear: "int8 (fbgemm)", torch.nn.Linear: "float"}
    counts = Counter(names.get(type(m), type(m).__name__) for m in model.modules() if type(m) in names)
    kernels = ", ".join(f"{kind} x{count}" for kind, count in counts.most_common()) or "none"
    fused, layers = fused_layer_count(model)
    return f"{kernels}; decoder layers fused {fused}/{layers}" if fused else kernels

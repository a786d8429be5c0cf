"""A GGUF file's 4-bit and 6-bit weights as stored: Q4_K, Q4_1, Q4_0 blocks read into `structspec_ops.int4.Groups`,
Q6_K blocks into `structspec_ops.q6k.Groups`.

The raw blocks are decoded here (not de-quantized): codes, and each group's scale and offset in the form the kernels
take (Q4_K: fp16 d and dmin per 256 inputs, 6-bit sc and m per 32; Q4_1 and Q4_0: one group a block, scale d and
offset m or -8 d; Q6_K: fp16 d per 256 inputs, int8 sc per 16, as `structspec_ops.q6k`). Tensors are matched to a
transformers model's Linear modules by transformers' own GGUF name map, and rows are put in the order transformers'
loader puts them (llama's q/k permutation), by running its tensor processor on the row numbers. `module_groups` then
checks that each group form de-quantizes bitwise to the weight transformers loaded, and refuses the file if one does
not.

    groups = module_groups(model, "model.gguf")   # {"model.layers.0.mlp.up_proj": Groups, ...}
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import torch

from structspec_ops import q6k
from structspec_ops.int4 import LANES, Groups, Packed

BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q4_K": 144, "Q6_K": 210}  # the forms kept as they are; bytes per block


def decode(kind: str, raw: np.ndarray) -> Groups | q6k.Groups:
    """(rows, bytes) raw blocks of one tensor -> its `Groups` (Q6_K: `q6k.Groups`), rows in the file's order."""
    blocks = torch.from_numpy(np.array(raw)).reshape(raw.shape[0], -1, BLOCK_BYTES[kind])
    if kind == "Q6_K":
        return q6k.from_blocks(blocks.reshape(raw.shape[0], -1))
    return {"Q4_0": _q4_0, "Q4_1": _q4_1, "Q4_K": _q4_k}[kind](blocks)


def _half(blocks: torch.Tensor, at: int) -> torch.Tensor:
    """(rows, blocks) float32: the fp16 at byte `at` of every block."""
    return blocks[..., at : at + 2].contiguous().view(torch.float16)[..., 0].float()


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """(..., n) bytes -> (..., 2 n) codes: the n low nibbles, then the n high ones (ggml's order)."""
    return torch.stack([qs & 15, qs >> 4], -2).flatten(-2)


def _one_group_a_block(blocks: torch.Tensor, d: torch.Tensor, offset: torch.Tensor, qs_at: int) -> Groups:
    """Groups of 32 with their own scale d and offset: G = 1, sc = m = 1, dmin = -offset."""
    codes = _nibbles(blocks[..., qs_at : qs_at + 16]).reshape(blocks.shape[0], -1)
    ones = torch.ones(d.shape, dtype=torch.uint8)
    return Groups(codes.contiguous(), d, -offset, ones, ones)


def _q4_0(blocks: torch.Tensor) -> Groups:  # d (f16), 16 bytes of codes: d * (q - 8)
    d = _half(blocks, 0)
    return _one_group_a_block(blocks, d, -8 * d, 2)


def _q4_1(blocks: torch.Tensor) -> Groups:  # d, m (f16), 16 bytes of codes: d * q + m
    return _one_group_a_block(blocks, _half(blocks, 0), _half(blocks, 2), 4)


def _q4_k(blocks: torch.Tensor) -> Groups:  # d, dmin (f16), 12 bytes of 6-bit sc and m, 128 bytes of codes
    rows = blocks.shape[0]
    sc, m = _q4_k_scales(blocks)  # (rows, blocks, 8)
    codes = _nibbles(blocks[..., 16:].reshape(rows, -1, 4, 32))  # (rows, blocks, 4, 64): 2 groups a chunk
    return Groups(codes.reshape(rows, -1).contiguous(), _half(blocks, 0), _half(blocks, 2),
                  sc.reshape(rows, -1).contiguous(), m.reshape(rows, -1).contiguous())


def _q4_k_scales(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, supers, 8) uint8 each: Q4_K's 6-bit sc and m of every group."""
    rows = blocks.shape[0]
    low, high, extra = blocks[..., 4:16].reshape(rows, -1, 3, 4).unbind(2)  # (rows, blocks, 4) each
    sc = torch.cat([low & 63, (extra & 15) | ((low >> 2) & 48)], -1)
    m = torch.cat([high & 63, (extra >> 4) | ((high >> 2) & 48)], -1)
    return sc, m


def pack_q4_k(raw: np.ndarray) -> Packed:
    """(rows, bytes) Q4_K blocks -> ``int4.pack(decode("Q4_K", raw))``, made from the blocks' bytes directly: a
    Q4_K byte holds input t of two groups (low and high nibble), a packed byte inputs t and 16 + t of one, so each
    packed byte is two nibbles of two Q4_K bytes, and no code is expanded to a byte of its own."""
    rows = raw.shape[0]
    blocks = torch.from_numpy(np.ascontiguousarray(raw)).reshape(rows, -1, BLOCK_BYTES["Q4_K"])
    pad = -rows % LANES
    if pad:  # zero rows: d = dmin = 0, the zero weights `pack` pads with
        blocks = torch.cat([blocks, blocks.new_zeros(pad, *blocks.shape[1:])])
    count, supers = blocks.shape[0] // LANES, blocks.shape[1]
    floats = torch.stack([_half(blocks, 0), _half(blocks, 2)], 1)  # (rows, 2, supers)
    floats = floats.reshape(count, LANES, 2, supers).permute(0, 3, 2, 1).contiguous().view(torch.uint8)
    sc, m = _q4_k_scales(blocks)  # (rows, supers, 8)
    sc_m = torch.stack([sc, m], 1).reshape(count, LANES, 2, supers, 8).permute(0, 3, 2, 4, 1)
    qs = blocks[..., 16:].numpy().reshape(count * LANES, supers, 4, 2, 16)  # (row, super, chunk c, half, t)
    low, high = qs[..., 0, :], qs[..., 1, :]  # inputs t and 16 + t of groups 2c (low nibbles), 2c + 1 (high)
    codes = np.stack([(low & 15) | (high << 4), (low >> 4) | (high & 0xF0)], 3)  # (row, super, c, h, 16); numpy:
    codes = torch.from_numpy(codes).reshape(count, LANES, supers, 8, 16).view(torch.int32)  # its bit ops are faster
    # 4 bytes b of one (i, lane) moved as one int32
    codes = codes.permute(0, 2, 3, 4, 1).contiguous().view(torch.uint8)  # (block, super, group, i, lane, b)
    data = torch.cat([floats.reshape(count, supers, -1), sc_m.reshape(count, supers, -1),
                      codes.reshape(count, supers, -1)], 2)
    return Packed(data.reshape(-1), rows, supers * 256, 8)


def module_groups(model: torch.nn.Module, path: str | Path) -> dict[str, Groups | q6k.Groups]:
    """The groups of every Linear of `model` that the GGUF at `path` stores as Q4_K, Q4_1, Q4_0 or Q6_K.

    Parameters
    ----------
    model : torch.nn.Module
        The model transformers loaded from this GGUF (or from a float copy of it), on the CPU in float32.
    path : str or Path
        The GGUF file.

    Returns
    -------
    dict
        Module name -> `Groups` in the model's row order; each one de-quantizes bitwise to the module's weight.

    Raises
    ------
    ValueError
        If a group form does not de-quantize to the weight the model holds (another file, another row order).
    """
    import gguf

    reader = gguf.GGUFReader(str(path))
    tensors = {tensor.name: tensor for tensor in reader.tensors}
    sources, order = _tensor_names(model, reader, tensors)
    found = {}
    for module, linear in ((n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)):
        tensor = tensors.get(sources.get(module, ""))
        kind = None if tensor is None else tensor.tensor_type.name
        if kind not in BLOCK_BYTES:
            continue
        groups = decode(kind, tensor.data)
        groups = groups.rows(order(tensor.name, groups.shape[0]))
        _check(groups, linear.weight, f"{Path(path).name}: {tensor.name} ({kind}) -> {module}")
        found[module] = groups
    return found


def _tensor_names(model, reader, tensors: dict) -> tuple[dict[str, str], Callable[[str, int], torch.Tensor]]:
    """Module name -> its GGUF tensor's name, by transformers' map (a tied head reads the embedding's tensor when
    the file has no output tensor), and `order(name, rows)`: the row order transformers' loader gives that tensor."""
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    field = reader.fields["general.architecture"]
    architecture = bytes(field.parts[field.data[0]]).decode()
    config = model.config.to_dict()
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=config)
    arch = next((key for key, value in MODEL_ARCH_NAMES.items() if value == architecture), None)
    if arch is None:
        raise ValueError(f"gguf does not know the architecture {architecture!r} of this file")
    name_map = get_tensor_name_map(arch, model.config.num_hidden_layers)
    modules = {module: name for name, module in model.named_modules()}
    sources = {name: found for name in modules.values() if (found := _gguf_name(name_map, processor, name))}
    head, embedding = model.get_output_embeddings(), model.get_input_embeddings()
    if head is not None and head.weight is embedding.weight and sources.get(modules[head]) not in tensors:
        sources[modules[head]] = sources.get(modules[embedding], "")  # a tied head stored once, as the embedding
    to_hf = {gguf_name: f"{module}.weight" for module, gguf_name in sources.items()}

    def order(name: str, rows: int) -> torch.Tensor:
        return row_order(processor, config, to_hf, name, rows)

    return sources, order


def row_order(processor, config: dict, to_hf: dict[str, str], name: str, rows: int) -> torch.Tensor:
    """(rows,) int64: the file's row that transformers' loader puts at each row of the tensor `name` (its tensor
    processor run on the row numbers: llama's q/k permutation); ValueError if it does more than reorder rows."""
    result = processor.process(weights=np.arange(rows).reshape(rows, 1), name=name, tensor_key_mapping=to_hf,
                               parsed_parameters={"tensors": {}, "config": config})
    index = np.asarray(result.weights).reshape(-1)
    if index.shape != (rows,) or not np.array_equal(np.sort(index), np.arange(rows)):
        raise ValueError(f"{name}: transformers' loader does more than reorder this tensor's rows, so its 4-bit "
                         "groups cannot be kept")
    return torch.from_numpy(index.astype(np.int64))


def _gguf_name(name_map, processor, module: str) -> str | None:
    """The GGUF tensor name of a module's weight, as transformers' `get_gguf_hf_weights_map` finds it: the module's
    name, else its name inside each enclosing module (outermost first)."""
    parts = processor.preprocess_name(f"{module}.weight").removesuffix(".weight").split(".")
    for start in range(len(parts)):
        found = name_map.get_name(".".join(parts[start:]))
        if found is not None:
            return f"{found}.weight"
    return None


def _check(groups: Groups | q6k.Groups, weight: torch.Tensor, where: str) -> None:
    """Refuse groups that do not de-quantize bitwise to the weight transformers loaded."""
    if tuple(weight.shape) != groups.shape:
        raise ValueError(f"{where}: the file's tensor is {groups.shape}, the module's weight {tuple(weight.shape)}")
    value = groups.dequantize()
    if not torch.equal(value, weight.detach()):
        wrong = int((value != weight.detach()).sum())
        raise ValueError(f"{where}: the groups de-quantize to other weights than the model holds ({wrong} of "
                         f"{weight.numel()} differ): not the file this model was loaded from, or rows in another "
                         "order; refusing to keep them")

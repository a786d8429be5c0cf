"""A quantized CPU model built straight from a GGUF's blocks: no float copy of a quantized tensor on the way.

`build(path, recipe)` makes the model's skeleton on the meta device (transformers' own class for the file's
architecture, the config transformers reads from the file), then fills it tensor by tensor, reading each from the
file a few thousand rows at a time (plain reads, no memory map: the file's bytes never count as the process's
memory):

- each Linear is created in the packed form its kernel reads: a Q4_K / Q4_1 / Q4_0 tensor's own groups
  (`Int4Linear`), or a weight de-quantized a few rows at a time and quantized as `quantize_int4`, `int4_copy` or
  `quantize_int8` quantize it (per row, so the rows come out bitwise the same); tensors stored otherwise (Q6_K:
  its own groups; Q8_0, F16, ...: int8) in a target go through `other_linear`, the one place that says what they
  become;
- the token embedding stays in the file's form (`GGUFEmbedding`: a Q6_K table of 151,936 x 1,536 is 191 MB, its
  float32 copy 0.93 GB) and de-quantizes the rows it looks up;
- norms and biases (small) are de-quantized and processed exactly as transformers' GGUF loader does.

Recipes, each bitwise the model today's float path gives (`load_model` then the quantizer; tests/assisted/
test_gguf_build.py): ``"int4-target"`` = `quantize_int4(model, gguf=path)`, ``"int4-copy"`` = `int4_copy(model)`,
``"int8"`` = `quantize_int8(model)` (also `int8_copy`). `assisted.models.packed_cache` keeps the result on disk.

    from assisted.models.gguf_build import build
    model = build("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "int4-target")
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from assisted.models.gguf_groups import BLOCK_BYTES, decode, pack_q4_k, row_order
from assisted.models.fused_layers import fuse_layers
from assisted.models.int4_linear import Int4Linear
from assisted.models.int8 import Int8Linear, check_attention, quantize_weight
from assisted.models.q6k_linear import Q6KLinear
from structspec_ops import attention, int4, q6k
from structspec_ops.attention import ATTENTION

RECIPES = ("int4-target", "int4-copy", "int8")
CHUNK_VALUES = 1 << 20  # weights de-quantized or unpacked at a time (rows: a multiple of int4.LANES, so packed
# chunks concatenate): a float chunk of 4 MB, whatever the tensor's width


@dataclass(frozen=True)
class Tensor:
    """Where one tensor's blocks lie in a GGUF file: `rows` rows of `row_bytes` bytes from `offset`, each holding
    `width` values of type `kind` (numpy's `dtype` for the raw rows: uint8 for blocks, float32 / float16 else)."""

    path: Path
    name: str
    kind: str
    shape: tuple[int, ...]  # the raw array's shape, as gguf's reader gives it (rows first)
    dtype: str
    offset: int
    width: int  # values a row de-quantizes to

    @property
    def rows(self) -> int:
        return self.shape[0] if len(self.shape) > 1 else 1

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.shape[1:] if len(self.shape) > 1 else self.shape)) * np.dtype(self.dtype).itemsize

    def raw(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Rows start..stop as stored, read from the file (a copy of those bytes only)."""
        stop = self.rows if stop is None else stop
        data = np.empty((stop - start) * self.row_bytes, dtype=np.uint8)
        with open(self.path, "rb") as file:
            file.seek(self.offset + start * self.row_bytes)
            if file.readinto(memoryview(data)) != data.nbytes:
                raise ValueError(f"{self.path.name}: tensor {self.name} ends past the end of the file")
        shape = (stop - start, *self.shape[1:]) if len(self.shape) > 1 else self.shape
        return data.view(self.dtype).reshape(shape)

    def floats(self, rows: np.ndarray | slice | None = None) -> np.ndarray:
        """Rows (indices or a slice; all by default) de-quantized with gguf's own code, float32."""
        from gguf import GGMLQuantizationType, dequantize
        if isinstance(rows, slice) or rows is None:
            rows = rows or slice(0, self.rows)
            raw = self.raw(rows.start, rows.stop)
        else:
            raw = self.raw()[rows]
        return dequantize(raw, GGMLQuantizationType[self.kind]).astype(np.float32, copy=False)


class Metadata:
    """A GGUF file's key-value fields and tensor table, parsed in one pass over the file's head.

    gguf's own reader makes a numpy view of every element of every array (a Qwen2.5 file's 151,936 tokens and
    151,387 merges: most of a minute on a busy CPU); this keeps each scalar, string and small array as gguf's
    `ReaderField`, and of a long array (the tokenizer's) only its length, which is all a model's config needs.
    `fields` and `tensors` (name, tensor_type, shape) are what transformers' config reader asks a reader for.
    """

    LONG = 64  # arrays longer than this keep only their length
    SCALARS = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8",
               12: "<f8"}  # gguf's value types (8: string, 9: array)

    def __init__(self, path: str | Path):
        import gguf
        self.path = Path(path)
        self.lengths: dict[str, int] = {}  # long arrays: key -> number of elements
        self.fields: dict = {}
        with open(self.path, "rb") as file:
            head = file.read(1 << 24)
            while True:
                try:
                    self._parse(memoryview(head), gguf)
                    break
                except IndexError:  # the metadata runs past what was read: read more
                    more = file.read(len(head))
                    if not more:
                        raise ValueError(f"{self.path.name}: the GGUF's metadata runs past the end of the file")
                    head += more

    def _parse(self, head: memoryview, gguf) -> None:
        at = 0

        def take(fmt: str, count: int = 1):
            nonlocal at
            size = np.dtype(fmt).itemsize * count
            if at + size > len(head):
                raise IndexError
            value = np.frombuffer(head, fmt, count, at)
            at += size
            return value

        def string() -> np.ndarray:
            return take("u1", int(take("<u8")[0]))

        def skip_strings(length: int) -> None:  # step over strings (u64 length + bytes each), keeping none
            nonlocal at
            for _ in range(length):
                if at + 8 > len(head):
                    raise IndexError
                at += 8 + int.from_bytes(head[at : at + 8], "little")
            if at > len(head):
                raise IndexError

        if bytes(take("u1", 4)) != b"GGUF":
            raise ValueError(f"{self.path.name} is not a GGUF file")
        _, tensors, count = int(take("<u4")[0]), int(take("<u8")[0]), int(take("<u8")[0])
        self.fields.clear()
        for _ in range(count):
            key = bytes(string()).decode()
            kind = int(take("<u4")[0])
            if kind == 9:
                sub, length = int(take("<u4")[0]), int(take("<u8")[0])
                if sub == 8 and length > self.LONG:
                    skip_strings(length)
                    parts = None
                elif sub == 8:
                    parts = [string() for _ in range(length)]
                else:
                    values = take(self.SCALARS[sub], length)
                    parts = [values[i : i + 1] for i in range(length)] if length <= self.LONG else None
                if parts is None:
                    self.lengths[key] = length
                    continue
                types = [gguf.GGUFValueType(9), gguf.GGUFValueType(sub)]
                self.fields[key] = gguf.ReaderField(0, key, parts, list(range(length)), types)
            else:
                part = string() if kind == 8 else take(self.SCALARS[kind])
                self.fields[key] = gguf.ReaderField(0, key, [part], [0], [gguf.GGUFValueType(kind)])
        table = []
        for _ in range(tensors):
            name = bytes(string()).decode()
            dims = [int(n) for n in take("<u8", int(take("<u4")[0]))]
            table.append((name, dims, gguf.GGMLQuantizationType(int(take("<u4")[0])), int(take("<u8")[0])))
        alignment = self.value("general.alignment", 32)
        start = -(-at // alignment) * alignment
        self.tensors = [_TableEntry(name, kind, dims, start + offset) for name, dims, kind, offset in table]

    def value(self, key: str, default=None):
        field = self.fields.get(key)
        if field is None:
            return default
        part = field.parts[field.data[0]]
        return bytes(part).decode() if field.types[-1] == 8 else part[0].item()


class _TableEntry:
    """One row of a GGUF's tensor table: what transformers' config reader and `read_tensors` ask of a tensor."""

    def __init__(self, name: str, tensor_type, shape: list[int], data_offset: int):
        self.name, self.tensor_type, self.shape, self.data_offset = name, tensor_type, shape, data_offset


def read_tensors(path: str | Path, metadata: Metadata | None = None) -> tuple[str, dict[str, Tensor]]:
    """The file's architecture name and its tensors by name (metadata only: no tensor data is read)."""
    from gguf import GGML_QUANT_SIZES
    metadata = metadata or Metadata(path)
    tensors = {}
    for entry in metadata.tensors:
        kind, dims = entry.tensor_type.name, entry.shape  # dims: gguf's order, the row's width first
        block, size = GGML_QUANT_SIZES[entry.tensor_type]
        rows = int(np.prod(dims[1:])) if len(dims) > 1 else 1
        if kind in ("F32", "F16"):
            shape, dtype = (*reversed(dims),), ("float32" if kind == "F32" else "float16")
        else:
            shape, dtype = ((rows, dims[0] // block * size) if len(dims) > 1 else (dims[0] // block * size,)), "uint8"
        shape = (rows, *shape[-1:]) if len(dims) > 2 else shape
        tensors[entry.name] = Tensor(Path(path), entry.name, kind, tuple(int(n) for n in shape), dtype,
                                     entry.data_offset, int(dims[0]) if len(dims) > 1 else int(np.prod(dims)))
    return metadata.value("general.architecture"), tensors


def read_config(path: Path, metadata: Metadata):
    """transformers' config of the GGUF at `path`, read by transformers from `metadata` (its long arrays left out:
    where the file gives no vocabulary size, the number of the tokenizer's tokens is the vocabulary size, as
    transformers' reader takes it)."""
    import gguf
    from transformers import AutoConfig
    key, tokens = f"{metadata.value('general.architecture')}.vocab_size", metadata.lengths.get("tokenizer.ggml.tokens")
    added = key not in metadata.fields and tokens is not None
    if added:  # what transformers' reader would count from the tokens, given as the field it reads first
        metadata.fields[key] = gguf.ReaderField(0, key, [np.array([tokens], "<u4")], [0], [gguf.GGUFValueType(4)])
    original = gguf.GGUFReader
    gguf.GGUFReader = lambda *args, **kwargs: metadata  # transformers' loader makes its own reader from gguf's
    try:
        config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    finally:
        gguf.GGUFReader = original
        if added:
            del metadata.fields[key]
    if added:
        config.vocab_size = tokens  # also where transformers' map of this architecture has no vocab_size
    return config


def hf_names(model: torch.nn.Module, processor, architecture: str) -> dict[str, str]:
    """GGUF tensor name -> the model's parameter name, as transformers' `get_gguf_hf_weights_map` finds them (a
    name, else its name inside each enclosing module, outermost first), with gguf's name map made once."""
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map
    arch = next((key for key, value in MODEL_ARCH_NAMES.items() if value == architecture), None)
    if arch is None:
        raise NotBuildable(f"gguf does not know the architecture {architecture!r}")
    name_map = get_tensor_name_map(arch, model.config.num_hidden_layers)
    found = {}
    for key in model.state_dict():
        name, dot, suffix = processor.preprocess_name(key).rpartition(".")
        parts = name.split(".") if suffix in ("weight", "bias") else f"{name}{dot}{suffix}".split(".")
        suffix = f".{suffix}" if suffix in ("weight", "bias") else ""
        for start in range(len(parts)):
            gguf_name = name_map.get_name(".".join(parts[start:]))
            if gguf_name is not None:
                found.setdefault(gguf_name + suffix, key)
                break
    return found


class GGUFEmbedding(torch.nn.Module):
    """(...) token ids -> (..., dim) float32: a token embedding kept as the file stores it, rows de-quantized on
    lookup with gguf's own code (bitwise the rows of the float table transformers' loader makes)."""

    def __init__(self, blocks: torch.Tensor, kind: str, embedding_dim: int):
        super().__init__()
        import gguf  # noqa: F401 - imported here, at load (0.2 s), not inside a call's first forward
        self.register_buffer("blocks", blocks)  # (V, bytes a row) uint8, or (V, dim) float16 / float32
        self.kind, self.embedding_dim, self.num_embeddings = kind, embedding_dim, blocks.shape[0]

    @property
    def weight(self) -> torch.Tensor:
        """An empty (0, dim) float32 tensor on the table's device: the table's dtype and device (what callers ask
        an embedding's weight for); the rows themselves are not held in float."""
        return torch.empty(0, self.embedding_dim, device=self.blocks.device)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        from gguf import GGMLQuantizationType, dequantize
        rows = self.blocks[ids.reshape(-1).to(self.blocks.device)]
        if self.kind != "F32":
            rows = torch.from_numpy(dequantize(rows.numpy(), GGMLQuantizationType[self.kind]))
        return rows.float().reshape(*ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, kind={self.kind}"


def other_linear(tensor: Tensor, order: torch.Tensor | None, bias: torch.Tensor | None) -> torch.nn.Module:
    """The Linear of a target's tensor that the GGUF stores other than in 4 bits: a Q6_K tensor's own groups
    (`Q6KLinear`), else (Q8_0, F16, ...) an `Int8Linear` of its weight, de-quantized a few rows at a time (never the
    whole float copy); rows in `order` (None: the file's); bitwise what `quantize_int4` makes of the weight
    transformers loads."""
    if tensor.kind == "Q6_K":
        return _kept_q6k(tensor, order, bias)
    return _int8_linear(tensor, order, bias)


def _kept_q6k(tensor: Tensor, order: torch.Tensor | None, bias: torch.Tensor | None) -> Q6KLinear:
    """The file's own Q6_K groups, rows in `order`, packed a chunk of rows at a time (whole 16-row blocks) into one
    buffer of the layout's size."""
    block_bytes = tensor.width // q6k.SUPER * q6k.SUPER_BYTES  # one block of 16 rows
    data, at = torch.empty(-(-tensor.rows // q6k.LANES) * block_bytes, dtype=torch.uint8), 0
    for start, stop in _chunks(tensor):
        raw = tensor.raw(start, stop) if order is None else tensor.raw()[order[start:stop].numpy()]
        packed = q6k.pack(q6k.from_blocks(torch.from_numpy(np.ascontiguousarray(raw)))).data
        data[at : at + packed.numel()] = packed
        at += packed.numel()
    return Q6KLinear.from_packed(q6k.Packed(data, tensor.rows, tensor.width), bias)


def _chunks(tensor: Tensor):
    """(start, stop) row ranges of `tensor`, each about CHUNK_VALUES weights and a multiple of 16 rows."""
    step = max(int4.LANES, CHUNK_VALUES // tensor.width // int4.LANES * int4.LANES)
    return ((start, min(start + step, tensor.rows)) for start in range(0, tensor.rows, step))


def _float_rows(tensor: Tensor, order: torch.Tensor | None, start: int, stop: int) -> torch.Tensor:
    """(stop - start, width) float32: the model's rows start..stop of `tensor` (the file's rows `order[start:stop]`)."""
    rows = slice(start, stop) if order is None else order[start:stop].numpy()
    return torch.from_numpy(tensor.floats(rows))


def _int8_linear(tensor: Tensor, order: torch.Tensor | None, bias: torch.Tensor | None) -> Int8Linear:
    codes = torch.empty(tensor.rows, tensor.width + 2, dtype=torch.int8)
    scales = torch.empty(tensor.rows, dtype=torch.float64)
    for start, stop in _chunks(tensor):
        weight = quantize_weight(_float_rows(tensor, order, start, stop))
        codes[start:stop] = weight.int_repr()
        scales[start:stop] = weight.q_per_channel_scales()
        del weight
    return Int8Linear.from_codes(codes, scales, bias)


def _packed_int4(tensor: Tensor, bias: torch.Tensor | None, packed_rows) -> Int4Linear:
    """An `Int4Linear` packed a chunk of rows at a time (each chunk's bytes follow the last's: whole 16-row blocks);
    `packed_rows(start, stop)` gives those rows packed."""
    data, at, g = None, 0, None
    for start, stop in _chunks(tensor):
        packed = packed_rows(start, stop)
        if data is None:  # bytes per row: the same in every chunk
            g = packed.groups_per_block
            data = torch.empty(packed.data.numel() * -(-tensor.rows // int4.LANES) // -(-(stop - start) // int4.LANES),
                               dtype=torch.uint8)
        data[at : at + packed.data.numel()] = packed.data
        at += packed.data.numel()
    if at != data.numel():
        raise AssertionError(f"{tensor.name}: packed {at} bytes, expected {data.numel()}")
    return Int4Linear.from_packed(int4.Packed(data, tensor.rows, tensor.width, g), bias)


def _kept_int4(tensor: Tensor, order: torch.Tensor | None, bias: torch.Tensor | None) -> Int4Linear:
    """The file's own Q4_K / Q4_1 / Q4_0 groups, rows in `order` (Q4_K straight from its bytes: `pack_q4_k`)."""
    def packed_rows(start: int, stop: int) -> int4.Packed:
        raw = tensor.raw(start, stop) if order is None else tensor.raw()[order[start:stop].numpy()]
        return pack_q4_k(raw) if tensor.kind == "Q4_K" else int4.pack(decode(tensor.kind, raw))
    return _packed_int4(tensor, bias, packed_rows)


def _requantized_int4(tensor: Tensor, order: torch.Tensor | None, bias: torch.Tensor | None) -> Int4Linear:
    """`Int4Linear.quantized` of the de-quantized weight (Q4_K's form), a chunk of rows at a time."""
    blocks = int4.groups_per_block_for(tensor.width)
    return _packed_int4(tensor, bias,
                        lambda start, stop: int4.pack(int4.quantize(_float_rows(tensor, order, start, stop), blocks)))


def _float_linear(tensor: Tensor, order: torch.Tensor | None, bias: torch.Tensor | None) -> torch.nn.Linear:
    linear = torch.nn.Linear(tensor.width, tensor.rows, bias=bias is not None, device="meta")
    linear.weight = torch.nn.Parameter(_float_rows(tensor, order, 0, tensor.rows), requires_grad=False)
    if bias is not None:
        linear.bias = torch.nn.Parameter(bias.float(), requires_grad=False)
    return linear


def make_linear(recipe: str, tensor: Tensor, order: torch.Tensor | None, bias: torch.Tensor | None):
    """The module `recipe` makes of one Linear's tensor (see the module's docstring)."""
    if recipe == "int8":
        return _int8_linear(tensor, order, bias)
    if recipe == "int4-target":
        if tensor.kind in BLOCK_BYTES and tensor.kind != "Q6_K":
            return _kept_int4(tensor, order, bias)
        return other_linear(tensor, order, bias)
    if tensor.width % int4.GROUP == 0:  # int4-copy: every Linear whose inputs split into groups of 32
        return _requantized_int4(tensor, order, bias)
    return _float_linear(tensor, order, bias)


def skeleton(config) -> torch.nn.Module:
    """transformers' model for `config` on the meta device (no weight allocated), float32."""
    from transformers import AutoModelForCausalLM
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def supported(model: torch.nn.Module) -> str | None:
    """Why `build` cannot make this model (one line), or None: its Linears must be torch Linears and its input
    embedding a plain `torch.nn.Embedding` (a scaled or otherwise extended one is left to the float path)."""
    from transformers.pytorch_utils import Conv1D
    if type(model.get_input_embeddings()) is not torch.nn.Embedding:
        return f"its input embedding is a {type(model.get_input_embeddings()).__name__}"
    if any(type(m) is Conv1D for m in model.modules()):
        return "it has Conv1D layers"
    return None


class NotBuildable(ValueError):
    """This model cannot be built from its GGUF's blocks (the float path can load it)."""


def build(path: str | Path, recipe: str) -> torch.nn.Module:
    """The model `recipe` makes of the GGUF at `path`, built from the file's blocks (see the module's docstring).

    Raises
    ------
    NotBuildable
        For a model `supported` refuses, or a file whose tensors transformers' loader would do more than reorder.
    ValueError
        For an unknown recipe.
    """
    return build_parts(path, recipe)[0]


def build_parts(path: str | Path, recipe: str) -> tuple[torch.nn.Module, dict[str, tuple[Tensor, torch.Tensor | None]]]:
    """`build`'s model, and for each Linear and the embedding the file's tensor and row order it was made of."""
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    if recipe not in RECIPES:
        raise ValueError(f"recipe must be one of {RECIPES}, not {recipe!r}")
    path = Path(path)
    metadata = Metadata(path)
    architecture, tensors = read_tensors(path, metadata)
    config = read_config(path, metadata)
    model = skeleton(config)
    why = supported(model)
    if why is not None:
        raise NotBuildable(f"{path.name}: cannot be built from its blocks: {why}")
    config_dict = model.config.to_dict()
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=config_dict)
    to_hf = hf_names(model, processor, architecture)
    linears = {name for name, module in model.named_modules() if type(module) is torch.nn.Linear}
    embedding_name = _name_of(model, model.get_input_embeddings())
    weights, values = {}, {}  # Linear or embedding name -> its Tensor; other parameters' values
    for tensor in tensors.values():
        hf = to_hf.get(tensor.name)
        module, _, leaf = (hf or "").rpartition(".")
        if hf is None:
            continue
        if leaf == "weight" and (module in linears or module == embedding_name):
            weights[module] = tensor
            continue
        value = processor.process(weights=tensor.floats(), name=tensor.name, tensor_key_mapping=to_hf,
                                  parsed_parameters={"tensors": {}, "config": config_dict})
        values[to_hf[value.name]] = torch.from_numpy(np.copy(value.weights))
    head = _name_of(model, model.get_output_embeddings())
    if head is not None and head not in weights and config.tie_word_embeddings:
        weights[head] = weights[embedding_name]  # a tied head stored once, as the embedding
    try:
        order = {name: _order(processor, config_dict, to_hf, tensor) for name, tensor in weights.items()}
    except ValueError as error:
        raise NotBuildable(f"{path.name}: {error}") from error
    for name in sorted(weights, key=lambda n: n != embedding_name):
        tensor = weights[name]
        if name == embedding_name:
            if order[name] is not None:
                raise NotBuildable(f"{path.name}: transformers' loader reorders the embedding's rows")
            new = GGUFEmbedding(torch.from_numpy(tensor.raw()), tensor.kind, tensor.width)
        else:
            new = make_linear(recipe, tensor, order[name], values.pop(f"{name}.bias", None))
        model.set_submodule(name, new)
    return finish(model, values, recipe), {name: (weights[name], order[name]) for name in weights}


def _name_of(model: torch.nn.Module, module: torch.nn.Module | None) -> str | None:
    return next((name for name, m in model.named_modules() if m is module), None) if module is not None else None


def _order(processor, config_dict: dict, to_hf: dict, tensor: Tensor) -> torch.Tensor | None:
    """The row order transformers' loader gives `tensor` (None: the file's own)."""
    if len(tensor.shape) < 2:
        return None
    index = row_order(processor, config_dict, to_hf, tensor.name, tensor.rows)
    return None if torch.equal(index, torch.arange(tensor.rows)) else index


def finish(model: torch.nn.Module, values: dict[str, torch.Tensor], recipe: str) -> torch.nn.Module:
    """Put the remaining parameters in place (`values`: name -> float tensor), make the modules whose buffers are
    computed, not stored (rotary embeddings), on the CPU, set the recipe's attention, and check that nothing is
    left on the meta device."""
    model.load_state_dict(values, strict=False, assign=True)
    for name, module in list(model.named_modules()):
        own = list(module.buffers(recurse=False))
        if any(b.is_meta for b in own) and not any(p.is_meta for p in module.parameters(recurse=False)):
            model.set_submodule(name, type(module)(config=module.config))  # e.g. rotary inv_freq: computed
    left = [name for name, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise ValueError(f"built from the GGUF, the model still lacks {left[:5]} ({len(left)} in all)")
    if recipe != "int4-copy":
        check_attention(type(model), getattr(model.config, "_attn_implementation", None))
        model.set_attn_implementation(ATTENTION)
        attention.built()  # built once per machine now, not inside a timed forward
    if recipe.startswith("int4"):
        fuse_layers(model)  # as quantize_int4 and int4_copy end
    return model.eval()

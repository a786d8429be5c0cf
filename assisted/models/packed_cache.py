"""A model built from a GGUF's blocks, kept on disk in its packed form: a second process loads it in seconds.

One file per (GGUF content, recipe, `LAYOUT_VERSION`) in `folder()` (``$STRUCTSPEC_CACHE/packed/``): a JSON header (the
config, each module's kind and shape, where each tensor lies) and the tensors' bytes, read back with plain reads
into the tensors the modules hold (no float copy, no memory map). The file is written under a temporary name and
renamed into place, so concurrent writers each publish a whole file and a reader never sees half of one; a file
that cannot be read back whole (another version, a truncated or garbled file) is removed and the model rebuilt.
The content key of a named source is its pinned sha256; of another file, its sha256, remembered per (path, size,
modification time) so that it is computed once.

    from assisted.models.packed_cache import load
    model, note = load("int4-target", key, lambda: gguf_path)   # note: "cached", "built" or "rebuilt (why)"
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import warnings
from pathlib import Path
from typing import Callable

import torch

from assisted.models.gguf_build import GGUFEmbedding, Tensor, build_parts, finish, other_linear, skeleton
from assisted.models.int4_linear import Int4Linear
from assisted.models.int8 import Int8Linear
from assisted.models.q6k_linear import Q6KLinear
from assisted.models.sources import cache_root
from structspec_ops import int4, q6k

LAYOUT_VERSION = 3  # bump when a packed layout, a recipe's output or this file's format changes
MAGIC = b"structspec-packed\n"
ALIGN = 64  # every tensor's bytes start at a multiple of this


def folder() -> Path:
    """``$STRUCTSPEC_PACKED_CACHE``, else ``packed/`` in the cache folder (`assisted.models.sources.cache_root`)."""
    return Path(os.environ.get("STRUCTSPEC_PACKED_CACHE") or cache_root() / "packed").expanduser()


def path_of(key: str, recipe: str) -> Path:
    return folder() / f"{key[:32]}-{recipe}-v{LAYOUT_VERSION}.bin"


def file_key(path: str | Path) -> str:
    """The sha256 of a file's content, computed once per (path, size, modification time) and remembered."""
    path = Path(path).resolve()
    stat = path.stat()
    memo = folder() / f"sha256-{hashlib.sha1(str(path).encode()).hexdigest()[:20]}.json"
    seen = {"path": str(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    try:
        known = json.loads(memo.read_text())
        if {k: known.get(k) for k in seen} == seen:
            return known["sha256"]
    except (OSError, ValueError, KeyError):
        pass
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(1 << 24):
            digest.update(chunk)
    _publish(memo, lambda f: f.write(json.dumps({**seen, "sha256": digest.hexdigest()}).encode()))
    return digest.hexdigest()


def load(recipe: str, key: str, gguf: Callable[[], Path]) -> tuple[torch.nn.Module, str]:
    """The model `recipe` makes of the GGUF whose content is `key`: read from the cache, else built from the file
    (`gguf()` gives its path, asked only then) and cached. Returns (model, how: "cached", "built" or "rebuilt
    (why)")."""
    target = path_of(key, recipe)
    how = "built"
    if target.is_file():
        try:
            return read(target, recipe, key, gguf), "cached"
        except Exception as error:  # a file that cannot be read back whole is rebuilt, whatever is wrong with it
            how = f"rebuilt ({type(error).__name__}: {str(error)[:200]})"
            warnings.warn(f"{target.name}: cannot read the cached model back, rebuilding it ({how})", stacklevel=2)
            target.unlink(missing_ok=True)
    model, sources = build_parts(gguf(), recipe)
    try:
        write(target, model, sources, recipe, key)
    except OSError as error:
        warnings.warn(f"could not cache the packed model at {target} ({error}); the next load builds it again",
                      stacklevel=2)
    return model, how


# ---- writing -------------------------------------------------------------------------------------------------


def _module_tensors(module: torch.nn.Module, source) -> tuple[dict, dict[str, torch.Tensor]]:
    """(the module's entry for the header, its tensors) for one built module."""
    bias = {} if getattr(module, "bias", None) is None else {"bias": module.bias}
    if type(module) is Int4Linear:
        entry = {"type": "int4", "out": module.out_features, "in": module.in_features, "g": module.groups_per_block}
        return entry, {"packed": module.packed, **bias}
    if type(module) is Q6KLinear:
        return {"type": "q6k", "out": module.out_features, "in": module.in_features}, {"packed": module.packed, **bias}
    if type(module) is Int8Linear:
        codes, scales = module.codes()
        return {"type": "int8"}, {"codes": codes, "scales": scales, **bias}
    if type(module) is GGUFEmbedding:
        return {"type": "embedding", "kind": module.kind, "dim": module.embedding_dim}, {"blocks": module.blocks}
    if type(module) is torch.nn.Linear:
        return {"type": "float"}, {"weight": module.weight.detach(), **bias}
    # another kind of module (e.g. a new kernel's Linear from `other_linear`): made again from the GGUF's blocks
    tensor, order = source
    entry = {"type": "gguf", "tensor": {k: getattr(tensor, k) for k in ("name", "kind", "shape", "dtype", "offset",
                                                                         "width")}}
    return entry, {**bias, **({} if order is None else {"order": order})}


def write(target: Path, model: torch.nn.Module, sources: dict, recipe: str, key: str) -> None:
    """Write `model` (built by `build_parts`, `sources` its Linears' tensors) to `target`, atomically."""
    modules, tensors = {}, {}
    for name in sources:
        entry, own = _module_tensors(model.get_submodule(name), sources[name])
        modules[name] = entry
        tensors.update({f"{name}/{field}": value for field, value in own.items()})
    skip = tuple(f"{name}." for name in sources)
    for name, value in model.state_dict().items():
        if not name.startswith(skip):
            tensors[f"state/{name}"] = value
    index, offset = {}, 0
    for name, value in tensors.items():
        offset = -(-offset // ALIGN) * ALIGN
        index[name] = [str(value.dtype).removeprefix("torch."), list(value.shape), offset]
        offset += value.numel() * value.element_size()
    header = {"version": LAYOUT_VERSION, "recipe": recipe, "key": key, "config": model.config.to_dict(),
              "modules": modules, "tensors": index, "data_bytes": offset}
    head = json.dumps(header).encode()
    start = -(-(len(MAGIC) + 8 + len(head)) // ALIGN) * ALIGN

    def fill(file) -> None:
        file.write(MAGIC + len(head).to_bytes(8, "little") + head)
        for name, value in tensors.items():
            file.seek(start + index[name][2])
            if value.numel():
                file.write(memoryview(value.detach().contiguous().reshape(-1).view(torch.uint8).numpy()))
        file.seek(start + offset)
        file.write(MAGIC)  # the end mark: a file cut short lacks it

    _publish(target, fill)


def _publish(target: Path, fill: Callable) -> None:
    """Write a file through `fill(file)` under a temporary name beside `target`, then rename it into place."""
    target.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{target.name}-", dir=target.parent)
    try:
        with os.fdopen(descriptor, "wb") as file:
            fill(file)
        os.chmod(temporary, 0o644)
        os.replace(temporary, target)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


# ---- reading -------------------------------------------------------------------------------------------------


def read(target: Path, recipe: str, key: str, gguf: Callable[[], Path]) -> torch.nn.Module:
    """The model written to `target`; ValueError if the file is not one whole, current one for (recipe, key)."""
    from transformers import CONFIG_MAPPING
    with open(target, "rb") as file:
        if file.read(len(MAGIC)) != MAGIC:
            raise ValueError("not a packed model file")
        size = int.from_bytes(file.read(8), "little")
        header = json.loads(file.read(size))
        if (header.get("version"), header.get("recipe"), header.get("key")) != (LAYOUT_VERSION, recipe, key):
            raise ValueError("written for another version, recipe or file")
        start = -(-(len(MAGIC) + 8 + size) // ALIGN) * ALIGN
        if os.fstat(file.fileno()).st_size != start + header["data_bytes"] + len(MAGIC):
            raise ValueError("the file's size is not the one its header gives")
        file.seek(start + header["data_bytes"])
        if file.read(len(MAGIC)) != MAGIC:
            raise ValueError("no end mark")
        config = header["config"]
        model = skeleton(CONFIG_MAPPING[config["model_type"]].from_dict(config))
        owned: dict[str, dict] = {}  # module -> {field: spec}
        for field, spec in header["tensors"].items():
            module, _, leaf = field.partition("/")
            owned.setdefault(module, {})[leaf] = spec
        for name, entry in header["modules"].items():  # one module's tensors in memory at a time, besides the model
            own = {leaf: _read_tensor(file, start, *spec) for leaf, spec in owned.pop(name, {}).items()}
            model.set_submodule(name, _module(entry, own, gguf))
        state = {leaf: _read_tensor(file, start, *spec) for leaf, spec in owned.pop("state", {}).items()}
    return finish(model, state, recipe)


def _read_tensor(file, start: int, dtype: str, shape: list[int], offset: int) -> torch.Tensor:
    value = torch.empty(shape, dtype=getattr(torch, dtype))
    if value.numel():
        file.seek(start + offset)
        buffer = memoryview(value.reshape(-1).view(torch.uint8).numpy())
        if file.readinto(buffer) != len(buffer):
            raise ValueError("a tensor ends past the end of the file")
    return value


def _module(entry: dict, own: dict[str, torch.Tensor], gguf: Callable[[], Path]) -> torch.nn.Module:
    kind, bias = entry["type"], own.get("bias")
    if kind == "int4":
        packed = int4.Packed(own["packed"], entry["out"], entry["in"], entry["g"])
        if packed.data.numel() != _packed_bytes(packed):
            raise ValueError("a packed 4-bit weight of the wrong size")
        return Int4Linear.from_packed(packed, bias)
    if kind == "q6k":
        packed = q6k.Packed(own["packed"], entry["out"], entry["in"])
        blocks, supers = -(-packed.out_features // q6k.LANES), packed.in_features // q6k.SUPER
        if packed.data.numel() != blocks * supers * q6k.SUPER_BYTES or packed.in_features % q6k.SUPER:
            raise ValueError("a packed Q6_K weight of the wrong size")
        return Q6KLinear.from_packed(packed, bias)
    if kind == "int8":
        return Int8Linear.from_codes(own["codes"], own["scales"], bias)
    if kind == "embedding":
        return GGUFEmbedding(own["blocks"], entry["kind"], entry["dim"])
    if kind == "float":
        linear = torch.nn.Linear(*reversed(own["weight"].shape), bias=bias is not None, device="meta")
        linear.weight = torch.nn.Parameter(own["weight"], requires_grad=False)
        if bias is not None:
            linear.bias = torch.nn.Parameter(bias, requires_grad=False)
        return linear
    if kind == "gguf":
        spec = dict(entry["tensor"], shape=tuple(entry["tensor"]["shape"]))
        return other_linear(Tensor(path=Path(gguf()), **spec), own.get("order"), bias)
    raise ValueError(f"a module of unknown type {kind!r}")


def _packed_bytes(packed: int4.Packed) -> int:
    """The byte length of `packed`'s layout: per block of 16 columns and super-block, 128 bytes of d and dmin,
    2 G x 16 of sc and m, G x 256 of codes."""
    blocks = -(-packed.out_features // int4.LANES)
    supers = packed.in_features // (int4.GROUP * packed.groups_per_block)
    g = packed.groups_per_block
    return blocks * supers * (128 + 2 * g * int4.LANES + g * int4.CODE_BYTES)

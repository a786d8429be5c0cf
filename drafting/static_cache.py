"""Static KV caches: allocated once to a capacity, written at explicit positions; a crop moves a length.

transformers' `StaticCache` keeps per layer keys and values of shape (1, H, capacity, D) and a write counter on
the model's device (`cumulative_length`, transformers 5.x): the forward takes its positions, its causal mask and
its write slots from that counter. `StaticKV` owns the counters. Before each forward it sets them to the length
it holds, so a crop after a rejected draft is a Python integer: slots past the length are stale until the next
forward overwrites them, and the causal mask hides them from every query until then.

Captured steps (CUDA graphs). With a `capture` function, forwards over up to 32 new tokens replay a graph
captured once per bucket (1, 2, 4, 8, 16, 32 positions): the ids are padded to the bucket after the real ones
(causality hides the padding from them; its slots lie past the length) and the step reads its start from a
device scalar, so one graph serves every position. Longer forwards (a prompt's prefill) run eagerly on the same
cache. `capture` is a seam: `cuda_capture` on a GPU, an eager stand-in in CPU tests of the bucketing.
"""

from __future__ import annotations

import contextlib
import time
import weakref
from typing import Callable

import torch

from drafting.draft_head import draft_head
from drafting.kv_cache import cache_argument, input_device

BUCKETS = (1, 2, 4, 8, 16, 32)  # widths of the captured steps: a draft of k tokens runs in the next one >= k + 1
Step = Callable[[], torch.Tensor]  # a forward over fixed buffers -> logits (bucket, V)


class StaticKV:
    """One model's static cache (the `drafting.kv_cache.KV` interface): `run` feeds tokens after the first `length`
    positions, `crop` shortens.

    Parameters
    ----------
    model : transformers causal LM
        A model whose layers all attend to the whole past (no sliding window; see `static_unsupported`).
    capacity : int
        Positions the cache holds; a forward that would write past it raises ValueError (nothing wraps).
    capture : callable, optional
        step -> replay, both returning logits (bucket, V): captures a bucket's forward (`cuda_capture`).
        None: every forward runs eagerly.
    """

    def __init__(self, model, capacity: int, capture: Callable[[Step], Step] | None = None):
        from transformers import StaticCache

        self._model, self.capacity, self.capture = weakref.ref(model), capacity, capture  # kept caches outlive no model
        self.cache = StaticCache(config=model.config, max_cache_len=capacity)
        self.length = 0  # positions holding the committed sequence's keys and values
        self.device, self.dtype = input_device(model), next(model.parameters()).dtype
        self.start = torch.zeros((), dtype=torch.long, device=self.device)  # a captured step's first position
        self.steps: dict[int, tuple[torch.Tensor, Step]] = {}  # bucket -> (ids buffer (1, bucket), replay)
        self.capture_seconds = 0.0

    @property
    def model(self):
        return self._model()

    def run(self, ids: list[int], keep: int) -> torch.Tensor:
        """Feed `ids` at positions length.. and return the logits of the last `keep` of them, (keep, V)."""
        m = len(ids)
        if self.length + m > self.capacity:
            raise ValueError(f"static cache full: {self.length} + {m} positions exceed its capacity {self.capacity}")
        bucket = self._bucket(m)
        if bucket is None:
            logits = self._eager(ids, keep)
        else:
            buffer, replay = self.steps[bucket] if bucket in self.steps else self._capture(bucket)
            buffer[0, :m].copy_(torch.tensor(ids, dtype=torch.long), non_blocking=True)  # the rest: stale ids
            self.start.fill_(self.length)
            logits = replay()[m - keep : m].clone()  # (keep, V), out of the graph's buffer before the next replay
        self.length += m
        return logits

    def crop(self, length: int) -> None:
        """Keep the first `length` positions (no-op when it holds fewer); copies nothing."""
        self.length = min(self.length, length)

    def capture_all(self) -> None:
        """Capture every bucket that fits now, so that no timed forward pays a capture."""
        for bucket in BUCKETS:
            if self.capture is not None and bucket not in self.steps and self.length + bucket <= self.capacity:
                self._capture(bucket)

    def _bucket(self, m: int) -> int | None:
        """The captured width for m new tokens, or None (no capture, too long, or too close to the capacity)."""
        if self.capture is None:
            return None
        bucket = next((b for b in BUCKETS if b >= m), None)
        return bucket if bucket is not None and self.length + bucket <= self.capacity else None

    def _eager(self, ids: list[int], keep: int) -> torch.Tensor:
        for layer in self.cache.layers:
            layer.cumulative_length.fill_(self.length)
        x = torch.tensor([ids], dtype=torch.long, device=self.device)  # (1, m)
        out = self.model(
            input_ids=x, use_cache=True, logits_to_keep=keep, **{cache_argument(type(self.model)): self.cache}
        )
        return out.logits[0, -keep:]

    def _capture(self, bucket: int) -> tuple[torch.Tensor, Step]:
        buffer = torch.zeros((1, bucket), dtype=torch.long, device=self.device)
        argument = cache_argument(type(self.model))

        def step() -> torch.Tensor:  # every input is a fixed buffer: the ids and the start scalar
            for layer in self.cache.layers:
                layer.cumulative_length.copy_(self.start)
            out = self.model(input_ids=buffer, use_cache=True, logits_to_keep=bucket, **{argument: self.cache})
            return out.logits[0]  # (bucket, V)

        self.start.fill_(self.length)  # warm-up and capture write only at and past the length
        began = time.perf_counter()
        with torch.cuda.device(self.device) if self.device.type == "cuda" else contextlib.nullcontext():
            self.steps[bucket] = buffer, self.capture(step)
        self.capture_seconds += time.perf_counter() - began
        return self.steps[bucket]


def cuda_capture(step: Step, pool=None) -> Step:
    """A CUDA graph of `step`, warmed up on a side stream as capture requires; returns its replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = step()

    def replay() -> torch.Tensor:
        graph.replay()
        return out
    return replay


def static_unsupported(model) -> str | None:
    """Why `model` cannot decode on a static cache, in a few words; None when it can."""
    from transformers import StaticCache

    config = model.config.get_text_config()
    types = set(getattr(config, "layer_types", None) or ())
    if types - {"full_attention"} or getattr(config, "use_sliding_window", False):
        return f"its layers are not all full attention ({', '.join(sorted(types)) or 'sliding window'})"
    try:
        layers = StaticCache(config=model.config, max_cache_len=1).layers
    except Exception as error:  # noqa: BLE001 (a model transformers cannot give a StaticCache)
        return f"transformers cannot build it a StaticCache ({type(error).__name__}: {error})"
    if not all(isinstance(getattr(layer, "cumulative_length", None), torch.Tensor) for layer in layers):
        return "this transformers version's StaticCache keeps no write counter (transformers >= 5.17 does)"
    return None


def graphs_unsupported(model) -> str | None:
    """Why `model`'s steps cannot be captured in CUDA graphs; None when they can."""
    devices = {p.device for p in model.parameters()}
    if any(d.type != "cuda" for d in devices):
        return f"its weights are not all on a CUDA device ({', '.join(sorted(map(str, devices)))})"
    if len(devices) > 1:
        return f"its weights span {len(devices)} devices"
    if draft_head(model) is not None:
        return "its draft vocabulary switches to the full head per step, in Python (drafting.draft_head)"
    return None

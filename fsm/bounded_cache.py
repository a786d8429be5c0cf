"""A least-recently-used cache bounded by entry count and by bytes, safe to share between threads."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable, Hashable


class BoundedCache:
    """key -> value, at most `max_entries` entries and about `max_bytes` bytes (sizes from `size_of`).

    Sizes are measured again whenever an entry is fetched or stored, since cached automata grow
    as they are used; the entry just fetched or stored is never evicted by its own call.
    """

    def __init__(self, max_entries: int, max_bytes: int, size_of: Callable[[object], int]):
        self.max_entries, self.max_bytes, self.size_of = max_entries, max_bytes, size_of
        self._entries: OrderedDict[Hashable, object] = OrderedDict()
        self._sizes: dict[Hashable, int] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        """Bytes of the entries when last measured."""
        return sum(self._sizes.values())

    def get_or_build(self, key: Hashable, build: Callable[[], object]):
        """The cached value of `key`, or `build()` stored under it (built outside the cache's lock)."""
        with self._lock:
            value = self._entries.get(key)
            if value is not None:
                self._entries.move_to_end(key)
                self._remeasure(key)
                return value
        value = build()
        with self._lock:
            value = self._entries.setdefault(key, value)
            self._entries.move_to_end(key)
            self._remeasure(key)
        return value

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._sizes.clear()

    def _remeasure(self, key: Hashable) -> None:
        self._sizes[key] = self.size_of(self._entries[key])
        while len(self._entries) > 1 and (len(self._entries) > self.max_entries or self.nbytes > self.max_bytes):
            oldest = next(iter(self._entries))
            if oldest == key:
                break
            del self._entries[oldest]
            del self._sizes[oldest]

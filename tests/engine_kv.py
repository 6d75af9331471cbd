"""A counting in-memory KVStore with native generations, for the engine's tests.

Each stored value carries a counter generation bumped on every put; reads and
puts honour ``if_generation`` exactly. Every request is recorded in ``log``
as ``(op, key, ranges or None, bytes transferred)``, so tests can count
requests and bytes. ``caps`` can be replaced to play an object store
(``round_trips``) or a store without conditional writes.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator, Mapping, Sequence

from shardkv._types import BytesLike
from shardkv.storage.kv import (
    MISSING_RESULT,
    NO_VALUE,
    Capabilities,
    Generation,
    KVStore,
    ReadRequest,
    ReadResult,
    StoreLocation,
    Value,
    hidden,
)

_ids = itertools.count()


class CountingKV(KVStore):
    def __init__(self, caps: Capabilities | None = None) -> None:
        self.caps = caps or Capabilities(
            ranged=True, stamps="native", conditional_put=True, conditional_delete=True, in_process=True
        )
        self.data: dict[str, tuple[bytes, Generation]] = {}
        self.log: list[tuple[str, str, object, int]] = []
        self._counter = itertools.count(1)
        self._lock = threading.Lock()
        self._location = StoreLocation(("counting", next(_ids)), "")

    @property
    def location(self) -> StoreLocation:
        return self._location

    def _holds(self, key: str, condition: Generation) -> bool:
        if condition.is_any:
            return True
        stored = self.data.get(key)
        current = NO_VALUE if stored is None else stored[1]
        return current == condition

    def get_many(self, reads: Sequence[ReadRequest]) -> list[ReadResult]:
        out = []
        with self._lock:
            for key, ranges, condition in reads:
                stored = self.data.get(key)
                if stored is None:
                    self.log.append(("get", key, ranges, 0))
                    out.append(MISSING_RESULT)
                    continue
                value, generation = stored
                if not condition.is_any and condition != generation:
                    self.log.append(("get", key, ranges, 0))
                    out.append(ReadResult("stale", None, generation))
                    continue
                if ranges is None:
                    parts: list[BytesLike] = [value]
                else:
                    parts = []
                    for r in ranges:
                        start, stop = r.resolve(len(value))
                        parts.append(value[start:stop])
                self.log.append(("get", key, ranges, sum(len(p) for p in parts)))
                out.append(ReadResult("value", parts, generation, None))
        return out

    def put_many(self, writes: Mapping[str, tuple[Value | None, Generation]]) -> dict[str, Generation | None]:
        out: dict[str, Generation | None] = {}
        with self._lock:
            for key, (value, condition) in writes.items():
                if not self._holds(key, condition):
                    self.log.append(("put", key, None, 0))
                    out[key] = None
                    continue
                if value is None:
                    self.data.pop(key, None)
                    self.log.append(("delete", key, None, 0))
                    out[key] = NO_VALUE
                    continue
                data = b"".join(bytes(p) for p in value) if isinstance(value, (list, tuple)) else bytes(value)
                generation = Generation(next(self._counter))
                self.data[key] = (data, generation)
                self.log.append(("put", key, None, len(data)))
                out[key] = generation
        return out

    def list_prefix(self, prefix: str) -> Iterator[str]:
        return iter(sorted(k for k in list(self.data) if k.startswith(prefix) and not hidden(k)))

    def gets(self) -> list[tuple[str, str, object, int]]:
        return [entry for entry in self.log if entry[0] == "get"]

"""What the shard engine needs from the store below it: :class:`ShardBackend`.

:class:`~shardkv.engine.planner.ShardIO` reads and writes shards through this
small interface only. Two kinds of object satisfy it:

* :class:`shardkv.storage.adapters.StoreAdapter`, as it is (the proxy's base
  store: a dict, a zarr-python 2 store, an fsspec mapper);
* :class:`shardkv.transformers.backend.UnderlyingBackend`, a thin wrapper over
  a 2022 draft ``AbstractStore`` (the store under a sharding storage
  transformer, which may itself be another transformer of a stack).

Byte ranges follow :class:`~shardkv.format.ranges.ByteRange` (half-open;
negative start = suffix). "Not found" is ``None`` in batch reads and
``KeyError`` in single reads; every other error propagates.
"""

from __future__ import annotations

from typing import Hashable, Iterable, Mapping, Protocol, Sequence, runtime_checkable

from shardkv.format.ranges import ByteRange

__all__ = ["ShardBackend"]


@runtime_checkable
class ShardBackend(Protocol):
    """The operations of a base store that the shard engine uses.

    Attributes
    ----------
    supports_ranges : bool
        True when :meth:`get_ranges` reads only the bytes asked for (else the
        engine reads whole shards).
    supports_append : bool
        True when :meth:`write_at` updates a stored value in place with I/O
        proportional to the bytes written (enables the ``append`` and
        ``inplace`` write strategies).
    """

    supports_ranges: bool

    @property
    def supports_append(self) -> bool: ...

    def get(self, key: str) -> bytes:
        """The whole value; ``KeyError`` if ``key`` is not stored."""
        ...

    def get_many(self, keys: Sequence[str]) -> dict[str, bytes]:
        """Whole values of the stored keys among ``keys`` (one batch)."""
        ...

    def get_ranges(self, requests: Sequence[tuple[str, ByteRange]]) -> list[bytes | None]:
        """Byte ranges, in request order (one batch); fewer bytes past a value's end."""
        ...

    def set(self, key: str, value: bytes) -> None:
        """Store one value."""
        ...

    def set_many(self, values: Mapping[str, bytes]) -> None:
        """Store several values (one batch)."""
        ...

    def delete_many(self, keys: Iterable[str]) -> None:
        """Delete the stored keys among ``keys``; missing ones are ignored."""
        ...

    def write_at(self, key: str, writes: Sequence[tuple[int, bytes]]) -> None:
        """Write ``(offset, bytes)`` pieces inside a stored value (offsets in bytes from its start).

        Used by the ``append``/``inplace`` strategies (only where
        :attr:`supports_append`) and by :meth:`ShardIO.erase_chunks`, which
        passes a negative offset (from the end) where :meth:`size_if_free`
        gives ``None``: a backend whose sizes are not free and whose
        ``write_at`` works must accept it.
        """
        ...

    def size(self, key: str) -> int:
        """Size (bytes) of a stored value; ``KeyError`` if missing."""
        ...

    def size_if_free(self, key: str) -> int | None:
        """Size (bytes) when known without a request, else ``None``."""
        ...

    def validator(self, key: str) -> Hashable:
        """A cheap fingerprint that changes when the value is rewritten, or ``None``."""
        ...

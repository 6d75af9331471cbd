"""A :class:`StoreAdapter` over any ``MutableMapping`` (a dict, a zarr-python 2 store): whole values only; ranges are sliced from them."""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any, Iterable, Iterator, Mapping, Sequence

from fsspec.mapping import FSMap

from shardkv.format.ranges import ByteRange
from shardkv.storage.base import StoreAdapter
from shardkv.storage.buffers import (
    Value,
    join_parts,
    slice_value,
)
from shardkv.storage.location import StoreLocation

__all__ = ["MappingAdapter"]


class MappingAdapter(StoreAdapter):
    """A ``MutableMapping`` as base store (dict, zarr-python 2 store, user mapping).

    Parameters
    ----------
    mapping : MutableMapping
        The base store. Values may be any bytes-like object.
    """

    supports_ranges = False

    def __init__(self, mapping: MutableMapping) -> None:
        self.mapping = mapping

    # -- identity and pickling (issue 9) --------------------------------------

    @property
    def location(self) -> StoreLocation:
        """This mapping object's data: stores over the same mapping object share locks."""
        return StoreLocation(("mapping", id(self.mapping)), "")

    def __reduce__(self) -> tuple[Any, ...]:
        # the mapping pickles itself (a dict is copied: the copy is a new location)
        return (type(self), (self.mapping,))

    # -- I/O ------------------------------------------------------------------

    def get(self, key: str) -> bytes:
        return self.mapping[key]

    def get_many(self, keys: Sequence[str]) -> dict[str, bytes]:
        getitems = getattr(self.mapping, "getitems", None)
        if getitems is not None and not isinstance(self.mapping, FSMap):
            return dict(getitems(list(keys), contexts={}))
        out = {}
        for k in keys:
            try:
                out[k] = self.mapping[k]
            except KeyError:
                continue
        return out

    def get_ranges(self, requests: Sequence[tuple[str, ByteRange]]) -> list[bytes | memoryview | None]:
        values = self.get_many(list(dict.fromkeys(k for k, _ in requests)))
        return [None if k not in values else slice_value(values[k], r) for k, r in requests]

    def set_many(self, values: Mapping[str, Value]) -> None:
        if not values:
            return
        # a mapping stores one object per key: parts are joined here, once
        joined = {k: join_parts(v) if isinstance(v, (list, tuple)) else v for k, v in values.items()}
        setitems = getattr(self.mapping, "setitems", None)
        if setitems is not None:
            setitems(joined)
        else:
            for k, v in joined.items():
                self.mapping[k] = v

    def delete_many(self, keys: Iterable[str]) -> None:
        for k in keys:
            try:
                del self.mapping[k]
            except KeyError:
                continue

    def contains(self, key: str) -> bool:
        return key in self.mapping

    def iter_keys(self, prefix: str = "") -> Iterator[str]:
        for k in list(self.mapping.keys()):
            if k.startswith(prefix):
                yield k

    def list_dir(self, path: str = "") -> list[str]:
        listdir = getattr(self.mapping, "listdir", None)
        if listdir is not None:
            return sorted(listdir(path))
        prefix = f"{path}/" if path else ""
        return sorted({k[len(prefix) :].split("/", 1)[0] for k in self.iter_keys(prefix)})

    def rmdir(self, path: str) -> None:
        rmdir = getattr(self.mapping, "rmdir", None)
        if rmdir is not None:
            rmdir(path)
        else:
            super().rmdir(path)

    def size(self, key: str) -> int:
        return memoryview(self.mapping[key]).nbytes

    def close(self) -> None:
        close = getattr(self.mapping, "close", None)
        if close is not None:
            close()



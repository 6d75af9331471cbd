"""A store adapter that presents Zarr v3 nodes as Zarr v2 nodes (for zarr-python 2 through ShardedStore).

:class:`PresentingAdapter` wraps the base store adapter of a
:class:`~shardkv.ShardedStore` and serves the ``.zarray`` / ``.zattrs`` /
``.zgroup`` documents that :func:`shardkv.metadata.v2_view.v2_view_of_v3`
derives, for paths whose ``zarr.json`` is a v3 document with neither
``.zarray`` nor ``.zgroup`` beside it. Those documents are read-only (writing
them raises :class:`~shardkv.errors.ReservedKeyError`); chunk writes go to
the shards.
"""

from __future__ import annotations

from typing import Any, Hashable, Iterable, Iterator, Mapping, Sequence

from shardkv.errors import MetadataError, ReservedKeyError
from shardkv.format.ranges import ByteRange
from shardkv.keys.paths import join_path, split_key
from shardkv.metadata.documents import dump_json, load_json
from shardkv.metadata.v2_view import V2View, v2_view_of_v3
from shardkv.storage.adapters import StoreAdapter

__all__ = ["PresentingAdapter"]

_PRESENTED = (".zarray", ".zattrs", ".zgroup")


class PresentingAdapter(StoreAdapter):
    """A store adapter that adds the v2 documents of v3 nodes to what the base adapter holds.

    Parameters
    ----------
    inner : StoreAdapter
        The adapter over the base store; every call is passed to it, and a
        read of ``.zarray`` / ``.zattrs`` / ``.zgroup`` that it misses is
        answered from the sibling ``zarr.json`` when that is a v3 document
        with neither ``.zarray`` nor ``.zgroup`` beside it.
    """

    def __init__(self, inner: StoreAdapter) -> None:
        self.inner = inner
        self.supports_ranges = inner.supports_ranges

    # -- presentation ------------------------------------------------------

    def _view(self, path: str, zarr_json: bytes | None = None) -> V2View | None:
        """The v2 view of the v3 node at ``path``, or None when it is not a v3-only node."""
        if zarr_json is None:
            found = self.inner.get_many([join_path(path, "zarr.json")])
            zarr_json = found.get(join_path(path, "zarr.json"))
            if zarr_json is None:
                return None
        try:
            doc = load_json(join_path(path, "zarr.json"), zarr_json)
        except MetadataError:
            return None
        if not isinstance(doc, dict) or doc.get("zarr_format") != 3:
            return None
        if self.inner.contains(join_path(path, ".zarray")) or self.inner.contains(join_path(path, ".zgroup")):
            return None  # a v2 node (a sharded v2 array's zarr.json is shardkv's own view)
        return v2_view_of_v3(doc, path)

    def _presented(self, key: str, zarr_json: bytes | None = None) -> bytes | None:
        path, name = split_key(key)
        if name not in _PRESENTED:
            return None
        view = self._view(path, zarr_json)
        if view is None or name not in view.documents:
            return None
        return dump_json(view.documents[name], key=key, strict=True)

    def view_of(self, path: str) -> V2View | None:
        """The v2 view of the v3-only node at ``path`` (``None`` if there is none)."""
        return self._view(path.strip("/"))

    # -- reads -------------------------------------------------------------

    def _presented_or_missing(self, key: str) -> bytes:
        """The derived document at ``key``; ``KeyError`` when there is none (called on an inner miss)."""
        value = self._presented(key)
        if value is None:
            raise KeyError(key)
        return value

    def get(self, key: str) -> bytes:
        try:
            return self.inner.get(key)
        except KeyError:
            return self._presented_or_missing(key)

    def get_many(self, keys: Sequence[str]) -> dict[str, bytes]:
        out = self.inner.get_many(keys)
        for key in keys:
            if key not in out and split_key(key)[1] in _PRESENTED:
                sibling = join_path(split_key(key)[0], "zarr.json")
                value = self._presented(key, out.get(sibling))
                if value is not None:
                    out[key] = value
        return out

    def get_ranges(self, requests: Sequence[tuple[str, ByteRange]]) -> list[bytes | None]:
        return self.inner.get_ranges(requests)

    def contains(self, key: str) -> bool:
        return self.inner.contains(key) or self._presented(key) is not None

    def iter_keys(self, prefix: str = "") -> Iterator[str]:
        zarr_jsons: list[str] = []
        v2_meta: set[str] = set()
        for key in self.inner.iter_keys(prefix):
            path, name = split_key(key)
            if name == "zarr.json":
                zarr_jsons.append(path)
            elif name in _PRESENTED:
                v2_meta.add(key)
            yield key
        for path in zarr_jsons:
            if join_path(path, ".zarray") in v2_meta or join_path(path, ".zgroup") in v2_meta:
                continue
            view = self._view(path)
            for name in view.documents if view is not None else ():
                if join_path(path, name) not in v2_meta:
                    yield join_path(path, name)

    def list_dir(self, path: str = "") -> list[str]:
        names = self.inner.list_dir(path)
        if "zarr.json" in names and ".zarray" not in names and ".zgroup" not in names:
            view = self._view(path)
            if view is not None:
                names = sorted(set(names) | set(view.documents))
        return names

    def size(self, key: str) -> int:
        try:
            return self.inner.size(key)
        except KeyError:
            return len(self._presented_or_missing(key))

    def validator(self, key: str) -> Hashable:
        return self.inner.validator(key)

    def size_if_free(self, key: str) -> int | None:
        return self.inner.size_if_free(key)

    # -- writes ------------------------------------------------------------

    def _refuse_presented(self, keys: Iterable[str]) -> None:
        for key in keys:
            path, name = split_key(key)
            if name in _PRESENTED and self._view(path) is not None:
                raise ReservedKeyError(
                    key, "the v2 documents of a Zarr v3 node are read-only; change its zarr.json with a v3 library"
                )

    def set_many(self, values: Mapping[str, bytes]) -> None:
        self._refuse_presented(values)
        self.inner.set_many(values)

    def delete_many(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        self._refuse_presented(keys)
        self.inner.delete_many(keys)

    def rmdir(self, path: str) -> None:
        self.inner.rmdir(path)

    @property
    def supports_append(self) -> bool:
        return self.inner.supports_append

    def write_at(self, key: str, writes: Sequence[tuple[int, bytes]]) -> None:
        self.inner.write_at(key, writes)

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name: str) -> Any:  # anything else a concrete adapter offers
        return getattr(self.inner, name)

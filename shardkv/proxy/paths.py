"""The path-taking methods of :class:`~shardkv.proxy.store.ShardedStore`: compaction, listing, rmdir, getsize, rename.

Every path is checked by :func:`~shardkv.keys.paths.validate_path` first, so
no method reads or writes outside the store (``..``, absolute paths, empty
segments and backslashes raise :class:`~shardkv.errors.InvalidKeyError`).
A mixin: it works on the proxy's ``_base``, ``_nodes``, ``_io`` and
``_writer`` and calls its ``flush``, ``delitems``, ``refresh`` and
``sharded_array``.
"""

from __future__ import annotations

from typing import Any, Iterator

from shardkv.engine.temporaries import DEFAULT_TEMP_AGE, remove_stale_temporaries
from shardkv.keys.paths import join_path, path_prefix, validate_path
from shardkv.proxy.listing import logical_keys

__all__ = ["PathMethods"]


class PathMethods:
    """Compaction and the zarr-python 2 path methods of the sharded-store proxy."""

    _base: Any
    _nodes: Any
    _io: Any
    _writer: Any
    base: Any

    def compact(self, path: str | None = None) -> int:
        """Rewrite shards that hold unused bytes (after appends, in-place writes or slack).

        Parameters
        ----------
        path : str, optional
            Only the sharded array at this path; every sharded array when ``None``.

        Returns
        -------
        int
            Bytes reclaimed in the base store.

        Raises
        ------
        InvalidKeyError
            If ``path`` leaves the store (see :func:`~shardkv.keys.paths.validate_path`).
        """
        if path is not None:
            path = validate_path(path)
        remove_stale_temporaries(self._base, DEFAULT_TEMP_AGE)
        self.flush()
        stored: dict[str, list[str]] = {}  # the shards that exist (a listing), never the grid: sparse grids are cheap
        for key in self._base.iter_keys(f"{path}/" if path else ""):
            arr = self._nodes.owner(key)
            coords = None if arr is None else arr.shard_coords_of(key)
            grid = None if arr is None else arr.shard_grid_shape
            if coords is not None and (grid is None or all(c < n for c, n in zip(coords, grid))):
                stored.setdefault(arr.path, []).append(key)  # type: ignore[union-attr]
        reclaimed = 0
        for array_path in sorted(stored) if path is None else [path]:
            arr = self.sharded_array(array_path)
            if arr is not None:
                reclaimed += self._io.compact_shards(arr, sorted(stored.get(array_path, [])))
        return reclaimed

    # -- listing ----------------------------------------------------------------

    def __iter__(self) -> Iterator[str]:
        self.flush()
        return logical_keys(self._nodes, self._io, self._base.iter_keys())

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def keys_under(self, path: str) -> Iterator[str]:
        """Every logical key under ``path`` (a path, or ``""`` for all).

        Every path-taking method raises :class:`InvalidKeyError` for a path
        that would leave the store (``..``, absolute, empty segment, backslash).
        """
        path = validate_path(path)
        self.flush()
        return logical_keys(self._nodes, self._io, self._base.iter_keys(path_prefix(path)))

    def listdir(self, path: str = "") -> list[str]:
        """Names of the immediate children of ``path``, as code above the proxy sees them."""
        path = validate_path(path)
        inside = self._nodes.owner(join_path(path, "0")) if path else None
        if inside is None and self._nodes.sharded(path) is None:
            names = self._base.list_dir(path)
            return [n for n in names if not (n == "zarr.json" and self._nodes.is_hidden(join_path(path, n)))]
        prefix = path_prefix(path)
        return sorted({k[len(prefix) :].split("/", 1)[0] for k in self.keys_under(path)})

    def rmdir(self, path: str = "") -> None:
        """Delete everything under ``path`` (the whole store for ``""``)."""
        path = validate_path(path)
        arr = self._nodes.owner(join_path(path, "0")) if path else None
        if arr is not None and arr.path != path:
            self.delitems(list(self.keys_under(path)))  # a sub-path of a '/'-separated array
            return
        self._writer.discard_under(path)
        self._base.rmdir(path)
        self._io.index_cache.clear()
        self._nodes.forget_under(path)

    def getsize(self, path: str = "") -> int:
        """Bytes stored under ``path`` in the base store (shards, not logical chunks)."""
        path = validate_path(path)
        self.flush()
        if path and self._base.contains(path):
            return self._base.size(path)
        return sum(self._base.size(k) for k in self._base.iter_keys(path_prefix(path)))

    def rename(self, src_path: str, dst_path: str) -> None:
        """Move everything under ``src_path`` to ``dst_path`` (shards move whole).

        Copies, then deletes the copied keys: not for a path other writers are
        writing at the same time (as with zarr 2's own stores).
        """
        src, dst = validate_path(src_path, what="src_path"), validate_path(dst_path, what="dst_path")
        self.flush()
        stored = self.base  # what is stored: v3 documents move as they are, presented ones are not written
        keys = list(stored.iter_keys(path_prefix(src)))
        stored.set_many({dst + k[len(src) :]: stored.get(k) for k in keys})
        stored.delete_many(keys)
        if src and keys:
            stored.prune_empty_dirs(src)  # the emptied directories too (local files), as zarr 2's rename
        self.refresh()

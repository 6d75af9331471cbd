"""The hierarchy rules of zarr-python 2's ``MemoryStore`` and ``DirectoryStore``, kept by the proxy.

A key is a value or a path holding keys, never both: storing below a stored
value raises :class:`~shardkv.errors.KeyBelowKeyError`; storing or deleting a
key with keys under it replaces or deletes them. Enforced over local
directories and mappings only (elsewhere a check would cost requests); chunk
keys of a known array are never checked.
"""

from __future__ import annotations

from collections.abc import Iterable

from shardkv.errors import KeyBelowKeyError
from shardkv.keys.paths import chunkish_under, path_prefix, split_key
from shardkv.metadata.documents import META_NAMES
from shardkv.proxy.nodes import NodeTable
from shardkv.storage.kv import KVStore
from shardkv.storage.local import LocalStore
from shardkv.storage.mapping import MappingStore


class Hierarchy:
    """Applies the rules above to the base store ``kv`` (a no-op where they do not hold).

    Parameters
    ----------
    kv : KVStore
        The base store. The rules are enforced over a local directory
        (:class:`~shardkv.storage.local.LocalStore`) and a mapping
        (:class:`~shardkv.storage.mapping.MappingStore`), the kinds of store
        zarr 2's ``DirectoryStore`` and ``MemoryStore`` are.
    nodes : NodeTable
        What the proxy knows of the hierarchy's arrays and groups.
    """

    def __init__(self, kv: KVStore, nodes: NodeTable) -> None:
        self._kv = kv
        self._nodes = nodes
        # local files or a mapping: where zarr 2's own stores keep the rules
        self.enforced = isinstance(kv, (LocalStore, MappingStore))

    def _chunk_of_array(self, key: str) -> bool:
        """True when ``key`` is chunk-like under an array the node table knows."""
        if split_key(key)[1] in META_NAMES:
            return False
        path = self._nodes.array_above(key)
        return path is not None and chunkish_under(path, key)

    def stored_above(self, key: str) -> str | None:
        """The stored key that ``key`` lies below (``a/b`` for ``a/b/c``), or ``None``."""
        parts = key.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            above = "/".join(parts[:i])
            if self._kv.contains(above):
                return above
        return None

    def has_keys_under(self, key: str) -> bool:
        """True when keys are stored under ``key/`` in the base store."""
        if isinstance(self._kv, LocalStore):  # one directory listing, not a walk (a file lists nothing)
            keys, dirs = self._kv.list_dir(path_prefix(key))
            return bool(keys or dirs)
        return next(iter(self._kv.list_prefix(path_prefix(key))), None) is not None

    def check_set(self, keys: Iterable[str]) -> list[str]:
        """Check that ``keys`` may be stored; return those whose ``key/`` subtree must be removed first.

        Raises
        ------
        KeyBelowKeyError
            If a key lies below a stored key (nothing has been written).
        """
        if not self.enforced:
            return []
        replaced: list[str] = []
        for key in keys:
            if self._chunk_of_array(key):
                continue
            above = self.stored_above(key)
            if above is not None:
                raise KeyBelowKeyError(key, above)
            if split_key(key)[1] not in META_NAMES and self.has_keys_under(key):
                replaced.append(key)
        return replaced

    def deletes_subtree(self, key: str) -> bool:
        """True when deleting the missing key ``key`` means deleting the keys under it (a path)."""
        return self.enforced and not self._chunk_of_array(key) and self.has_keys_under(key)

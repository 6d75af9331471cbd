"""Prefix operations of the 2022 draft sharding transformer: ``list_prefix``, ``list_dir``, ``erase_prefix``.

Draft "API implementation": a prefix that reaches into the chunk-grid part
of the keys is translated to the prefix of the shards that can hold the
chunks it names (:mod:`shardkv.keys.prefixes`); listed shards are replaced by
the keys of their stored chunks (their indexes read through the shard
engine, 4096 shards per request, cached ones not at all); listed partial
shard keys by every chunk-key prefix they can hold. :class:`PrefixOperations`
is mixed into :class:`~shardkv.transformers.sharding.ShardingStorageTransformer`,
which provides ``array``, ``engine``, ``erase_chunks``, ``underlying``, ``key_prefix`` and ``_is_shard``.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from shardkv.engine.merge import ShardChange
from shardkv.keys.prefixes import expand_shard_prefix, shard_prefix, split_prefix
from shardkv.keys.space import ShardedArray

from .api import normalize_prefix

__all__ = ["PrefixOperations"]

Local = tuple[int, ...]


class PrefixOperations:
    """``list_prefix``, ``list_dir`` and ``erase_prefix`` of a sharding transformer."""

    array: ShardedArray
    engine: Any
    erase_chunks: Any
    underlying: Any
    key_prefix: str

    def _is_shard(self, key: str) -> bool:
        return self.array.shard_coords_of(key) is not None

    def _unshard(self, shard_keys: Sequence[str], prefix: str) -> list[str]:
        """Chunk keys (starting with ``prefix``) of the chunks stored in ``shard_keys``."""
        found = self.engine.chunk_keys({k: self.array for k in shard_keys}, in_grid_only=False)
        return [k for k in found if k.startswith(prefix)]

    def _listed(self, keys: Iterable[str], prefix: str) -> tuple[list[str], list[str]]:
        """Listed underlying keys split into plain keys starting with ``prefix``, and shard keys."""
        plain, shards = [], []
        for key in keys:
            if self._is_shard(key):
                shards.append(key)
            elif key.startswith(prefix):
                plain.append(key)
        return plain, shards

    def list_prefix(self, prefix: str) -> list[str]:
        """Stored keys starting with ``prefix``; shards are listed as their stored chunks.

        One ``list_prefix`` on the underlying store (with the prefix translated
        to shard coords where it names chunk coords), then one
        ``get_partial_values`` of the indexes not cached per 4096 listed shards.
        """
        prefix = normalize_prefix(prefix)
        split = split_prefix(self.array, prefix)
        if split is not None and not split[1]:
            return [k for k in self.underlying.list_prefix(prefix) if not self._is_shard(k)]  # no chunk key can match
        translated = prefix if split is None else shard_prefix(self.array, split[0])
        plain, shards = self._listed(self.underlying.list_prefix(translated), prefix)
        return plain + self._unshard(shards, prefix)

    def list_dir(self, prefix: str) -> tuple[list[str], list[str]]:
        """Keys and prefixes directly below ``prefix``, as seen above the transformer.

        Retrieved shard keys are replaced by the keys of their stored chunks
        (their indexes are read); retrieved prefixes of partial shard keys are
        replaced by the prefixes of every chunk the shard can hold, without
        checking that any is stored (draft note: listed prefixes may be empty).
        """
        prefix = normalize_prefix(prefix)
        if not prefix.startswith(self.key_prefix):
            return self.underlying.list_dir(prefix)
        directory = prefix[: prefix.rfind("/") + 1]
        split = split_prefix(self.array, directory)
        if split is not None and not split[1]:
            keys, prefixes = self.underlying.list_dir(prefix)
            return [k for k in keys if not self._is_shard(k)], prefixes
        fixed = [] if split is None else split[0]
        keys, prefixes = self.underlying.list_dir(directory if split is None else shard_prefix(self.array, fixed))
        out_keys, shards = self._listed(keys, prefix)
        out_keys.extend(self._unshard(shards, prefix))
        out_prefixes: set[str] = set()
        for p in prefixes:
            expanded = expand_shard_prefix(self.array, p, fixed)
            if expanded is None:
                expanded = [p]
            out_prefixes.update(e for e in expanded if e.startswith(prefix))
        return sorted(out_keys), sorted(out_prefixes)

    def erase_prefix(self, prefix: str) -> None:
        """Erase every key starting with ``prefix``.

        A prefix that does not reach into the chunk-grid part of the keys is
        relayed (it covers whole shards). Otherwise the shards that can hold
        matching chunks are listed: shards all of whose available chunks match
        are erased without a read, the matching chunks of the others as by
        :meth:`erase_values`.
        """
        prefix = normalize_prefix(prefix)
        split = split_prefix(self.array, prefix)
        if split is None:
            self.underlying.erase_prefix(prefix)
            self.engine.forget()  # shards of this array may be gone
            return
        if not split[1]:
            self.underlying.erase_values([k for k in self.underlying.list_prefix(prefix) if not self._is_shard(k)])
            return
        plain, shards = self._listed(self.underlying.list_prefix(shard_prefix(self.array, split[0])), prefix)
        erasures: dict[str, ShardChange] = {}
        partial = []
        for shard_key in shards:
            coords = self.array.shard_coords_of(shard_key)
            available = [(self.array.chunk_key(c), local) for c, local in self.array.chunks_in_shard(coords)]  # type: ignore[arg-type]
            if available and all(k.startswith(prefix) for k, _ in available):
                erasures[shard_key] = ShardChange(self.array, coords, dict.fromkeys(local for _, local in available))  # type: ignore[arg-type]
            else:
                partial.append(shard_key)
        for key in self._unshard(partial, prefix):
            ref = self.array.locate(key, check_grid=False)
            erasures.setdefault(ref.shard_key, ShardChange(self.array, ref.shard_coords)).chunks[ref.local_coords] = None
        if plain:
            self.underlying.erase_values(plain)
        if erasures:
            self.erase_chunks(erasures)

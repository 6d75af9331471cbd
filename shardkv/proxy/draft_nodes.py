"""What the 2022 draft proxy knows: each array's metadata (read once), its transformer stack, the owners of keys."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from shardkv.errors import ConfigurationError
from shardkv.keys.paths import is_draft_chunk_segment, owner_candidates
from shardkv.metadata.chunks_per_shard import ChunksPerShardRule
from shardkv.metadata.documents import META_ROOT, dump_json, load_json
from shardkv.metadata.nodes import NodeCache
from shardkv.transformers import DATA_ROOT, SHARDING_EXTENSION, AbstractStore, build_stack, storage_transformer_entries


@dataclass
class DraftArray:
    """One array of the hierarchy as the proxy knows it: its stored metadata and its transformer stack."""

    path: str
    stored: dict[str, Any]
    entries: list[dict[str, Any]]
    stack: AbstractStore | Exception  # the error when the entries could not be built into a stack
    key_prefix: str = field(init=False)

    def __post_init__(self) -> None:
        self.key_prefix = f"{DATA_ROOT}{self.path}/" if self.path else DATA_ROOT

    @property
    def sharded(self) -> bool:
        """True when the array lists storage transformers."""
        return bool(self.entries)

    def top(self) -> AbstractStore:
        """The top of the array's transformer stack.

        Raises
        ------
        ConfigurationError, UnsupportedError
            If the array's transformers could not be built.
        """
        if isinstance(self.stack, Exception):
            raise self.stack
        return self.stack


def _is_array(state: DraftArray | None) -> bool:
    """True where an array is (the owner rule: the first array met owns the keys below it)."""
    return state is not None


class DraftNodes:
    """Array states of a draft hierarchy, read lazily from the abstract store under the proxy.

    Parameters
    ----------
    api : AbstractStore
        The store under the proxy.
    rule : ChunksPerShardRule
        Which new arrays get a sharding transformer.
    """

    def __init__(self, api: AbstractStore, rule: ChunksPerShardRule) -> None:
        self._api = api
        self.rule = rule
        self._arrays: NodeCache[DraftArray | None] = NodeCache()
        self._suffix: str | None = None
        self._lock = self._arrays.lock

    def refresh(self) -> None:
        """Forget cached metadata."""
        with self._lock:
            self._arrays.forget_under("")
            self._suffix = None

    def metadata_suffix(self) -> str:
        """The root ``zarr.json``'s ``metadata_key_suffix`` (``".json"`` by default)."""
        if self._suffix is None:
            try:
                suffix = load_json("zarr.json", self._api.get("zarr.json")).get("metadata_key_suffix", ".json")
            except KeyError:
                suffix = ".json"
            with self._lock:
                self._suffix = suffix
        return self._suffix

    def array_key(self, path: str) -> str:
        """The key of the metadata document of the array at ``path``."""
        sfx = self.metadata_suffix()
        return f"{META_ROOT}{path}.array{sfx}" if path else f"meta/root.array{sfx}"

    def meta_path(self, key: str) -> str | None:
        """The array path of an array metadata key, ``None`` for other keys."""
        tail = ".array" + self.metadata_suffix()
        if key == "meta/root" + tail:
            return ""
        if key.startswith(META_ROOT) and key.endswith(tail) and len(key) > len(META_ROOT) + len(tail):
            return key[len(META_ROOT) : -len(tail)]
        return None

    def array(self, path: str) -> DraftArray | None:
        """The array at ``path`` (``None``: no array there). Read once, then cached.

        Raises
        ------
        MetadataError
            If its metadata document is not JSON.
        """
        kept = self._arrays.kept([path])
        if kept:
            return kept[path]
        key = self.array_key(path)
        since = self._arrays.generation  # a write meanwhile: what is read here is not kept
        try:
            raw = self._api.get(key)
        except KeyError:
            state = None
        else:
            state = self._make_state(path, load_json(key, raw))
        return self._arrays.load({path: state}, since)[path]

    def _make_state(self, path: str, stored: dict[str, Any]) -> DraftArray:
        entries = storage_transformer_entries(stored, path)
        try:
            stack = build_stack(entries, stored, path, self._api) if entries else self._api
        except (ConfigurationError, NotImplementedError) as exc:  # unknown transformers included
            return DraftArray(path, stored, entries, exc)
        return DraftArray(path, stored, entries, stack)

    def data_owner(self, key: str) -> DraftArray | None:
        """The sharded array whose data area holds ``key`` (first array met from the root)."""
        if not key.startswith(DATA_ROOT):
            return None
        return self._sharded_owner(list(owner_candidates(key[len(DATA_ROOT) :], is_draft_chunk_segment)))

    def prefix_owner(self, prefix: str) -> DraftArray | None:
        """The sharded array whose data area contains every key starting with ``prefix``."""
        if not prefix.startswith(DATA_ROOT):
            return None
        complete = prefix[len(DATA_ROOT) :].rpartition("/")[0]  # the segments before the last "/"
        return self._sharded_owner(list(owner_candidates(f"{complete}/-" if complete else "-")))

    def _sharded_owner(self, paths: list[str]) -> DraftArray | None:
        """The first array among ``paths`` (from the root down) if it is sharded (an unsharded one owns its keys)."""
        state = self._arrays.first(paths, _is_array, self.array).node
        return state if state is not None and state.sharded else None

    def forget(self, key: str) -> None:
        """Forget what a metadata key described (after it was written or erased)."""
        path = self.meta_path(key)
        with self._lock:
            if path is not None:
                self._arrays.forget(path)
            if key == "zarr.json":
                self._suffix = None

    def visible_metadata(self, path: str, raw: bytes) -> bytes:
        """An array's metadata as code above the proxy sees it: without the transformers shardkv applies.

        Raises
        ------
        UnsupportedError
            If the array names a transformer shardkv does not know.
        """
        state = self.array(path)
        if state is None or not state.sharded:
            return raw
        state.top()  # refuses unknown transformers
        return dump_json({k: v for k, v in state.stored.items() if k != "storage_transformers"})

    def store_metadata(self, path: str, key: str, raw: bytes) -> None:
        """Store an array's metadata written from above, with the array's transformers.

        Raises
        ------
        ConfigurationError
            If the document lists ``storage_transformers`` itself, or changes
            the chunk grid of a sharded array.
        """
        doc = load_json(key, raw)
        if doc.get("storage_transformers"):
            raise ConfigurationError(
                f"metadata written to {key!r} lists storage_transformers {doc['storage_transformers']!r}; "
                "shardkv applies the array's transformers itself (pass chunks_per_shard to the proxy)",
                path,
            )
        entries = self._entries_for(path, doc)
        if entries:
            stored = {**doc, "storage_transformers": entries}
            state = self._make_state(path, stored)
            state.top()
            self._api.set(key, dump_json(stored, key=key))
        else:
            state = DraftArray(path, doc, [], self._api)
            self._api.set(key, raw)
        self._arrays.set(path, state)

    def _entries_for(self, path: str, doc: dict[str, Any]) -> list[dict[str, Any]]:
        """The stored transformers of an existing sharded array, else the sharding entry the rule gives."""
        old = self.array(path)
        grid = doc.get("chunk_grid") or {}
        if old is not None and old.sharded:
            old.top()
            old_grid = old.stored.get("chunk_grid") or {}
            if list(grid.get("chunk_shape", [])) != list(old_grid.get("chunk_shape", [])) or grid.get(
                "separator"
            ) != old_grid.get("separator"):
                raise ConfigurationError(
                    f"cannot change the chunk grid of a sharded array from {old_grid} to {grid}; "
                    "delete the array first",
                    path,
                )
            return old.entries
        cps = self.rule.for_array(path, len(doc.get("shape", [])))
        if cps is None:
            return []
        return [{"extension": SHARDING_EXTENSION, "type": "indexed", "configuration": {"chunks_per_shard": list(cps)}}]

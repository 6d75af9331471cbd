"""From an array's ``storage_transformers`` metadata to a stack of transformers.

A metadata entry names a transformer by ``extension`` (a URI) and ``type``.
:func:`resolve` finds the class registered for the pair; an entry nobody
registered is refused with :class:`~shardkv.errors.UnsupportedError` (naming the entry), never
skipped (skipping a transformer would read its stored bytes as if they were
the array's chunks). :func:`build_stack` builds the whole stack over a store:
the first entry is the outermost transformer (closest to the array), as in
zarr-python 2.18. A sharding transformer sits directly on the store (its
engine uses the store's generations and locks), and one array has at most
one: a stack of two is refused (:func:`build_stack` says why).

A transformer class registers with :func:`register` and provides
``from_metadata(entry, array_metadata, array_path, underlying, chunk_shape, **options)``
and ``outer_chunk_shape(entry, chunk_shape)``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from shardkv.errors import ConfigurationError, UnsupportedError

from .api import AbstractStore
from .sharding import ShardingStorageTransformer, stacked_refusal


class TransformerClass(Protocol):
    """What :func:`register` takes: a transformer class, with these class attributes and class methods."""

    @property
    def extension(self) -> str:
        """The extension URI of its metadata entries."""

    @property
    def types(self) -> Sequence[str]:
        """The ``type`` values of its metadata entries."""

    def from_metadata(
        self,
        entry: Mapping[str, Any],
        array_metadata: Mapping[str, Any],
        array_path: str,
        underlying: AbstractStore,
        chunk_shape: Sequence[int] | None = None,
        **options: Any,
    ) -> AbstractStore:
        """The transformer an entry describes, over ``underlying``."""

    def outer_chunk_shape(self, entry: Mapping[str, Any], chunk_shape: Sequence[int]) -> list[int]:
        """The chunk shape the store below sees, for ``chunk_shape`` above (elements)."""


_REGISTRY: dict[tuple[str, str], TransformerClass] = {}


def register(
    cls: TransformerClass, extension: str | None = None, types: Sequence[str] | None = None
) -> TransformerClass:
    """Register a transformer class for an extension URI and its types (returns ``cls``)."""
    ext = extension if extension is not None else cls.extension
    for t in types if types is not None else cls.types:
        _REGISTRY[(ext, t)] = cls
    return cls


def registered() -> list[tuple[str, str]]:
    """The registered ``(extension, type)`` pairs."""
    return sorted(_REGISTRY)


def resolve(entry: Mapping[str, Any], path: str | None = None) -> TransformerClass:
    """The class registered for a ``storage_transformers`` entry.

    Raises
    ------
    ConfigurationError
        If ``entry`` is not an object with an ``extension``.
    UnsupportedError
        If no class is registered for its ``extension`` and ``type``.
    """
    if not isinstance(entry, Mapping) or "extension" not in entry:
        raise ConfigurationError(f"a storage_transformers entry is an object with an 'extension', got {entry!r}", path)
    kind = entry.get("type")
    cls = _REGISTRY.get((entry["extension"], kind)) if isinstance(kind, str) else None
    if cls is None:
        where = f"array {path!r}: " if path is not None else ""
        choices = ", ".join(f"{e} ({t})" for e, t in registered()) or "none"
        raise UnsupportedError(
            f"{where}storage transformer {entry['extension']!r} of type {entry.get('type')!r} is not supported, "
            f"so the array cannot be read or written safely (registered: {choices})"
        )
    return cls


def storage_transformer_entries(array_metadata: Mapping[str, Any], path: str | None = None) -> list[dict[str, Any]]:
    """The ``storage_transformers`` list of array metadata (``[]`` when absent).

    Raises
    ------
    ConfigurationError
        If the field is present but not a list.
    """
    entries = array_metadata.get("storage_transformers") or []
    if not isinstance(entries, list):
        raise ConfigurationError(f"storage_transformers must be a list, got {entries!r}", path)
    return [dict(e) if isinstance(e, Mapping) else e for e in entries]


def build_stack(
    entries: Sequence[Mapping[str, Any]],
    array_metadata: Mapping[str, Any],
    array_path: str,
    store: AbstractStore,
    **options: Any,
) -> AbstractStore:
    """The transformers of ``entries`` stacked over ``store``; ``store`` itself for no entries.

    Parameters
    ----------
    entries : sequence of mapping
        ``storage_transformers`` entries, outermost first.
    array_metadata : mapping
        The array's 2022 draft metadata (``shape``, ``chunk_grid``).
    array_path : str
        The array's path in the hierarchy.
    store : AbstractStore
        The store at the bottom of the stack.
    **options
        Runtime options passed to every transformer's ``from_metadata`` (for
        the sharding transformer: ``index_cache_bytes``, ``read_policy``,
        ``concurrency``, ...).

    Raises
    ------
    UnsupportedError
        If an entry is not registered (every entry is resolved before any is built); for
        more than one sharding transformer: each would hold its shards' locks while the
        one below takes its own, so two writers of crossing shards could take the same
        locks in opposite orders and wait for each other (a deadlock until the lock timeout).
    ConfigurationError
        If an entry's configuration does not fit the array.
    """
    classes = [resolve(e, array_path) for e in entries]
    sharding = [e for cls, e in zip(classes, entries, strict=True) if _is_sharding(cls)]
    if len(sharding) > 1:
        listed = ", ".join(str((e.get("configuration") or {}).get("chunks_per_shard")) for e in sharding)
        raise UnsupportedError(stacked_refusal(array_path, len(sharding), f"chunks_per_shard {listed}"))
    chunk_shape = list((array_metadata.get("chunk_grid") or {}).get("chunk_shape", []))
    seen = []
    for cls, entry in zip(classes, entries, strict=True):
        seen.append(chunk_shape)
        chunk_shape = cls.outer_chunk_shape(entry, chunk_shape)
    top = store
    for cls, entry, shape in reversed(list(zip(classes, entries, seen, strict=True))):
        top = cls.from_metadata(entry, array_metadata, array_path, top, shape, **options)
    return top


def _is_sharding(cls: Any) -> bool:
    return isinstance(cls, type) and issubclass(cls, ShardingStorageTransformer)


register(ShardingStorageTransformer)

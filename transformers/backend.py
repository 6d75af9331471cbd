"""The shard engine's backend over a transformer's underlying store.

:class:`UnderlyingBackend` gives :class:`shardkv.engine.planner.ShardIO` the
:class:`~shardkv.engine.backend.ShardBackend` operations in terms of the 2022
draft's abstract store interface, one call each:

======================  ==========================================================
backend operation       call on the underlying ``AbstractStore``
======================  ==========================================================
``get_ranges``          1 ``get_partial_values``
``get_many``            1 ``get_partial_values`` (whole values)
``set_many``            1 ``set_values``
``delete_many``         1 ``erase_values``
``write_at``            1 ``set_partial_values`` (a negative offset counts from the end)
``size``                ``size_if_free``, else the length of the value (1 read)
======================  ==========================================================

Ranged reads are always available (``get_partial_values``); positional
writes count as cheap (the ``append``/``inplace`` strategies) only where the
underlying store says so (``supports_positional_writes``), but ``write_at``
always works, so the draft's in-place index update on erase does too.
"""

from __future__ import annotations

from typing import Any, Hashable, Iterable, Mapping, Sequence

from shardkv.format.ranges import ByteRange
from shardkv.storage.buffers import join_parts

from .api import AbstractStore

__all__ = ["UnderlyingBackend"]


class UnderlyingBackend:
    """A :class:`~shardkv.engine.backend.ShardBackend` over an :class:`~shardkv.transformers.api.AbstractStore`.

    Parameters
    ----------
    store : AbstractStore
        The underlying store: the next transformer of a stack, or an
        :class:`~shardkv.transformers.adapter.AdapterStore`.
    """

    supports_ranges = True

    def __init__(self, store: AbstractStore) -> None:
        self.store = store

    def __repr__(self) -> str:
        return f"UnderlyingBackend({self.store!r})"

    @property
    def inner(self) -> Any:
        """The store adapter under an :class:`~shardkv.transformers.adapter.AdapterStore` (same keys), else ``None``.

        Through it the engine finds the data's location, hence its locks and
        conditional writes (:func:`shardkv.engine.concurrency.plan_concurrency`).
        """
        return getattr(self.store, "adapter", None)

    @property
    def supports_append(self) -> bool:
        return self.store.supports_positional_writes

    def get(self, key: str) -> bytes:
        return self.store.get(key)

    def get_many(self, keys: Sequence[str]) -> dict[str, bytes]:
        keys = list(keys)
        if not keys:
            return {}
        values = self.store.get_partial_values([(k, ByteRange(0)) for k in keys])
        return {k: v for k, v in zip(keys, values) if v is not None}

    def get_ranges(self, requests: Sequence[tuple[str, ByteRange]]) -> list[bytes | None]:
        return self.store.get_partial_values(list(requests)) if requests else []

    def set(self, key: str, value: bytes) -> None:
        self.store.set_values({key: value})

    def set_many(self, values: Mapping[str, bytes | list[bytes]]) -> None:
        if values:  # the underlying store takes one object per key: shard parts are joined here, once
            self.store.set_values({k: join_parts(v) if isinstance(v, (list, tuple)) else v for k, v in values.items()})

    def delete_many(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        if keys:
            self.store.erase_values(keys)

    def write_at(self, key: str, writes: Sequence[tuple[int, bytes]]) -> None:
        self.store.set_partial_values([(key, offset, data) for offset, data in writes])

    def size(self, key: str) -> int:
        size = self.store.size_if_free(key)
        return len(self.store.get(key)) if size is None else size

    def size_if_free(self, key: str) -> int | None:
        return self.store.size_if_free(key)

    def validator(self, key: str) -> Hashable:
        return self.store.validator(key)

"""The proxy's memo of routed keys (``ShardedStore._route``), counted: parses, owner walks and shards read.

A key routed once is answered from the memo (no validation, owner look-up or
parse again) while the node table's generation stays; a metadata change
(an array recreated with other chunks, ``rmdir``, ``refresh``) starts a new
memo, so a chunk is never read with the old routing. Counts only, no timing.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import zarr

import shardkv.proxy.store as store_module
from shardkv import ShardedStore
from shardkv.errors import ChunkOutOfGridError, InvalidKeyError
from shardkv.keys.space import ShardedArray


@pytest.fixture()
def locates(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every key :meth:`ShardedArray.locate` parses (in order)."""
    seen: list[str] = []
    inner = ShardedArray.locate

    def counting(self: ShardedArray, chunk_key: str, **kwargs: Any) -> Any:
        seen.append(chunk_key)
        return inner(self, chunk_key, **kwargs)

    monkeypatch.setattr(ShardedArray, "locate", counting)
    return seen


def make(store: ShardedStore, chunks: int, data: np.ndarray) -> Any:
    z = zarr.open_array(
        store, mode="w", path="a", shape=data.shape, chunks=(chunks,), dtype="i4", compressor=None, fill_value=0
    )
    z[:] = data
    return z


def shard_gets(store: ShardedStore) -> list[str]:
    """Records the shard keys the base store is asked for (metadata left out)."""
    kv = store.engine.kv
    asked: list[str] = []
    inner = kv.get_many

    def counting(reads: Any) -> Any:
        asked.extend(r[0] for r in reads if not r[0].rsplit("/", 1)[-1].startswith((".z", "zarr.json")))
        return inner(reads)

    kv.get_many = counting  # type: ignore[method-assign]
    return asked


def test_a_key_routed_once_is_not_parsed_again(locates: list[str]) -> None:
    store = ShardedStore({}, chunks_per_shard=4)
    data = np.arange(64, dtype="i4")
    make(store, 4, data)
    locates.clear()
    for _ in range(3):
        assert bytes(store["a/5"]) == data[20:24].tobytes()
        assert "a/5" in store
    assert locates == ["a/5"]


def test_recreated_array_with_other_chunks_is_never_read_with_the_old_routing(locates: list[str]) -> None:
    store = ShardedStore({}, chunks_per_shard=4)
    old = np.arange(64, dtype="i4")
    make(store, 4, old)  # chunk a/5 = elements 20..23, in shard a/1
    assert bytes(store["a/5"]) == old[20:24].tobytes()
    asked = shard_gets(store)
    new = np.arange(64, dtype="i4") * -1
    z = make(store, 2, new)  # chunk a/5 = elements 10..11, in shard a/1 of 8-element shards
    locates.clear()
    asked.clear()
    assert bytes(store["a/5"]) == new[10:12].tobytes()
    assert locates == ["a/5"]  # routed again after the metadata change
    assert asked == ["a/1"]
    np.testing.assert_array_equal(z[:], new)
    # chunk a/20 is out of the old grid (16 chunks) and in the new one (32): no stale refusal
    assert bytes(store["a/20"]) == new[40:42].tobytes()


def test_shrunk_grid_refuses_a_key_routed_before() -> None:
    store = ShardedStore({}, chunks_per_shard=4)
    make(store, 4, np.arange(64, dtype="i4"))
    assert "a/15" in store
    make(store, 4, np.arange(32, dtype="i4"))  # 8 chunks now
    assert "a/15" not in store
    with pytest.raises(ChunkOutOfGridError):
        store["a/15"]


def test_rmdir_and_refresh_start_a_new_memo(locates: list[str]) -> None:
    base: dict[str, Any] = {}
    store = ShardedStore(base, chunks_per_shard=4)
    data = np.arange(64, dtype="i4")
    make(store, 4, data)
    store["a/0"]
    locates.clear()
    store.refresh()
    assert bytes(store["a/0"]) == data[:4].tobytes()
    assert locates == ["a/0"]
    store.rmdir("a")
    store["a/0"] = b"plain"  # no array now: a key stored as it is
    assert base["a/0"] == b"plain"
    assert locates == ["a/0"]  # a plain key is not parsed as a chunk


def test_keys_that_raise_are_not_kept() -> None:
    store = ShardedStore({}, chunks_per_shard=4)
    make(store, 4, np.arange(64, dtype="i4"))
    for _ in range(2):
        with pytest.raises(ChunkOutOfGridError):
            store["a/99"]
        with pytest.raises(InvalidKeyError):
            store["a/05"]
        with pytest.raises(InvalidKeyError):
            store["../x"]
    assert [1] not in store  # type: ignore[operator]
    assert 5 not in store  # type: ignore[operator]
    _, routes = store._routes
    assert "a/99" not in routes and "a/05" not in routes and "../x" not in routes


def test_memo_is_bounded(monkeypatch: pytest.MonkeyPatch, locates: list[str]) -> None:
    monkeypatch.setattr(store_module, "ROUTE_MEMO_LIMIT", 5)
    store = ShardedStore({}, chunks_per_shard=4)
    data = np.arange(64, dtype="i4")
    make(store, 4, data)
    locates.clear()
    for i in range(16):
        assert bytes(store[f"a/{i}"]) == data[4 * i : 4 * i + 4].tobytes()
        assert len(store._routes[1]) <= 5
    assert len(locates) == 16
    store["a/15"]  # still kept (the memo started over at a/15)
    assert len(locates) == 16
    store["a/0"]  # forgotten: parsed again, same answer
    assert locates[-1] == "a/0"


def test_listed_names_routed_for_sizes_are_not_kept() -> None:
    base: dict[str, Any] = {"x/..": b"odd", "x/y": b"ok"}  # a name no proxy key may have, left there by another tool
    store = ShardedStore(base)
    store.getsize("x")
    with pytest.raises(InvalidKeyError):
        store["x/.."]
    assert bytes(store["x/y"]) == b"ok"

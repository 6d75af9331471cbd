"""zarr-python 3's own store conformance suite (``zarr.testing.store.StoreTests``) on shardkv.zarr3.ShardedStore.

Two bases: ``MemoryStore`` and ``LocalStore``. The suite writes and reads
arbitrary keys (no arrays), so it proves the pass-through half of the store and
its Store protocol (open/close, read-only, pickling, equality, listing, ranged
reads). The sharded half is proved in ``test_zarr3_store.py`` and by the
stateful test below, which runs zarr 3's own random store operations against a
MemoryStore model with a sharded array in the hierarchy.

Skips: the suite's sync-API tests (``test_get_sync``, ``test_set_sync``,
``test_delete_sync*``, ``test_*_parity``) skip with "store does not implement
SupportsGetSync/SupportsSetSync/SupportsDeleteSync": those protocols are
optional in zarr 3 (``zarr.abc.store`` documents them as an opt-in fast path)
and ShardedStore serves zarr through the async Store API only.
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest

pytest.importorskip("zarr.abc.store")
pytest.importorskip("pytest_asyncio")

import zarr  # noqa: E402
from zarr.core.buffer import Buffer, cpu, default_buffer_prototype  # noqa: E402
from zarr.storage import LocalStore, MemoryStore  # noqa: E402
from zarr.testing.store import StoreTests  # noqa: E402

from shardkv.zarr3 import ShardedStore  # noqa: E402

pytestmark = [
    pytest.mark.zarr3,
    # zarr's stateful machines draw data types that zarr itself calls unspecified in v3 (fixed-length
    # bytes); what they check is the store, not the data type's specification
    pytest.mark.filterwarnings("ignore:The data type .* does not have a Zarr V3 specification"),
]


class _ShardedStoreTests(StoreTests[ShardedStore, cpu.Buffer]):
    store_cls = ShardedStore
    buffer_cls = cpu.Buffer

    async def set(self, store: ShardedStore, key: str, value: Buffer) -> None:
        # bypass ShardedStore: write the store underneath
        if not store.base._is_open:
            await store.base._open()
        await store.base.set(key, value)

    async def get(self, store: ShardedStore, key: str) -> Buffer:
        value = await store.base.get(key, prototype=default_buffer_prototype())
        assert value is not None
        return value

    def test_store_supports_writes(self, store: ShardedStore) -> None:
        assert store.supports_writes

    def test_store_supports_listing(self, store: ShardedStore) -> None:
        assert store.supports_listing

    def test_store_repr(self, store: ShardedStore) -> None:
        assert repr(store) == f"ShardedStore({store.base!r}, chunks_per_shard=2)"


class TestOverMemoryStore(_ShardedStoreTests):
    @pytest.fixture
    def store_kwargs(self) -> dict[str, Any]:
        return {"store": MemoryStore(), "chunks_per_shard": 2}

    async def test_serializable_store(self, store: ShardedStore) -> None:
        # zarr's test asserts copy == store, which MemoryStore meets by comparing its dicts by
        # value; an unpickled MemoryStore holds a copy of the dict, another store (zarr's own
        # _stores_share_data says so), and two ShardedStores are equal only over one store
        await store.set("foo", cpu.Buffer.from_bytes(b"\x01\x02"))
        copy: ShardedStore = pickle.loads(pickle.dumps(store))
        assert copy != store and copy.read_only == store.read_only
        value = await copy.get("foo", prototype=default_buffer_prototype())
        assert value is not None and value.to_bytes() == b"\x01\x02"
        await copy.set("bar", cpu.Buffer.from_bytes(b"\x03"))
        assert not await store.exists("bar")


class TestOverLocalStore(_ShardedStoreTests):
    @pytest.fixture
    def store_kwargs(self, tmp_path: Any) -> dict[str, Any]:
        return {"store": LocalStore(str(tmp_path)), "chunks_per_shard": 2}


@pytest.mark.parametrize("base_kind", ["memory", "local"])
def test_pickled_store_reads_the_same_shards(base_kind: str, tmp_path: Any) -> None:
    base = MemoryStore() if base_kind == "memory" else LocalStore(str(tmp_path))
    store = ShardedStore(base, chunks_per_shard=2)
    z = zarr.create_array(store, shape=(8, 8), chunks=(2, 2), dtype="i4")
    z[:] = np.arange(64, dtype="i4").reshape(8, 8)
    copy = pickle.loads(pickle.dumps(store))
    # a LocalStore copy is the same directory; a MemoryStore copy holds a copy of the dict
    assert (copy == store) is (base_kind == "local")
    np.testing.assert_array_equal(zarr.open_array(copy, mode="r")[:], z[:])


@pytest.mark.parametrize("machine", ["ZarrHierarchyStateMachine", "ZarrStoreStateMachine"])
def test_zarr_stateful_machines_hold(machine: str) -> None:
    """zarr 3's stateful tests (bounded examples) against its MemoryStore model.

    ``ZarrHierarchyStateMachine`` creates groups and arrays, writes, resizes and
    deletes through the store and compares every listing with the model: with
    ``chunks_per_shard=2`` its arrays are stored sharded, so the chunk keys
    listed come from shard indexes. ``ZarrStoreStateMachine`` sets, gets,
    deletes and lists arbitrary keys (the pass-through half). Over a MemoryStore
    only: zarr's own machine exempts LocalStore from its ``list_dir`` check
    (empty directories stay behind deleted chunks), which a wrapper cannot
    signal, and local shard writes fsync, so the bounded run would take minutes.
    """
    pytest.importorskip("hypothesis")
    import hypothesis.stateful
    from zarr.testing import stateful

    settings = hypothesis.settings(
        max_examples=15,
        stateful_step_count=15,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(hypothesis.HealthCheck),
    )
    cls = getattr(stateful, machine)
    if machine == "ZarrStoreStateMachine":
        cls = _store_machine_without_reserved_names(stateful)
    hypothesis.stateful.run_state_machine_as_test(
        lambda: cls(ShardedStore(MemoryStore(), chunks_per_shard=2)), settings=settings
    )


def _store_machine_without_reserved_names(stateful: Any) -> Any:
    """zarr's store machine setting no key shardkv keeps for its own files (they are refused, as
    tests/v3/test_zarr3_store.py proves); Hypothesis also draws string constants of the code under test."""
    import hypothesis.strategies as st
    from hypothesis.stateful import rule
    from zarr.testing.strategies import keys

    from shardkv.errors import ReservedKeyError
    from shardkv.storage.kv import check_not_reserved

    def allowed(key: str) -> bool:
        try:
            check_not_reserved(key)
        except ReservedKeyError:
            return False
        return True

    class Machine(stateful.ZarrStoreStateMachine):
        @rule(key=keys().filter(allowed), data=st.binary(min_size=0, max_size=stateful.MAX_BINARY_SIZE))
        def set(self, key: str, data: bytes) -> None:
            super().set(key, data)

    return Machine

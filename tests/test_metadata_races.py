"""Consolidated blocks never lose an entry to a concurrent writer.

zarr-python 3 takes a group's consolidated block for the whole hierarchy below
it, so an entry one writer drops hides that array from every v3 reader. These
tests make writers of one hierarchy overlap: processes that create arrays at
once behind a barrier, and two ``ShardedStore`` objects of one process whose
writes are interleaved on purpose (one's write lands between the other's read
and its write). After each, the root block lists every array, zarr-python 2.18
through the proxy lists and reads them, and zarr-python 2.18's own
``DirectoryStore`` (no shardkv) reads the unsharded ones.
"""

from __future__ import annotations

import json
import multiprocessing
from collections.abc import Callable, Iterator, MutableMapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

import shardkv.proxy.metadata_writes as metadata_writes
from shardkv import ShardedStore
from shardkv.engine.retry import Backoff
from shardkv.errors import ConcurrentUpdateError

pytestmark = pytest.mark.filterwarnings("ignore::shardkv.PartialShardWriteWarning")

CPS = (2, 2)  # 2-d arrays sharded, 1-d ones not
N_PROCESSES = 4
N_ARRAYS = 5
JOIN_SECONDS = 120.0


def _seed(store: MutableMapping[str, Any]) -> None:
    """A v3 hierarchy with a consolidated root block, made by ``zarr.consolidate_metadata``."""
    root = zarr.open_group(store, mode="w")
    root.attrs["title"] = "races"
    root.create_dataset("seed", shape=(4, 4), chunks=(2, 2), dtype="i4")[...] = np.arange(16).reshape(4, 4)
    root.create_group("shared")
    zarr.consolidate_metadata(store)


def _block_of(store: ShardedStore, group: str = "") -> dict[str, Any]:
    """The consolidated block stored in the group's ``zarr.json`` (read from the base store): path -> entry."""
    key = f"{group}/zarr.json" if group else "zarr.json"
    raw = store.base.values([key])[key]
    return json.loads(bytes(raw))["consolidated_metadata"]["metadata"]  # type: ignore[no-any-return]


def _create(group: zarr.hierarchy.Group, path: str, sharded: bool, value: int) -> None:
    """One array at ``path``: 2-d (sharded) or 1-d (unsharded), filled with ``value``."""
    shape, chunks = ((4, 6), (2, 2)) if sharded else ((5,), (2,))
    group.create_dataset(path, shape=shape, chunks=chunks, dtype="i4")[...] = value


def _expected_paths(workers: int, arrays: int) -> dict[str, tuple[bool, int]]:
    """Path -> (sharded, value) of every array the workers create: at the root and in a shared group."""
    out: dict[str, tuple[bool, int]] = {}
    for w in range(workers):
        for j in range(arrays):
            where = "shared/" if j % 2 else ""
            out[f"{where}w{w}_{j}"] = (j % 3 != 1, 100 * w + j)
    return out


def _worker(root: str, worker: int, barrier: Any) -> None:
    store = ShardedStore(root, chunks_per_shard=CPS)
    group = zarr.open_group(store, mode="a")
    list(group.array_keys())  # every process has read (and cached) the root before any of them writes
    barrier.wait(timeout=60)
    for path, (sharded, value) in _expected_paths(N_PROCESSES, N_ARRAYS).items():
        if path.rpartition("/")[2].startswith(f"w{worker}_"):
            _create(group, path, sharded, value)
    store.close()


def _assert_hierarchy(root: Path, expected: dict[str, tuple[bool, int]]) -> None:
    """The root block lists every array; zarr 2 lists and reads them through the proxy and on its own store."""
    with ShardedStore(str(root), chunks_per_shard=CPS) as store:
        block = _block_of(store)
        missing = sorted(p for p in [*expected, "seed", "shared"] if p not in block)
        assert not missing, f"the root's consolidated block lost {missing}"
        for path, (sharded, _) in expected.items():
            assert block[path]["node_type"] == "array"
            assert block[path]["shape"] == ([4, 6] if sharded else [5])
        group = zarr.open_group(store, mode="r")
        listed = {*group.array_keys(), *(f"shared/{k}" for k in group["shared"].array_keys())}
        assert listed == {*expected, "seed"}
        for path, (_, value) in expected.items():
            assert (group[path][...] == value).all()
    plain = zarr.DirectoryStore(str(root))  # zarr 2's own store reads the unsharded ones (the root is v3)
    for path, (sharded, value) in expected.items():
        if not sharded:
            assert (zarr.open_array(plain, path=path, mode="r")[...] == value).all()


def test_processes_creating_arrays_at_once_all_stay_in_the_root_block(tmp_path: Path) -> None:
    root = tmp_path / "h.zarr"
    with ShardedStore(str(root), chunks_per_shard=CPS) as store:
        _seed(store)
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(N_PROCESSES)
    procs = [ctx.Process(target=_worker, args=(str(root), w, barrier)) for w in range(N_PROCESSES)]
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join(JOIN_SECONDS)
        assert [p.exitcode for p in procs] == [0] * N_PROCESSES
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
    _assert_hierarchy(root, _expected_paths(N_PROCESSES, N_ARRAYS))


@pytest.fixture(params=["directory", "dict"])
def base(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """The base store both ``ShardedStore`` objects open: a local directory, or one dict."""
    yield str(tmp_path / "h.zarr") if request.param == "directory" else {}


def _after_first_call(
    target: Any, name: str, action: Callable[[], None], when: Callable[[Any], bool] = lambda arg: True
) -> list[int]:
    """Wrap ``target.name`` so that ``action`` runs once, right after the first call whose argument is ``when``.

    Returns the list that counts those calls.
    """
    original = getattr(target, name)
    calls: list[int] = []

    def wrapped(arg: Any) -> Any:
        out = original(arg)
        if when(arg):
            calls.append(1)
            if len(calls) == 1:
                action()
        return out

    setattr(target, name, wrapped)
    return calls


def test_a_write_between_anothers_read_and_write_keeps_both_entries(base: Any) -> None:
    """Store ``b`` read the root's block; store ``a`` adds an array; then ``b`` writes its own."""
    a, b = ShardedStore(base, chunks_per_shard=CPS), ShardedStore(base, chunks_per_shard=CPS)
    _seed(a)
    group_a, group_b = zarr.open_group(a, mode="a"), zarr.open_group(b, mode="a")
    list(group_b.array_keys())
    # b's write reads the groups above its arrays; a's array lands right after that read
    _after_first_call(b._nodes, "nodes", lambda: _create(group_a, "from_a", True, 1))
    _create(group_b, "from_b", True, 2)
    _create(group_b, "shared/plain_b", False, 3)  # an unsharded one (a mirror) after it
    _create(group_a, "shared/plain_a", False, 4)  # a's cached root predates b's writes
    expected = {"from_a": (True, 1), "from_b": (True, 2), "shared/plain_b": (False, 3), "shared/plain_a": (False, 4)}
    with ShardedStore(base, chunks_per_shard=CPS) as fresh:
        block = _block_of(fresh)
        assert sorted(p for p in expected if p not in block) == []
        group = zarr.open_group(fresh, mode="r")
        for path, (_, value) in expected.items():
            assert (group[path][...] == value).all()
    if isinstance(base, str):
        _assert_hierarchy(Path(base), expected)


def _reads_root(reads: Any) -> bool:
    """True for a ``get_many`` whose reads include the root's ``zarr.json``."""
    return any(request[0] == "zarr.json" for request in reads)


def _unlocked_pair() -> tuple[dict[str, Any], ShardedStore, ShardedStore, zarr.hierarchy.Group, zarr.hierarchy.Group]:
    """One seeded dict, two stores over it without locks (``concurrency="none"``), and their root groups.

    Store ``b`` has read the root before any write of the test.
    """
    base: dict[str, Any] = {}
    a = ShardedStore(base, chunks_per_shard=CPS, concurrency="none")
    b = ShardedStore(base, chunks_per_shard=CPS, concurrency="none")
    _seed(a)
    group_a, group_b = zarr.open_group(a, mode="a"), zarr.open_group(b, mode="a")
    list(group_b.array_keys())
    return base, a, b, group_a, group_b


def test_a_lost_conditional_put_reads_again_and_keeps_both_entries() -> None:
    """Without locks (``concurrency="none"``), ``a``'s write lands between ``b``'s fresh read and its put."""
    base, a, b, group_a, group_b = _unlocked_pair()
    calls = _after_first_call(b.base, "get_many", lambda: _create(group_a, "from_a", True, 1), _reads_root)
    _create(group_b, "from_b", False, 2)
    assert len(calls) == 2  # b read the root again after its put lost, once
    block = _block_of(a)
    assert "from_a" in block and "from_b" in block
    assert (zarr.open_group(ShardedStore(base), mode="r")["from_a"][...] == 1).all()


def test_a_block_that_keeps_changing_raises_concurrent_update_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every round of ``b`` loses to another write: after the bounded rounds, an error naming the group's key."""
    base, a, b, group_a, group_b = _unlocked_pair()
    monkeypatch.setattr(metadata_writes, "WRITE_BACKOFF", Backoff(0.0, 1.0, 0.0))
    original = b.base.get_many
    rounds: list[int] = []

    def read_then_lose(reads: Any) -> Any:
        out = original(reads)
        if _reads_root(reads):
            rounds.append(1)
            group_a.attrs["round"] = len(rounds)  # a rewrites the root after every read of b
        return out

    monkeypatch.setattr(b.base, "get_many", read_then_lose)
    with pytest.raises(ConcurrentUpdateError) as info:
        _create(group_b, "from_b", True, 2)
    assert info.value.key == "zarr.json" and len(rounds) == metadata_writes.WRITE_ATTEMPTS
    assert "zarr.json" in str(info.value)
    assert "from_b" not in _block_of(a) and _block_of(a)["seed"]["node_type"] == "array"

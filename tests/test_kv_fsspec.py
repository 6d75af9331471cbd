"""The store contract on fsspec filesystems: local files (their generations) and others (process stamps)."""

from __future__ import annotations

import os
import pickle
import uuid
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest
from fsspec.implementations.dirfs import DirFileSystem
from fsspec.implementations.local import LocalFileSystem
from kv_contract import KVContract, put_ok

from shardkv.format.ranges import ByteRange
from shardkv.storage.fsspec import FsspecStore
from shardkv.storage.kv import KVStore

pytestmark = pytest.mark.zarr2


@pytest.fixture
def memory_root() -> Iterator[str]:
    root = f"/kv-{uuid.uuid4().hex[:12]}"
    yield root
    fs = fsspec.filesystem("memory")
    if fs.exists(root):
        fs.rm(root, recursive=True)


class TestMemoryContract(KVContract):
    @pytest.fixture
    def kv(self, memory_root: str) -> KVStore:
        return FsspecStore(fsspec.filesystem("memory"), f"memory://{memory_root}")


class TestStampedContract(KVContract):
    """A filesystem without generations of its own: a DirFileSystem over memory:// (reads through cat_ranges)."""

    @pytest.fixture
    def kv(self, memory_root: str) -> KVStore:
        fsspec.filesystem("memory").mkdir(memory_root)
        return FsspecStore(DirFileSystem(memory_root, fsspec.filesystem("memory")), "")


class CountingLocal(LocalFileSystem):
    """A LocalFileSystem subclass (reads go through fsspec, not around it)."""

    cat_calls = 0

    def cat_file(self, path, start=None, end=None, **kwargs):  # type: ignore[no-untyped-def]
        CountingLocal.cat_calls += 1
        return super().cat_file(path, start=start, end=end, **kwargs)


class TestLocalSubclassContract(KVContract):
    @pytest.fixture
    def kv(self, tmp_path: Path) -> KVStore:
        (tmp_path / "s").mkdir()
        return FsspecStore(CountingLocal(skip_instance_cache=True), str(tmp_path / "s"))


def test_memory_and_a_dirfs_over_it_are_one_stamped_in_process_store(memory_root: str) -> None:
    """``memory://`` has the process stamps of every in-process fsspec filesystem: a store over it and one over a
    ``DirFileSystem`` of the same directory agree on every generation, and see each other's writes."""
    fs = fsspec.filesystem("memory")
    fs.mkdir(memory_root)
    kv = FsspecStore(fs, memory_root)
    dirfs = FsspecStore(DirFileSystem(memory_root, fs), "")
    assert kv.caps == dirfs.caps and kv.caps.stamps == "process" and kv.caps.in_process
    assert kv.location == dirfs.location and kv.location.namespace == ("memory",)
    g = put_ok(kv, "k", b"0123456789")
    assert dirfs.get("k", [ByteRange(0, 2)], if_generation=g).values == [b"01"]
    g2 = put_ok(dirfs, "k", b"abcdefghij", if_generation=g)
    r = kv.get("k", [ByteRange(0, 2)], if_generation=g)
    assert r.state == "stale" and kv.get("k", [ByteRange(0, 2)], if_generation=g2).values == [b"ab"]


def test_stamped_caps(memory_root: str, tmp_path: Path) -> None:
    dirfs = FsspecStore(DirFileSystem(memory_root, fsspec.filesystem("memory")), "")
    assert dirfs.caps.stamps == "process" and dirfs.caps.in_process and not dirfs.caps.lock_dir
    assert not dirfs.caps.round_trips and dirfs.location.namespace == ("memory",)
    local = FsspecStore(CountingLocal(skip_instance_cache=True), str(tmp_path))
    assert local.caps.lock_dir and not local.caps.round_trips and local.caps.stamps == "native"
    before = CountingLocal.cat_calls
    local.put("k", b"abc")
    assert [bytes(b) for b in local.get("k", [ByteRange(1, 2), ByteRange(0, 1)]).values or []] == [b"b", b"a"]
    assert CountingLocal.cat_calls - before == 2  # one cat per range, through the filesystem


def test_pickled_memory_store_reaches_the_same_objects(memory_root: str) -> None:
    kv = FsspecStore(fsspec.filesystem("memory"), memory_root)
    g = kv.put("k", b"v")
    copy = pickle.loads(pickle.dumps(kv))
    assert copy.location == kv.location and copy.get("k", if_generation=g).found


@pytest.mark.parametrize("kind", ["subclass", "dirfs-over-subclass"])
def test_local_files_through_another_filesystem_see_writes_made_elsewhere(tmp_path: Path, kind: str) -> None:
    """Local files reached through a LocalFileSystem subclass (or a DirFileSystem over one) keep the files'
    generations: a value replaced by anyone (here by hand, as another process would) is seen, never read
    at a cached generation."""
    fs = CountingLocal(skip_instance_cache=True)
    kv = FsspecStore(fs, str(tmp_path)) if kind == "subclass" else FsspecStore(DirFileSystem(str(tmp_path), fs), "")
    assert kv.caps.stamps == "native" and kv.caps.lock_dir
    g = put_ok(kv, "a/k", b"0123456789")
    assert kv.get("a/k", [ByteRange(2, 4)], if_generation=g).values == [b"23"]
    replaced = tmp_path / "a" / "new"
    replaced.write_bytes(b"abcdefghij")  # the same size
    os.replace(replaced, tmp_path / "a" / "k")
    stale = kv.get("a/k", [ByteRange(2, 4)], if_generation=g)
    assert stale.state == "stale" and stale.generation != g
    now = kv.get("a/k")
    assert now.whole() == b"abcdefghij" and now.generation == stale.generation and now.size == 10
    assert kv.put("a/k", b"x", if_generation=g) is None  # a condition on the old file fails
    (tmp_path / "a" / "k").unlink()
    assert kv.get("a/k", [], if_generation=now.generation).state == "missing"

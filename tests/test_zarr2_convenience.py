"""zarr-python 2's convenience functions between sharded and plain stores.

Each test does the same thing on zarr's own ``MemoryStore``/``DirectoryStore``
(the oracle) and through a ``ShardedStore`` over a dict and over a directory,
in both directions, and compares what zarr reports and what was stored.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from zarr.errors import CopyError

from shardkv import ShardedStore
from shardkv.errors import KeyBelowKeyError

pytestmark = pytest.mark.filterwarnings("ignore::shardkv.PartialShardWriteWarning")

Factory = Callable[[], Any]


@pytest.fixture(params=["dict", "directory"])
def sharded(request: pytest.FixtureRequest, tmp_path: Path) -> Factory:
    """New ``ShardedStore`` factories (``chunks_per_shard=2``) over a dict or a fresh directory."""
    count = iter(range(100))

    def make() -> ShardedStore:
        if request.param == "dict":
            return ShardedStore({}, chunks_per_shard=2)
        return ShardedStore(str(tmp_path / f"s{next(count)}"), chunks_per_shard=2)

    return make


@pytest.fixture(params=["memory", "directory"])
def plain(request: pytest.FixtureRequest, tmp_path: Path) -> Factory:
    """New zarr 2 stores of its own: ``MemoryStore`` or ``DirectoryStore``."""
    count = iter(range(100))

    def make() -> Any:
        if request.param == "memory":
            return zarr.MemoryStore()
        return zarr.DirectoryStore(str(tmp_path / f"p{next(count)}"))

    return make


def build(store: Any) -> zarr.hierarchy.Group:
    """A hierarchy with attributes on every node: groups, a 2-D sharded array, a 1-D one, a small one."""
    root = zarr.group(store=store)
    root.attrs["title"] = "root"
    g2 = root.create_group("g2")
    g2.attrs["level"] = 2
    x = g2.create_dataset("x", shape=(6, 5), chunks=(2, 2), dtype="i4", fill_value=-1)
    x[:4, :] = np.arange(20).reshape(4, 5)
    x.attrs["units"] = "m"
    y = root.create_dataset("y", shape=(9,), chunks=(2,), dtype="f8", compressor=None)
    y[:] = np.linspace(0, 1, 9)
    root.create_group("g2/inner").create_dataset("s", data=np.arange(3, dtype="u1"), chunks=(3,))
    return root


def snapshot(group: zarr.hierarchy.Group) -> dict[str, Any]:
    """What a reader sees of a hierarchy: every node's kind, attributes, and an array's metadata and data."""
    out: dict[str, Any] = {"/": ("group", dict(group.attrs))}

    def visit(name: str, node: Any) -> None:
        if isinstance(node, zarr.Array):
            out[name] = (
                "array",
                dict(node.attrs),
                node.shape,
                node.chunks,
                node.dtype.str,
                node.fill_value,
                node[...].tolist(),
            )
        else:
            out[name] = ("group", dict(node.attrs))

    group.visititems(visit)
    return out


def test_consolidate_and_open_consolidated(sharded: Factory) -> None:
    store = sharded()
    build(store)
    reference = zarr.MemoryStore()
    build(reference)
    zarr.consolidate_metadata(store)
    zarr.consolidate_metadata(reference)
    ours = json.loads(bytes(store[".zmetadata"]))["metadata"]
    theirs = json.loads(bytes(reference[".zmetadata"]))["metadata"]
    assert sorted(ours) == sorted(theirs)
    for key in theirs:
        if key.endswith(".zarray"):  # JSON equal up to what shardkv adds for zarr 2 (nothing it reads)
            assert {k: ours[key][k] for k in theirs[key]} == theirs[key], key
        else:
            assert ours[key] == theirs[key], key
    assert snapshot(zarr.open_consolidated(store)) == snapshot(zarr.open_consolidated(reference))


def _stored_keys(store: Any) -> set[str]:
    return {k for k in store.keys() if not k.endswith(".zmetadata")}


def test_copy_store_both_directions(sharded: Factory, plain: Factory) -> None:
    source = sharded()
    build(source)
    dest = plain()
    n_copied, n_skipped, n_bytes = zarr.copy_store(source, dest)
    assert (n_copied, n_skipped) == (len(source), 0)
    assert n_bytes == sum(len(bytes(source[k])) for k in source)
    assert _stored_keys(dest) == _stored_keys(source)
    assert snapshot(zarr.open_group(dest, mode="r")) == snapshot(zarr.open_group(source, mode="r"))

    back = sharded()
    assert zarr.copy_store(dest, back)[:2] == (len(dest), 0)
    assert snapshot(zarr.open_group(back, mode="r")) == snapshot(zarr.open_group(dest, mode="r"))
    assert back.sharded_array("g2/x") is not None  # written through the proxy: sharded


@pytest.mark.parametrize("if_exists", ["raise", "skip", "replace"])
def test_copy_store_if_exists_and_dry_run(sharded: Factory, if_exists: str) -> None:
    source, reference_source = sharded(), zarr.MemoryStore()
    build(source)
    build(reference_source)
    results = []
    for src, make in ((source, sharded), (reference_source, zarr.MemoryStore)):
        dest = make()
        build(dest)
        zarr.open_array(dest, path="y", mode="r+")[:] = 7.0
        before = snapshot(zarr.open_group(dest, mode="r"))
        dry = zarr.copy_store(src, dest, if_exists=if_exists, dry_run=True) if if_exists != "raise" else None
        assert snapshot(zarr.open_group(dest, mode="r")) == before  # dry_run writes nothing
        if if_exists == "raise":
            with pytest.raises(CopyError):
                zarr.copy_store(src, dest, if_exists=if_exists)
            results.append((None, None, snapshot(zarr.open_group(dest, mode="r"))))
        else:
            done = zarr.copy_store(src, dest, if_exists=if_exists)
            results.append((dry[:2], done[:2], snapshot(zarr.open_group(dest, mode="r"))))  # type: ignore[index]
    assert results[0] == results[1]


@pytest.mark.parametrize("if_exists", ["raise", "skip", "replace", "skip_initialized"])
def test_copy_and_copy_all_both_directions(sharded: Factory, plain: Factory, if_exists: str) -> None:
    def run(src_store: Any, dst_store: Any) -> tuple[Any, ...]:
        src = build(src_store)
        dst = zarr.group(store=dst_store)
        first = zarr.copy_all(src, dst, dry_run=True)
        assert list(dst.keys()) == []  # dry_run wrote nothing
        copied = zarr.copy_all(src, dst)
        dst["g2/x"][:1] = 99  # the destination diverges, then copy again
        try:
            again: Any = zarr.copy(src["g2/x"], dst["g2"], name="x", if_exists=if_exists)
        except CopyError:
            again = "CopyError"
        one = zarr.copy(src["y"], dst, name="y2", log=None)
        return first, copied, again, one, snapshot(dst)

    oracle = run(plain(), plain())
    assert run(sharded(), plain()) == oracle
    assert run(plain(), sharded()) == oracle
    assert run(sharded(), sharded()) == oracle


def test_tree_and_info_as_on_zarr_stores(sharded: Factory, plain: Factory) -> None:
    ours, theirs = build(sharded()), build(plain())
    assert str(ours.tree()) == str(theirs.tree())

    def items(info: Any) -> dict[str, str]:
        return {k: v for k, v in info.obj.info_items() if k != "Store type"}

    assert items(ours.info) == items(theirs.info)
    for name in ("g2/x", "y", "g2/inner/s"):
        assert items(ours[name].info) == items(theirs[name].info), name
        assert ours[name].nbytes_stored == theirs[name].nbytes_stored, name
        assert ours[name].nchunks_initialized == theirs[name].nchunks_initialized


def test_getsize_is_per_chunk_and_per_direct_member(sharded: Factory) -> None:
    store = sharded()
    build(store)
    reference = zarr.MemoryStore()
    build(reference)
    for path in (
        "",
        "g2",
        "g2/x",
        "g2/x/0.0",
        "g2/x/2.4",
        "g2/x/3.0",
        "g2/x/.zattrs",
        "y",
        "y/4",
        "nothing",
        "g2/x/9.9",
    ):
        assert store.getsize(path) == zarr.storage.getsize(reference, path), path
        assert zarr.storage.getsize(store, path) == store.getsize(path)


def test_getsize_reads_no_chunk(tmp_path: Path) -> None:
    store = ShardedStore(str(tmp_path / "s"), chunks_per_shard=2)  # local files: the engine counts chunk reads
    build(store)
    store.refresh()
    stats = store.engine.stats
    before = (stats.read_attempts, stats.whole_shard_reads)
    sizes = {key: store.getsize(key) for key in ("g2/x/0.0", "g2/x/1.2", "g2/x")}
    assert (stats.read_attempts, stats.whole_shard_reads) == before  # from the shard indexes only
    assert sizes["g2/x/0.0"] == len(bytes(store["g2/x/0.0"])) > 0
    assert sizes["g2/x/1.2"] == len(bytes(store["g2/x/1.2"])) > 0
    assert (stats.read_attempts, stats.whole_shard_reads) != before  # the probe counts chunk reads


def test_rmdir_of_a_stored_key_deletes_nothing(sharded: Factory, plain: Factory) -> None:
    for store in (sharded(), plain()):
        store["a/b"] = b"bb"
        store["a/c/d"] = b"dd"
        store.rmdir("a/b")
        store.rmdir("a/c/d")
        assert bytes(store["a/b"]) == b"bb" and bytes(store["a/c/d"]) == b"dd"
        store.rmdir("a/c")
        assert "a/c/d" not in store and "a/b" in store
        assert store.listdir("a/b") == [] and store.listdir("a") == ["b"]


def test_key_below_a_key_is_refused(sharded: Factory) -> None:
    store = sharded()
    store["a/b"] = b"aaa"
    with pytest.raises(KeyBelowKeyError, match="'a/b/c'.*'a/b' is a stored key") as caught:
        store["a/b/c"] = b"xxx"
    assert isinstance(caught.value, KeyError) and ".shardkv-tmp" not in str(caught.value)
    assert bytes(store["a/b"]) == b"aaa" and "a/b/c" not in store
    store["x/y/z"] = b"zzz"
    store["x/y"] = b"yyy"  # a value replaces the keys in its way, as in zarr 2's own stores
    assert "x/y/z" not in store and bytes(store["x/y"]) == b"yyy"


def test_value_replacing_a_sharded_array(sharded: Factory) -> None:
    store = sharded()
    build(store)
    store["g2/x"] = b"now a value"
    assert list(store.keys_under("g2/x")) == [] and bytes(store["g2/x"]) == b"now a value"
    assert store.sharded_array("g2/x") is None


def test_the_zarr3_store_under_zarr2_names_the_zarr2_store_and_extra():
    import importlib
    import sys

    sys.modules.pop("shardkv.zarr3", None)
    with pytest.raises(ImportError) as info:
        importlib.import_module("shardkv.zarr3")
    text = str(info.value)
    assert "shardkv.ShardedStore" in text and 'pip install "shardkv[zarr2]"' in text
    assert 'pip install "shardkv[zarr3]"' in text
    # as the README says: the extra brings zarr 3.1 on Python 3.11, the newest zarr 3 from Python 3.12
    readme = " ".join((Path(__file__).resolve().parents[1] / "README.md").read_text().split())
    assert "on Python 3.11 that extra installs zarr 3.1" in readme and "zarr >= 3.2 needs Python >= 3.12" in readme
    assert "zarr 3.1 on Python 3.11" in text and "the newest zarr 3 on Python >= 3.12" in text

"""Deleting one metadata key through ShardedStore deletes that key alone, as in any MutableMapping.

Once a hierarchy is stored v3 (one of its arrays is sharded), a group's
``.zgroup`` and ``.zattrs`` and an array's ``.zarray`` and ``.zattrs`` are
presented from one ``zarr.json``. Each of them is still deleted alone: what
remains is presented as it was (``.zattrs`` stays, chunk keys stay chunk keys,
no shard key ever appears as a chunk) until it is deleted too. The oracle is a
plain ``dict`` given the same zarr 2 writes and the same deletes.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import MutableMapping
from typing import Any

import numpy as np
import pytest
import zarr

from shardkv import ShardedStore
from shardkv.errors import ConfigurationError

META = (".zgroup", ".zarray", ".zattrs", ".zmetadata")
DATA = np.arange(8, dtype="i4") * 3
CPS = {"g/s": 2, "g/t": 2, "g/empty": 2, "top": 2}  # g/u stays unsharded (a zarr.json mirror beside its .zarray)


def _build(store: MutableMapping[str, Any]) -> None:
    root = zarr.group(store=store)
    g = root.create_group("g")
    g.attrs["a"] = 1
    root.create_group("e")  # no attributes: .zgroup alone
    s = g.create_dataset("s", shape=(8,), chunks=(2,), dtype="i4")
    s[:] = DATA
    s.attrs["u"] = "K"
    g.create_dataset("t", shape=(8,), chunks=(2,), dtype="i4")[:6] = DATA[:6]  # sharded, no attributes
    u = g.create_dataset("u", shape=(8,), chunks=(2,), dtype="i4")
    u[:] = DATA
    u.attrs["v"] = 2
    root.create_dataset("top", shape=(4, 4), chunks=(2, 2), dtype="f8", dimension_separator="/")[:] = 1.5
    g.create_dataset("empty", shape=(4,), chunks=(2,), dtype="i4").attrs["data"] = 1  # sharded, no chunk written


def _pair() -> tuple[ShardedStore, dict[str, Any]]:
    store = ShardedStore({}, chunks_per_shard=CPS)
    plain: dict[str, Any] = {}
    _build(store)
    _build(plain)
    return store, plain


def _value(key: str, value: Any) -> Any:
    if key.rpartition("/")[2] in META:
        return json.loads(bytes(value))
    return bytes(value)


def _same(store: ShardedStore, plain: dict[str, Any], empty_names: tuple[str, ...] = ()) -> None:
    """The store lists the keys of the plain dict and holds the same values (metadata compared as JSON).

    ``empty_names``: paths that ``listdir`` may still show with nothing under them, as a
    ``DirectoryStore`` shows an emptied directory.
    """
    assert sorted(store) == sorted(plain)
    for key in plain:
        assert key in store, key
        assert _value(key, store[key]) == _value(key, plain[key]), key
    for path in ("", "g", "g/s", "g/t", "g/u", "g/empty", "top", "top/0", "e"):
        names = [n for n in store.listdir(path) if f"{path}/{n}".strip("/") not in empty_names]
        prefix = f"{path}/" if path else ""
        assert names == sorted({k[len(prefix) :].split("/")[0] for k in plain if k.startswith(prefix)}), path
    for path in empty_names:
        assert store.listdir(path) == [] and not [k for k in store if k.startswith(f"{path}/")]


def _metadata_keys(plain: dict[str, Any]) -> list[str]:
    return sorted(k for k in plain if k.rpartition("/")[2] in META)


def test_the_issue_snippet() -> None:
    s = ShardedStore({}, chunks_per_shard=2)
    g = zarr.group(store=s)
    g.create_dataset("arr", shape=(4,), chunks=(1,), dtype="i4")  # sharded: the hierarchy is stored v3
    g2 = g.create_group("g2")
    g2.attrs["a"] = 1
    del s["g2/.zgroup"]
    assert "g2/.zattrs" in s and json.loads(s["g2/.zattrs"]) == {"a": 1}
    assert "g2/.zgroup" not in s


@pytest.mark.parametrize("key", _metadata_keys(_pair()[1]), ids=lambda k: k.replace("/", "_"))
def test_one_metadata_key_deleted_alone(key: str) -> None:
    store, plain = _pair()
    del store[key]
    del plain[key]
    _same(store, plain)
    with pytest.raises(KeyError):
        del store[key]


@pytest.mark.parametrize("order", ["sorted", "reversed", "attrs-first"])
def test_every_metadata_key_deleted_one_by_one(order: str) -> None:
    store, plain = _pair()
    keys = _metadata_keys(plain)
    if order == "reversed":
        keys.reverse()
    elif order == "attrs-first":
        keys.sort(key=lambda k: (not k.endswith(".zattrs"), k))
    for key in keys:
        del store[key]
        del plain[key]
        _same(store, plain)
    # only chunk keys remain, each still the chunk zarr wrote (never a shard)
    assert all(k.rpartition("/")[2] not in META for k in store)
    assert "g/s/0" in store and "g/s/3" in store and len(bytes(store["g/s/3"])) == len(bytes(plain["g/s/3"]))


def test_a_sharded_array_without_its_zarray_keeps_its_chunk_keys() -> None:
    store, plain = _pair()
    for target in (store, plain):
        del target["g/s/.zarray"]
    assert sorted(k for k in store if k.startswith("g/s/")) == ["g/s/.zattrs", "g/s/0", "g/s/1", "g/s/2", "g/s/3"]
    # a chunk deleted and written while the array has no .zarray: still a chunk, its shard keeps the others
    for target in (store, plain):
        del target["g/s/1"]
        target["g/s/2"] = plain["g/s/0"]
    _same(store, plain)
    # the .zarray written back: zarr 2 reads the array as a plain dict gives it
    for target in (store, plain):
        target["g/s/.zarray"] = plain.get("g/t/.zarray")
    _same(store, plain)
    np.testing.assert_array_equal(
        zarr.open_array(store, path="g/s", mode="r")[:], zarr.open_array(plain, path="g/s", mode="r")[:]
    )


def test_an_array_created_again_with_its_chunks_reads_them_as_chunks() -> None:
    store, plain = _pair()
    for target in (store, plain):
        del target["g/s/.zarray"]
        zarr.create(store=target, path="g/s", shape=(8,), chunks=(2,), dtype="i4")  # overwrite=False
    expected = zarr.open_array(plain, path="g/s", mode="r")[:]
    np.testing.assert_array_equal(expected, DATA)
    np.testing.assert_array_equal(zarr.open_array(store, path="g/s", mode="r")[:], expected)
    assert zarr.open_array(store, path="g/s").attrs.asdict() == {"u": "K"}
    _same(store, plain)


def test_an_array_created_again_with_other_chunks_never_reads_a_shard_as_a_chunk() -> None:
    store, _ = _pair()
    del store["g/s/.zarray"]
    with pytest.raises(ConfigurationError, match="g/s"):
        zarr.create(store=store, path="g/s", shape=(8,), chunks=(4,), dtype="i4")
    assert sorted(k for k in store if k.startswith("g/s/")) == ["g/s/.zattrs", "g/s/0", "g/s/1", "g/s/2", "g/s/3"]
    # with its chunks deleted first, the path is free, as in a plain dict
    for i in range(4):
        del store[f"g/s/{i}"]
    z = zarr.create(store=store, path="g/s", shape=(8,), chunks=(4,), dtype="i4")
    assert z.attrs.asdict() == {"u": "K"}
    np.testing.assert_array_equal(z[:], np.zeros(8, dtype="i4"))
    z[:] = DATA
    np.testing.assert_array_equal(zarr.open_array(store, path="g/s", mode="r")[:], DATA)


def test_overwrite_after_a_deleted_zarray_starts_from_nothing() -> None:
    store, plain = _pair()
    for target in (store, plain):
        del target["g/s/.zarray"]
        zarr.create(store=target, path="g/s", shape=(6,), chunks=(3,), dtype="i4", overwrite=True)
    _same(store, plain)


def test_a_group_created_again_keeps_its_attributes() -> None:
    store, plain = _pair()
    for target in (store, plain):
        del target["g/.zgroup"]
        zarr.open_group(store=target, path="g", mode="a")
    _same(store, plain)
    assert zarr.open_group(store, path="g").attrs.asdict() == {"a": 1}


@pytest.mark.parametrize("delete", ["zarray", "zgroup", "all-but-chunks"])
def test_consolidation_round_trip_with_metadata_keys_deleted(delete: str) -> None:
    """zarr's own round trip: consolidate, delete the metadata keys, open from .zmetadata alone."""
    store, plain = _pair()
    for target in (store, plain):
        zarr.consolidate_metadata(target)
    names = {"zarray": (".zarray",), "zgroup": (".zgroup",), "all-but-chunks": (".zarray", ".zgroup", ".zattrs")}
    for target in (store, plain):
        for key in [k for k in _metadata_keys(plain) if k.rpartition("/")[2] in names[delete]]:
            if key in target:
                del target[key]
    # g/empty (no chunk, listed in .zmetadata) keeps its zarr.json for open_consolidated: an empty name in listdir
    _same(store, plain, empty_names=("g/empty",) if delete == "all-but-chunks" else ())
    for target in (store, plain):
        root = zarr.open_consolidated(target, mode="r")
        np.testing.assert_array_equal(root["g/s"][:], DATA)
        np.testing.assert_array_equal(root["g/u"][:], DATA)
        assert root["g/s"].attrs.asdict() == {"u": "K"} and root["g"].attrs.asdict() == {"a": 1}
        assert root["g/empty"].attrs.asdict() == {"data": 1}  # zarr's own round trip: an array with no chunk
        np.testing.assert_array_equal(root["g/empty"][:], np.zeros(4, dtype="i4"))
    del store[".zmetadata"]
    del plain[".zmetadata"]
    _same(store, plain, empty_names=("g/empty",) if delete == "all-but-chunks" else ())


@pytest.mark.parametrize("key", ["g/s/.zarray", "g/.zgroup", "g/s/.zattrs"])
def test_deletes_key_by_key_in_every_order_on_one_node(key: str) -> None:
    path = key.rpartition("/")[0]
    store, plain = _pair()
    names = [n for n in (".zarray", ".zgroup", ".zattrs") if f"{path}/{n}" in plain]
    for order in itertools.permutations(names):
        s, p = _pair()
        for name in order:
            del s[f"{path}/{name}"]
            del p[f"{path}/{name}"]
            _same(s, p)


def test_verify_checks_the_shards_of_an_array_whose_zarray_was_deleted() -> None:
    from shardkv.proxy.verify import verify_store

    store, _ = _pair()
    del store["g/s/.zarray"]
    del store["g/s/.zattrs"]
    report = verify_store(store, decode=True, remove_orphans=True)
    assert report.ok and not report.orphan_keys and not report.removed
    assert sorted(r.shard_key for r in report.shards if r.shard_key.startswith("g/s/")) == ["g/s/0", "g/s/1"]
    assert sorted(k for k in store if k.startswith("g/s/")) == ["g/s/0", "g/s/1", "g/s/2", "g/s/3"]


def test_attributes_written_to_a_node_with_nothing_presented_go_into_its_zarr_json() -> None:
    store, plain = _pair()
    zarray = plain["g/s/.zarray"]
    for target in (store, plain):
        del target["g/s/.zarray"]
        del target["g/s/.zattrs"]
        target["g/s/.zattrs"] = json.dumps({"new": 1}).encode()
    _same(store, plain)
    base = dict(store.base.values(["g/s/zarr.json", "g/s/.zattrs"]))
    assert "g/s/.zattrs" not in base  # not a v2 document beside the zarr.json: v3 readers see the attributes
    assert json.loads(bytes(base["g/s/zarr.json"]))["attributes"] == {"new": 1}
    for target in (store, plain):
        target["g/s/.zarray"] = zarray
    _same(store, plain)
    assert zarr.open_array(store, path="g/s", mode="r").attrs.asdict() == {"new": 1}


@pytest.mark.parametrize("order", ["sorted", "reversed"])
def test_every_key_deleted_one_by_one_leaves_only_the_root_document(order: str) -> None:
    store, plain = _pair()
    keys = sorted(plain, reverse=order == "reversed")
    for key in keys:
        del store[key]
        del plain[key]
        _same(store, plain)
    assert list(store) == [] and store.listdir("") == []
    # the base store keeps the root group's zarr.json alone (the hierarchy stays v3 for what is written next)
    assert sorted(store.base.list_prefix("")) == ["zarr.json"]


# -- stateful: metadata deletes and writes interleaved with chunk writes, against a dict ------

from hypothesis import HealthCheck, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule  # noqa: E402

_NODE_KEYS = ("g/.zgroup", "g/.zattrs", "g/s/.zarray", "g/s/.zattrs", "g/t/.zarray", "top/.zarray")
_CHUNK_KEYS = ("g/s/0", "g/s/1", "g/s/3", "g/t/0", "g/t/3", "top/0/1", "top/1/1")


class DeletesMachine(RuleBasedStateMachine):
    """Delete and write back metadata keys, write and delete chunks: the proxy answers as a dict does."""

    def __init__(self) -> None:
        super().__init__()
        self.store, self.model = _pair()
        self.saved = {k: self.model[k] for k in _NODE_KEYS}

    @rule(key=st.sampled_from(_NODE_KEYS))
    def delete_metadata(self, key: str) -> None:
        if key in self.model:
            del self.store[key]
            del self.model[key]
        else:
            with pytest.raises(KeyError):
                del self.store[key]

    @rule(key=st.sampled_from(_NODE_KEYS))
    def write_metadata_back(self, key: str) -> None:
        self.store[key] = self.saved[key]
        self.model[key] = self.saved[key]

    @rule(key=st.sampled_from(_CHUNK_KEYS), value=st.sampled_from(["g/s/0", "g/s/1", "top/0/0"]))
    def write_chunk(self, key: str, value: str) -> None:
        data = self.model.get(value) or _pair()[1][value]
        if key.startswith("top/") != value.startswith("top/"):
            return  # a chunk of the other dtype: still bytes, but keep each array decodable
        self.store[key] = data
        self.model[key] = data

    @rule(key=st.sampled_from(_CHUNK_KEYS))
    def delete_chunk(self, key: str) -> None:
        if key in self.model:
            del self.store[key]
            del self.model[key]

    @invariant()
    def same_as_the_dict(self) -> None:
        _same(self.store, self.model)


TestDeletesMachine = DeletesMachine.TestCase
TestDeletesMachine.settings = settings(
    max_examples=40, stateful_step_count=15, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@pytest.mark.parametrize(
    "deletes",
    [["g/.zgroup"], ["g/s/.zarray"], ["g/s/.zattrs", "g/s/.zarray"], ["top/.zarray"], ["g/empty/.zarray"]],
    ids="+".join,
)
def test_unshard_copies_what_zarr2_sees_without_the_deleted_documents(tmp_path, deletes: list[str]) -> None:
    from shardkv.cli.unshard import unshard
    from shardkv.storage.open import open_kv

    src, dst = tmp_path / "sharded", tmp_path / "plain"
    with ShardedStore(str(src), chunks_per_shard=CPS) as store:
        _build(store)
        for key in deletes:
            del store[key]
        seen = {k: _value(k, store[k]) for k in store}
    unshard(str(src), str(dst))
    plain = open_kv(str(dst))
    # (the zarr.json mirror of the unsharded g/u is copied as it is stored)
    copied = {k: _value(k, plain.get(k).whole()) for k in plain.list_prefix("") if k != "g/u/zarr.json"}
    assert sorted(copied) == sorted(seen)  # no deleted .zarray/.zgroup written again, every chunk as a chunk
    assert copied == seen


@pytest.mark.parametrize("buffer_bytes", [None, 1 << 20], ids=["write-through", "write-back"])
def test_deleting_a_deleted_zarray_again_raises_and_changes_nothing(buffer_bytes: int | None) -> None:
    store = ShardedStore({}, chunks_per_shard=CPS, buffer_bytes=buffer_bytes)
    plain: dict[str, Any] = {}
    for target in (store, plain):
        root = zarr.group(store=target)
        s = root.create_group("g").create_dataset("s", shape=(8,), chunks=(2,), dtype="i4")
        s.attrs["u"] = "K"
        s[:3] = DATA[:3]  # chunks 0 and 1: shard 0 complete, shard 1 held by write-back
        del target["g/s/.zarray"]
        target["g/s/3"] = DATA[6:8].tobytes()  # a chunk written after (held by write-back)
        with pytest.raises(KeyError, match="g/s/.zarray"):
            del target["g/s/.zarray"]
    _same(store, plain)

"""zarr-python 2.18 through the proxy, with zarr-python 2.18 on a plain dict as the oracle.

Every case runs the same sequence of array operations twice, once on a ``dict`` and once
on ``ShardedStore`` over a base store, and after every step compares the arrays read back,
the set of logical chunk keys and the chunk bytes themselves; at the end it checks the
base store holds exactly the expected shards and that a fresh proxy reads the same data.
"""

from __future__ import annotations

import json
import uuid
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fsspec
import numcodecs
import numpy as np
import pytest
import zarr

from shardkv import ConfigurationError, ShardedStore

META = (".zarray", ".zgroup", ".zattrs", "zarr.json")


def make_base(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Any:
    if kind == "dict":
        return {}
    if kind == "memory":
        root = f"memory://shardkv-zarr2-{uuid.uuid4().hex}"
        fs = fsspec.filesystem("memory")
        request.addfinalizer(lambda: fs.rm(root, recursive=True) if fs.exists(root) else None)
        return root
    if kind == "local":
        return str(tmp_path / "store")
    raise ValueError(kind)


def is_meta(key: str) -> bool:
    return key.rsplit("/", 1)[-1] in META


def chunk_items(mapping: Any, path: str) -> dict[str, bytes]:
    """Logical chunk keys (and bytes) of the array at ``path``."""
    prefix = f"{path}/"
    return {k: bytes(mapping[k]) for k in list(mapping) if k.startswith(prefix) and not is_meta(k)}


def base_keys(store: ShardedStore) -> set[str]:
    store.flush()
    return set(store.base.list_prefix(""))


def expected_shard_keys(chunk_keys: set[str], path: str, sep: str, cps: tuple[int, ...]) -> set[str]:
    out = set()
    for key in chunk_keys:
        coords = [int(c) for c in key[len(path) + 1 :].split(sep)]
        out.add(f"{path}/" + sep.join(str(c // n) for c, n in zip(coords, cps, strict=True)))
    return out


def _check_steps(expected: list, actual: list) -> None:
    assert [s[0] for s in actual] == [s[0] for s in expected]
    for (name, want, want_chunks), (_, got, got_chunks) in zip(expected, actual, strict=True):
        np.testing.assert_array_equal(got, want, err_msg=f"after step {name!r}")
        assert sorted(got_chunks) == sorted(want_chunks), f"chunk keys after step {name!r}"
        assert got_chunks == want_chunks, f"chunk bytes after step {name!r}"


# -- the operation sequence ------------------------------------------------------------

CASES = {
    # ndim: shape, chunks, grow-to, shrink-to, partial selection, zero selection, rows to append
    "1d": dict(shape=(23,), chunks=(4,), grow=(31,), shrink=(9,),
               partial=np.s_[5:14], zeros=np.s_[0:8], append=7),
    "2d": dict(shape=(9, 11), chunks=(2, 3), grow=(13, 14), shrink=(7, 5),
               partial=np.s_[1:6, 2:9], zeros=np.s_[0:4, 0:6], append=3),
    "3d": dict(shape=(5, 6, 7), chunks=(2, 2, 3), grow=(7, 6, 10), shrink=(4, 5, 4),
               partial=np.s_[1:4, :, 2:5], zeros=np.s_[0:2, 0:4, 0:3], append=2),
}  # a table: its rows read better aligned # fmt: skip

CPS_FORMS: dict[str, Callable[[int], Any]] = {
    "int": lambda ndim: 2,
    "tuple": lambda ndim: {1: (3,), 2: (2, 3), 3: (1, 2, 3)}[ndim],
    "dict": lambda ndim: {"arr": {1: (4,), 2: (3, 1), 3: (2, 1, 2)}[ndim]},
}


def cps_tuple(form: Any, ndim: int) -> tuple[int, ...]:
    if isinstance(form, dict):
        form = form["arr"]
    return (form,) * ndim if isinstance(form, int) else tuple(form)


def run_ops(store: Any, case: dict, sep: str, seed: int) -> list[tuple[str, np.ndarray, dict[str, bytes]]]:
    """Apply the sequence; after each step record (step, array read back, logical chunk items)."""
    rng = np.random.default_rng(seed)
    shape = case["shape"]
    root = zarr.open_group(store, mode="w")
    z = root.create_dataset(
        "arr",
        shape=shape,
        chunks=case["chunks"],
        dtype="<i4",
        fill_value=0,
        dimension_separator=sep,
        write_empty_chunks=False,
        compressor=numcodecs.Zlib(level=1),
    )
    steps = []

    def snap(name: str) -> None:
        steps.append((name, z[...].copy(), chunk_items(store, "arr")))

    snap("created")
    data = rng.integers(1, 1000, size=shape, dtype="<i4")
    data[tuple(slice(0, c) for c in case["chunks"])] = 0  # one all-fill chunk: never stored
    z[...] = data
    snap("full-write")
    part = z[case["partial"]]
    z[case["partial"]] = rng.integers(-50, 50, size=part.shape, dtype="<i4")
    snap("partial-write")
    z.resize(*case["grow"])
    snap("grow")
    tail = np.s_[shape[0] :]  # every case grows along axis 0
    region = z[tail]
    z[tail] = rng.integers(1, 9, size=region.shape, dtype="<i4")
    snap("write-grown")
    z[case["zeros"]] = 0  # write_empty_chunks=False: these chunks are deleted
    snap("delete-by-fill")
    z.resize(*case["shrink"])
    snap("shrink")
    rows = case["append"]
    extra = rng.integers(1, 100, size=(rows, *z.shape[1:]), dtype="<i4")
    z.append(extra, axis=0)
    snap("append")
    z[-1:] = 0  # the appended last row back to fill
    snap("fill-last-row")
    return steps


STORE_KINDS = ["dict", "memory", "local"]


@pytest.mark.parametrize("base_kind", STORE_KINDS)
@pytest.mark.parametrize("sep", [".", "/"], ids=["sep-dot", "sep-slash"])
@pytest.mark.parametrize("cps_form", list(CPS_FORMS))
@pytest.mark.parametrize("ndim_case", list(CASES))
def test_same_as_zarr_on_a_dict(
    ndim_case: str, cps_form: str, sep: str, base_kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    case = CASES[ndim_case]
    ndim = len(case["shape"])
    cps_value = CPS_FORMS[cps_form](ndim)
    cps = cps_tuple(cps_value, ndim)
    seed = zlib.crc32(f"{ndim_case}-{cps_form}-{sep}".encode())

    oracle: dict[str, bytes] = {}
    base = make_base(base_kind, tmp_path, request)
    proxy = ShardedStore(base, chunks_per_shard=cps_value)

    expected_steps = run_ops(oracle, case, sep, seed)
    actual_steps = run_ops(proxy, case, sep, seed)
    assert proxy.sharded_array("arr") is not None
    assert proxy.sharded_array("arr").chunks_per_shard == cps  # type: ignore[union-attr]

    _check_steps(expected_steps, actual_steps)
    # logical chunk keys and their bytes are exactly zarr's
    oracle_chunks = chunk_items(oracle, "arr")
    proxy_chunks = chunk_items(proxy, "arr")
    assert sorted(proxy_chunks) == sorted(oracle_chunks)
    assert proxy_chunks == oracle_chunks
    assert proxy["arr/.zarray"] == oracle["arr/.zarray"]
    # the base store holds the metadata and exactly one shard per touched shard
    stored = base_keys(proxy)
    assert {k for k in stored if is_meta(k)} == {"zarr.json", "arr/zarr.json"}  # v3 only
    assert {k for k in stored if not is_meta(k)} == expected_shard_keys(set(oracle_chunks), "arr", sep, cps)
    # a fresh proxy (no caches, no chunks_per_shard) reads the same array
    fresh = zarr.open_array(ShardedStore(base), path="arr", mode="r")
    np.testing.assert_array_equal(fresh[...], expected_steps[-1][1])


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"index_location": "start"}, id="index-start"),
        pytest.param({"index_checksum": False}, id="no-checksum"),
        pytest.param({"buffer_bytes": 1 << 16}, id="write-back"),
    ],
)
def test_same_as_zarr_with_proxy_options(kwargs: dict, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    case = CASES["2d"]
    oracle: dict[str, bytes] = {}
    proxy = ShardedStore(make_base("memory", tmp_path, request), chunks_per_shard=(2, 2), **kwargs)
    _check_steps(run_ops(oracle, case, ".", 7), run_ops(proxy, case, ".", 7))
    proxy.flush()
    assert chunk_items(proxy, "arr") == chunk_items(oracle, "arr")


# -- which arrays are sharded -------------------------------------------------------------


def _write_arrays(store: Any) -> None:
    root = zarr.open_group(store, mode="w")
    root.attrs["title"] = "several arrays"
    a = root.create_dataset("a", shape=(10, 10), chunks=(3, 3), dtype="<f8", fill_value=np.nan)
    a[...] = np.arange(100.0).reshape(10, 10)
    b = root.create_dataset("b", shape=(17,), chunks=(2,), dtype="|u1", dimension_separator="/")
    b[3:15] = 7
    c = root.create_dataset("c", shape=(6, 6), chunks=(2, 2), dtype="<i2")
    c[...] = 5
    sub = root.create_group("sub")
    d = sub.create_dataset("d", shape=(4, 5, 6), chunks=(2, 2, 2), dtype=">i8", order="F")
    d[...] = np.arange(120).reshape(4, 5, 6)
    d.attrs["units"] = "m"
    e = root.create_dataset("e", shape=(), dtype="<f4", fill_value=1.5)
    e[...] = 2.5


def test_groups_with_several_arrays(tmp_path: Path) -> None:
    oracle: dict[str, bytes] = {}
    _write_arrays(oracle)
    base: dict[str, bytes] = {}
    proxy = ShardedStore(base, chunks_per_shard={"a": (2, 3), "b": 4, "sub/d": (1, 2, 3)})
    _write_arrays(proxy)
    assert proxy.sharded_array("a") is not None and proxy.sharded_array("b") is not None
    assert proxy.sharded_array("sub/d") is not None
    assert proxy.sharded_array("c") is None and proxy.sharded_array("e") is None
    # logical view equals zarr's own, key by key and byte by byte
    assert {k: bytes(v) for k, v in proxy.items()} == oracle
    # unsharded arrays pass through untouched: their keys are in the base store as zarr wrote them
    for k, v in oracle.items():
        if k.startswith(("c/", "e/")):
            assert base[k] == v
    # groups above sharded arrays are v3 groups, their attributes inside
    assert json.loads(base["zarr.json"])["attributes"] == {"title": "several arrays"}
    assert json.loads(base["sub/zarr.json"])["node_type"] == "group" and "sub/.zgroup" not in base
    # ... and v3 all the way down: each unsharded array also has a zarr.json
    # mirror that reads its chunks where they are (v2 chunk key encoding, no sharding codec)
    for name in ("c", "e"):
        mirror = json.loads(base[f"{name}/zarr.json"])
        zarray = json.loads(base[f"{name}/.zarray"])
        assert mirror["node_type"] == "array" and mirror["shape"] == zarray["shape"]
        assert mirror["chunk_key_encoding"]["name"] == "v2"
        assert all(c["name"] != "sharding_indexed" for c in mirror["codecs"])
        assert f"{name}/zarr.json" not in proxy
    # sharded arrays: metadata plus shards only
    assert sorted(k for k in base if k.startswith("b/")) == ["b/0", "b/1", "b/zarr.json"]  # chunks 1..7 -> shards 0, 1
    assert json.loads(base["sub/d/zarr.json"])["attributes"] == {"units": "m"}
    reread = zarr.open_group(ShardedStore(base), mode="r")
    expected = zarr.open_group(oracle, mode="r")
    for name in ("a", "b", "c", "sub/d", "e"):
        np.testing.assert_array_equal(reread[name][...], expected[name][...])
    assert reread["sub/d"].attrs["units"] == "m"
    assert sorted(reread.group_keys()) == ["sub"]
    assert sorted(reread.array_keys()) == ["a", "b", "c", "e"]


def test_tuple_of_the_wrong_ndim_leaves_arrays_unsharded() -> None:
    oracle: dict[str, bytes] = {}
    base: dict[str, bytes] = {}
    proxy = ShardedStore(base, chunks_per_shard=(2, 2))
    for store in (oracle, proxy):
        one = zarr.open_array(store, path="one", mode="w", shape=(20,), chunks=(3,), dtype="<i4")
        one[...] = np.arange(20)
        two = zarr.open_array(store, path="two", mode="w", shape=(6, 6), chunks=(2, 2), dtype="<i4")
        two[...] = 1
    assert proxy.sharded_array("one") is None
    assert proxy.sharded_array("two") is not None
    # "one" keeps every key zarr wrote; its zarr.json mirror is for v3 readers only
    assert {k: v for k, v in base.items() if k.startswith("one/") and k != "one/zarr.json"} == {
        k: v for k, v in oracle.items() if k.startswith("one/")
    }
    assert json.loads(base["one/zarr.json"])["shape"] == [20] and "one/zarr.json" not in proxy
    assert {k: bytes(v) for k, v in proxy.items()} == oracle


def test_zero_d_arrays_are_never_sharded() -> None:
    base: dict[str, bytes] = {}
    proxy = ShardedStore(base, chunks_per_shard=2)
    z = zarr.open_array(proxy, mode="w", shape=(), dtype="<f8")
    z[...] = 4.0
    assert proxy.sharded_array("") is None
    assert sorted(base) == [".zarray", "0"]
    assert zarr.open_array(base, mode="r")[...] == 4.0


@pytest.mark.parametrize(
    "cps",
    [
        pytest.param({"arr": (2, 2, 2)}, id="dict-entry-too-long"),
        pytest.param({"arr": (2,)}, id="dict-entry-too-short"),
        pytest.param({"arr": (2, 0)}, id="dict-entry-zero"),
    ],
)
def test_dict_entry_of_the_wrong_length_is_value_error(cps: dict) -> None:
    base: dict[str, bytes] = {}
    proxy = ShardedStore(base, chunks_per_shard=cps)
    with pytest.raises(ValueError) as info:
        zarr.open_array(proxy, path="arr", mode="w", shape=(8, 8), chunks=(2, 2), dtype="<i4")
    assert isinstance(info.value, ConfigurationError)
    assert "arr" in str(info.value)
    assert "arr/.zarray" not in base and "arr/zarr.json" not in base  # nothing half-created


def test_existing_unsharded_array_stays_unsharded() -> None:
    base: dict[str, bytes] = {}
    z = zarr.open_array(base, path="arr", mode="w", shape=(10,), chunks=(2,), dtype="<i4")
    z[...] = np.arange(10)
    before = dict(base)
    proxy = ShardedStore(base, chunks_per_shard=5)
    z2 = zarr.open_array(proxy, path="arr", mode="r+")
    z2[4:6] = -1
    assert proxy.sharded_array("arr") is None
    assert set(base) == set(before)
    np.testing.assert_array_equal(zarr.open_array(base, path="arr")[...], [0, 1, 2, 3, -1, -1, 6, 7, 8, 9])


@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("compressor", [None, numcodecs.Zlib(level=1)], ids=["raw", "zlib"])
@pytest.mark.parametrize("dtype", ["<i4", ">f8", "|u1"])
def test_chunk_bytes_equal_zarrs_for_order_and_dtype(order: str, compressor: Any, dtype: str) -> None:
    """Raw F-order chunks reach the proxy as numpy arrays: they must be stored in memory order, as zarr's stores do."""
    oracle: dict[str, bytes] = {}
    proxy = ShardedStore({}, chunks_per_shard=(2, 1))
    data = (np.arange(48).reshape(6, 8) % 251).astype(dtype)
    for store in (oracle, proxy):
        z = zarr.open_array(
            store, path="arr", mode="w", shape=(6, 8), chunks=(3, 4), dtype=dtype, order=order, compressor=compressor
        )
        z[...] = data
        z[0:3, 4:8] = data[3:6, 0:4]
    assert chunk_items(proxy, "arr") == chunk_items(oracle, "arr")
    np.testing.assert_array_equal(
        zarr.open_array(proxy, path="arr", mode="r")[...], zarr.open_array(oracle, path="arr", mode="r")[...]
    )

"""Dask and xarray writes through ``ShardedStore`` from the worker processes of a LocalCluster.

Every task of ``da.store`` / ``da.to_zarr`` / ``xarray.Dataset.to_zarr`` runs
in one of two worker processes, each with its own unpickled ``ShardedStore``;
tasks whose blocks share a shard merge into it under the shard's lock file
(local directory) or by compare-and-swap (S3), so no chunk is lost, however
the dask blocks fall across shards.

What zarr-python 2 itself requires: each dask block must cover whole zarr
chunks (the last chunk of an axis may be partial). A block that cuts a chunk
makes zarr read the chunk, patch it and write it back; two tasks doing that
to one chunk in two processes race, and one patch is lost, with or without
sharding (zarr 2 stores do the same). ``da.to_zarr`` avoids that by making
the zarr chunks equal to the dask blocks (irregular blocks are rechunked to
regular ones, with a warning), and by rechunking to whole zarr chunks when
given an existing ``zarr.Array``; xarray refuses unaligned blocks
(``safe_chunks``). Blocks that cut chunks are safe only with a
``synchronizer`` (``zarr.ProcessSynchronizer``: one lock file per chunk),
which :func:`test_chunk_unaligned_blocks_with_a_process_synchronizer` shows
on a local directory and on S3.
Measured once (300 x 260 int32, 32 x 32 chunks, 48 x 40 blocks, 2 worker
processes, 3 runs each): a plain ``zarr.DirectoryStore`` lost 192 of 78,000
elements in one run of three; ``ShardedStore`` without a synchronizer lost
5,696 to 7,008 in every run (a shard read-modify-write is longer, so the
chunk race is hit more often); with the synchronizer but the default
(trusted) index cache, a task failed decoding another chunk's bytes; with
the synchronizer and ``validate_index_cache=True``, 0. Since then every
chunk read checks its cached index (a stat taken anyway, or an ETag), and
the synchronizer alone gives 0.
"""

from __future__ import annotations

import os
import uuid

import numpy as np
import pytest
from concurrency_harness import local_cluster, moto_s3  # noqa: F401  (fixtures)

from shardkv import ShardedStore

zarr = pytest.importorskip("zarr")
if not zarr.__version__.startswith("2."):
    pytest.skip("zarr-python 2 only", allow_module_level=True)
dask = pytest.importorskip("dask")
da = pytest.importorskip("dask.array")
xr = pytest.importorskip("xarray")

pytestmark = pytest.mark.filterwarnings("ignore::shardkv.PartialShardWriteWarning")

SHAPE = (300, 260)  # neither axis a multiple of the 128 x 128 shard: partial edge chunks and shards
CHUNKS = (32, 32)
CPS = 4  # 4 x 4 chunks per shard

# dask blocks that cover whole 32 x 32 zarr chunks but not whole shards
ALIGNED_BLOCKS = {
    "one-chunk": (32, 32),
    "3x2-chunks": (96, 64),
    "across-shard-borders": (160, 224),
    "irregular": ((32, 64, 96, 32, 76), (96, 32, 128, 4)),
    "larger-than-a-shard": (256, 256),
}


def _source(seed: int = 6) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, 1 << 30, size=SHAPE, dtype="i4")


def _empty_array(store: ShardedStore, **kwargs) -> zarr.Array:
    return zarr.open_array(store=store, mode="w", shape=SHAPE, chunks=CHUNKS, dtype="i4", fill_value=0, **kwargs)


def _store_blocks(make_store, blocks, **array_kwargs) -> None:
    """``da.store`` (no dask lock) of the source in ``blocks`` into a new 32 x 32-chunk array; check it."""
    source = _source()
    target = _empty_array(make_store(), **array_kwargs)
    darr = da.from_array(source, chunks=blocks)
    da.store(darr, target, lock=False, compute=True)  # keeps the blocks (da.to_zarr would rechunk them)
    written = zarr.open_array(store=make_store(), mode="r")
    assert written.chunks == CHUNKS
    np.testing.assert_array_equal(written[:], source)


@pytest.mark.parametrize("blocks", list(ALIGNED_BLOCKS.values()), ids=list(ALIGNED_BLOCKS))
def test_chunk_aligned_blocks_on_a_local_dir(tmp_path, local_cluster, blocks) -> None:  # noqa: F811
    path = str(tmp_path / "blocks.zarr")
    _store_blocks(lambda: ShardedStore(path, chunks_per_shard=CPS), blocks)
    assert len([n for n in os.listdir(path) if n[0].isdigit()]) == 9  # 3 x 3 shards, not 10 x 9 chunks


def _s3_store_factory(moto_s3):  # noqa: F811
    url = f"s3://{moto_s3.bucket}/dask-{uuid.uuid4().hex[:8]}"
    options = {
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"endpoint_url": moto_s3.endpoint_url, "region_name": "us-east-1"},
    }  # s3fs's instance cache: one client per worker process, not per task
    assert ShardedStore(url, storage_options=options).concurrency_mode == "conditional"
    return lambda: ShardedStore(url, chunks_per_shard=CPS, storage_options=options)


def test_chunk_aligned_irregular_blocks_on_s3(moto_s3, local_cluster) -> None:  # noqa: F811
    _store_blocks(_s3_store_factory(moto_s3), ALIGNED_BLOCKS["irregular"])


# -- da.to_zarr: the zarr chunks are the dask blocks ---------------------------------------------

SIDE, BLOCK = (
    1024,
    64,
)  # the set-up: 16 x 16 blocks of 64 x 64 (the zarr chunks), 4 x 4 chunks per shard: 16 shards


def _dask_round_trip(make_store) -> None:
    source = np.random.default_rng(9).integers(0, 1 << 30, size=(SIDE, SIDE), dtype="i4")
    # one task per 64 x 64 chunk: 16 tasks per shard, spread over both worker processes
    da.to_zarr(da.from_array(source, chunks=(BLOCK, BLOCK)), make_store(), overwrite=True, compute=True)
    written = zarr.open_array(store=make_store(), mode="r")
    assert written.chunks == (BLOCK, BLOCK)
    np.testing.assert_array_equal(written[:], source)


def test_dask_cluster_writes_a_sharded_array_on_a_local_dir(tmp_path, local_cluster) -> None:  # noqa: F811
    path = str(tmp_path / "dask.zarr")
    _dask_round_trip(lambda: ShardedStore(path, chunks_per_shard=CPS))
    assert len([n for n in os.listdir(path) if n[0].isdigit()]) == 16  # shards, not chunks


def test_dask_cluster_writes_a_sharded_array_on_s3(moto_s3, local_cluster) -> None:  # noqa: F811
    _dask_round_trip(_s3_store_factory(moto_s3))


def test_da_to_zarr_makes_the_zarr_chunks_the_blocks(tmp_path, local_cluster) -> None:  # noqa: F811
    path = str(tmp_path / "to_zarr.zarr")
    source = _source()
    with pytest.warns(UserWarning, match="irregular chunk sizes"):  # dask rechunks to (96, 100) blocks first
        da.to_zarr(
            da.from_array(source, chunks=((96, 96, 96, 12), (96, 64, 100))), ShardedStore(path, chunks_per_shard=CPS)
        )
    written = zarr.open_array(store=ShardedStore(path), mode="r")
    assert written.chunks == (96, 100)  # the largest block per axis
    np.testing.assert_array_equal(written[:], source)


# -- blocks that cut zarr chunks ------------------------------------------------------------

UNALIGNED_BLOCKS = (48, 40)  # every block boundary but the first cuts a 32 x 32 chunk


@pytest.mark.parametrize("where", ["local", "s3"])
def test_chunk_unaligned_blocks_with_a_process_synchronizer(tmp_path, moto_s3, local_cluster, where) -> None:  # noqa: F811
    """zarr's per-chunk lock files order the tasks that patch one chunk; shardkv orders the shard writes.

    A task that patches a chunk reads it first, and another process may have
    rewritten its shard since this process cached the shard's index: the
    chunk read checks the cached index (local files: inode, size and mtime,
    taken anyway; S3: the chunk range is read ``If-Match`` the index's ETag),
    so it never finds another chunk's bytes, with the default options.
    """
    sync = zarr.ProcessSynchronizer(str(tmp_path / "chunk-locks"))
    if where == "local":
        path = str(tmp_path / "unaligned.zarr")
        make_store = lambda: ShardedStore(path, chunks_per_shard=CPS)  # noqa: E731
    else:
        make_store = _s3_store_factory(moto_s3)
    _store_blocks(make_store, UNALIGNED_BLOCKS, synchronizer=sync)


# -- xarray ----------------------------------------------------------------------------------


def _dataset(ny: int, y0: int = 0, seed: int = 3) -> xr.Dataset:
    rng = np.random.default_rng(seed)
    nx = SHAPE[1]
    return xr.Dataset(
        {
            "temp": (("y", "x"), rng.random((ny, nx), dtype="f4"), {"units": "K"}),
            "count": (("y", "x"), rng.integers(0, 1000, size=(ny, nx), dtype="i4")),
        },
        coords={"y": np.arange(y0, y0 + ny), "x": np.linspace(0.0, 1.0, nx), "label": ("x", np.arange(nx) % 7)},
        attrs={"title": "dask workers"},
    )


def _encoding(ds: xr.Dataset) -> dict:
    return {name: {"chunks": CHUNKS} for name in ds.data_vars}


def _open(path: str) -> xr.Dataset:
    with ShardedStore(path) as store:
        return xr.open_zarr(store).load()


def test_xarray_to_zarr_append_and_region_on_a_local_dir(tmp_path, local_cluster) -> None:  # noqa: F811
    assert dask.base.get_scheduler() == local_cluster.get  # xarray computes on the worker processes
    path = str(tmp_path / "ds.zarr")
    first = _dataset(192)  # 1.5 shards along y: shard row 1 holds 2 of its 4 chunk rows
    with ShardedStore(path, chunks_per_shard=CPS) as store:
        first.chunk({"y": 64, "x": 96}).to_zarr(store, mode="w", encoding=_encoding(first))
    xr.testing.assert_identical(_open(path), first)

    # appended 32-row blocks fill shard row 1 (merged into the stored chunks) and start shard row 2
    more = _dataset(108, y0=192, seed=4)
    with ShardedStore(path, chunks_per_shard=CPS) as store:
        more.chunk({"y": 32, "x": 96}).to_zarr(store, append_dim="y")
    both = xr.concat([first, more], dim="y", data_vars="all")
    xr.testing.assert_identical(_open(path), both)
    assert sorted(n for n in os.listdir(os.path.join(path, "temp")) if n[0].isdigit()) == [
        f"{i}.{j}" for i in range(3) for j in range(3)
    ]

    # a region across the shard border at y = 128, written by 3 tasks per variable
    patch = _dataset(96, y0=64, seed=5).drop_vars(["x", "label"])
    with ShardedStore(path) as store:
        patch.chunk({"y": 32}).to_zarr(store, region={"y": slice(64, 160)})
    expected = both.copy(deep=True)
    for name in ("temp", "count"):
        expected[name][64:160] = patch[name].values
    xr.testing.assert_identical(_open(path), expected)


def test_xarray_to_zarr_append_and_region_on_s3(moto_s3, local_cluster) -> None:  # noqa: F811
    make_store = _s3_store_factory(moto_s3)
    first, more = _dataset(192), _dataset(108, y0=192, seed=4)
    first.chunk({"y": 64, "x": 96}).to_zarr(make_store(), mode="w", encoding=_encoding(first))
    more.chunk({"y": 32, "x": 96}).to_zarr(make_store(), append_dim="y")  # merged into shard row 1 by CAS
    patch = _dataset(96, y0=64, seed=5).drop_vars(["x", "label"])
    patch.chunk({"y": 32}).to_zarr(make_store(), region={"y": slice(64, 160)})
    expected = xr.concat([first, more], dim="y", data_vars="all")
    for name in ("temp", "count"):
        expected[name][64:160] = patch[name].values
    xr.testing.assert_identical(xr.open_zarr(make_store()).load(), expected)

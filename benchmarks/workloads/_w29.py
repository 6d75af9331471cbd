"""The write-cost workload (rows W29), in one place: the array, its data, and each implementation's way to write it.

The zarrs/zarr_benchmarks workload scaled as in the issue: a 3-D uint16 array
of 64³ inner chunks in shards of 4 x 4 x 4 chunks (256³ elements), inner codec
zstd level 0, shard index at the end with CRC32C (the v1.0 ``sharding_indexed``
codec, which every implementation here writes). Shapes (smoke / tiny / small /
full): 128 x 64 x 320 (two shards, the second partial) / 256³ (1 shard) /
256 x 512 x 512 (4 shards) / 512³ (8 shards, 256 MiB, the issue's figures).

Data: smooth plus noise, ``(i + j + k) * 5 + 1000 * version`` modulo 4096 plus
seeded noise 0..15 per inner chunk (numpy's generator seeded with the seed,
the version and the chunk's coordinates), so any box of whole chunks is the
same whichever process computes it, and data of another ``version`` differs in
every element. zstd level 0 stores 55 % of it (140.5 MiB of 256 MiB at full
size, as the former ``zarr3_store_write.py``'s data; the issue quotes 63.5 MiB
stored): the rows compare bytes moved per byte stored, and times.

Implementations (``--impl``) and the environment they run in:

==================  ===========  ==========================================================
``shardkv``         zarr3        zarr 3 through ``shardkv.zarr3.ShardedStore(dir)``: default
                                 options plus the ``--shardkv-option`` given
``shardkv-buffer``  zarr3        the same with ``buffer_bytes`` = the array's bytes, then
                                 ``flush()``
``zarr3``           bench        zarr 3's own sharding (``create_array(shards=...)``),
                                 default codec pipeline, ``LocalStore``
``zarr3-zarrs``     bench        the same with ``zarrs.ZarrsCodecPipeline``
``tensorstore``     bench        tensorstore, ``zarr3`` driver, ``sharding_indexed``,
                                 ``file`` kvstore
==================  ===========  ==========================================================
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from typing import Any

import numpy as np

SHAPES: dict[str, tuple[int, int, int]] = {
    "smoke": (128, 64, 320),
    "tiny": (256, 256, 256),
    "small": (256, 512, 512),
    "full": (512, 512, 512),
}
CHUNKS = (64, 64, 64)
CHUNKS_PER_SHARD = 4
SHARD_SHAPE = tuple(c * CHUNKS_PER_SHARD for c in CHUNKS)
DTYPE = np.dtype("uint16")
ZSTD_LEVEL = 0
ARRAY = "arr"  # the array's path in its store
Box = tuple[tuple[int, ...], tuple[int, ...]]  # (start, stop) per dimension, elements, stop exclusive


# -- data -----------------------------------------------------------------------------------


def values(start: tuple[int, ...], stop: tuple[int, ...], seed: int, version: int = 0) -> np.ndarray:
    """The data of the box ``[start, stop)`` (uint16, shape ``stop - start``), the same in every process.

    ``start`` is a multiple of the chunk shape; ``stop`` is one too, or the array's end.
    """
    axes = [np.arange(a, b, dtype=np.uint16) for a, b in zip(start, stop, strict=True)]
    smooth = axes[0][:, None, None] + axes[1][None, :, None] + axes[2][None, None, :]
    out = (smooth * np.uint16(5) + np.uint16(1000 * version)) % np.uint16(4096)
    for chunk_start in np.ndindex(*(-(-(b - a) // c) for a, b, c in zip(start, stop, CHUNKS, strict=True))):
        lo = [a + i * c for a, i, c in zip(start, chunk_start, CHUNKS, strict=True)]
        hi = [min(x + c, b) for x, c, b in zip(lo, CHUNKS, stop, strict=True)]
        coords = [x // c for x, c in zip(lo, CHUNKS, strict=True)]
        noise = np.random.default_rng([seed, version, *coords]).integers(0, 16, CHUNKS, dtype=np.uint16)
        local = tuple(slice(x - a, y - a) for x, y, a in zip(lo, hi, start, strict=True))
        out[local] += noise[tuple(slice(0, y - x) for x, y in zip(lo, hi, strict=True))]
    return out


def shard_boxes(shape: tuple[int, ...]) -> list[Box]:
    """Every shard of an array of ``shape``, as boxes (row-major; edge shards cut by the array's end)."""
    grid = [-(-n // s) for n, s in zip(shape, SHARD_SHAPE, strict=True)]
    boxes = []
    for index in np.ndindex(*grid):
        start = tuple(i * s for i, s in zip(index, SHARD_SHAPE, strict=True))
        boxes.append((start, tuple(min(a + s, n) for a, s, n in zip(start, SHARD_SHAPE, shape, strict=True))))
    return boxes


def update_boxes(shape: tuple[int, ...]) -> list[Box]:
    """One inner chunk in each shard: the chunk at local coordinates (1, 1, 1), or the shard's last along a
    dimension where it has fewer chunks (row 3 of the issue)."""
    boxes = []
    for start, stop in shard_boxes(shape):
        lo = tuple(a + min(1, (b - a) // c - 1) * c for a, b, c in zip(start, stop, CHUNKS, strict=True))
        boxes.append((lo, tuple(x + c for x, c in zip(lo, CHUNKS, strict=True))))
    return boxes


def selection(box: Box) -> tuple[slice, ...]:
    """The box as the slices that index it."""
    return tuple(slice(a, b) for a, b in zip(*box, strict=True))


def box_elements(box: Box) -> int:
    """Elements in the box."""
    return int(np.prod([b - a for a, b in zip(*box, strict=True)]))


def chunks_differing(got: np.ndarray, want: np.ndarray) -> int:
    """How many inner chunks of a chunk-aligned box differ between ``got`` and ``want`` (same shape)."""
    if got.shape != want.shape:
        raise RuntimeError(f"read back an array of shape {got.shape}, expected {want.shape}")
    grid = [-(-n // c) for n, c in zip(want.shape, CHUNKS, strict=True)]
    return sum(
        1
        for index in np.ndindex(*grid)
        if not np.array_equal(
            *(a[tuple(slice(i * c, (i + 1) * c) for i, c in zip(index, CHUNKS, strict=True))] for a in (got, want))
        )
    )


# -- the implementations ---------------------------------------------------------------------------


def shardkv_store(root: str, options: dict[str, Any], read_only: bool = False) -> Any:
    """``shardkv.zarr3.ShardedStore(root)`` sharding new arrays 4 x 4 x 4, with ``options`` as keywords."""
    from shardkv.zarr3 import ShardedStore

    if read_only:
        return ShardedStore(root, read_only=True)
    return ShardedStore(root, chunks_per_shard=CHUNKS_PER_SHARD, **options)


class Writer:
    """One implementation's array in a local directory: create or open it, write boxes, flush, read it back.

    ``options``: shardkv's keywords (shardkv implementations only). ``shard_puts()`` counts the shards the
    shardkv engine put since the array was created or opened (``None`` for the peers).
    """

    def __init__(self, impl: str, root: str, options: dict[str, Any] | None = None) -> None:
        self.impl = impl
        self.root = root
        self.options = dict(options or {})
        self.puts: list[Any] | None = None
        if impl == "zarr3-zarrs":
            import zarr
            import zarrs  # noqa: F401 (makes the pipeline importable by its path)

            zarr.config.set({"codec_pipeline.path": "zarrs.ZarrsCodecPipeline"})

    # zarr 3 (through shardkv or not)

    def _zarr_store(self) -> Any:
        from zarr.storage import LocalStore

        if self.impl.startswith("shardkv"):
            self.store = shardkv_store(self.root, self.options)
            self._count_puts()
        else:
            self.store = LocalStore(self.root)
        return self.store

    def _shard_engine(self) -> Any:
        # the store keeps its engine private; its counters and the puts to its own store are what is counted
        return self.store._engine

    def _count_puts(self) -> None:
        kv = self._shard_engine().kv
        puts: list[Any] = []
        put_many = kv.put_many

        def counting_put_many(writes: Any) -> Any:
            puts.extend(writes)
            return put_many(writes)

        kv.put_many = counting_put_many
        self.puts = puts

    def create(self, shape: tuple[int, ...]) -> None:
        """Create the array of ``shape`` (fill value 0)."""
        if self.impl == "tensorstore":
            import tensorstore as ts

            self.arr = ts.open(self._ts_spec(shape), create=True, delete_existing=True).result()
            return
        import zarr
        from zarr.codecs import ZstdCodec

        sharded = {} if self.impl.startswith("shardkv") else {"shards": SHARD_SHAPE}
        self.arr = zarr.create_array(
            self._zarr_store(),
            name=ARRAY,
            shape=shape,
            chunks=CHUNKS,
            dtype=DTYPE,
            compressors=ZstdCodec(level=ZSTD_LEVEL),
            fill_value=0,
            **sharded,
        )

    def open(self) -> None:
        """Open the stored array through a new store object (a new tensorstore context)."""
        if self.impl == "tensorstore":
            import tensorstore as ts

            self.arr = ts.open(self._ts_spec(None), open=True, context=ts.Context()).result()
            return
        import zarr

        self.arr = zarr.open_array(self._zarr_store(), path=ARRAY, mode="r+")

    def write(self, box: Box, data: np.ndarray) -> None:
        if self.impl == "tensorstore":
            self.arr[selection(box)].write(data).result()
        else:
            self.arr[selection(box)] = data

    def flush(self) -> None:
        """Every write stored (shardkv write-back: ``flush()``; the others store within each write)."""
        if self.impl.startswith("shardkv"):
            self.store.flush()

    def shard_puts(self) -> int | None:
        """Shards the shardkv engine put since the store was made (``None`` for the peers)."""
        return None if self.puts is None else len(self.puts)

    def engine_stats(self) -> Any:
        """The shardkv engine's counters (``EngineStats``: ``write_attempts``, ``writes_queued``), or ``None``."""
        return self._shard_engine().stats if self.impl.startswith("shardkv") else None

    def read_back(self) -> np.ndarray:
        """The whole array, read through a new store object."""
        if self.impl == "tensorstore":
            import tensorstore as ts

            return np.asarray(ts.open(self._ts_spec(None), open=True, context=ts.Context()).result().read().result())
        import zarr
        from zarr.storage import LocalStore

        store = (
            shardkv_store(self.root, {}, read_only=True) if self.impl.startswith("shardkv") else LocalStore(self.root)
        )
        return np.asarray(zarr.open_array(store, path=ARRAY, mode="r")[...])

    def _ts_spec(self, shape: tuple[int, ...] | None) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "driver": "zarr3",
            "kvstore": {"driver": "file", "path": os.path.join(self.root, ARRAY) + "/"},
        }
        if shape is not None:
            spec["metadata"] = {
                "shape": list(shape),
                "data_type": "uint16",
                "fill_value": 0,
                "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(SHARD_SHAPE)}},
                "codecs": [
                    {
                        "name": "sharding_indexed",
                        "configuration": {
                            "chunk_shape": list(CHUNKS),
                            "codecs": [
                                {"name": "bytes", "configuration": {"endian": "little"}},
                                {"name": "zstd", "configuration": {"level": ZSTD_LEVEL, "checksum": False}},
                            ],
                            "index_location": "end",
                            "index_codecs": [
                                {"name": "bytes", "configuration": {"endian": "little"}},
                                {"name": "crc32c"},
                            ],
                        },
                    }
                ],
            }
        return spec


def unavailable(impl: str, options: dict[str, Any]) -> str | None:
    """Why ``impl`` cannot run here, or ``None``: a shardkv option the installed shardkv lacks
    (``"option unknown"``), or zarrs missing from the environment (one made before it was required)."""
    if impl.startswith("shardkv") and options:
        from _common import unknown_shardkv_options

        if unknown_shardkv_options(options):
            return "option unknown"
    if impl == "zarr3-zarrs" and importlib.util.find_spec("zarrs") is None:
        return "zarrs not installed here (pip install zarrs)"
    return None


def peer_versions() -> dict[str, str]:
    """Installed versions of the peers and shardkv this process imported (tensorstore has no ``__version__``)."""
    import sys

    names = ("zarr", "zarrs", "tensorstore", "xarray", "dask", "distributed", "shardkv")
    return {name: importlib.metadata.version(name) for name in names if name in sys.modules}

"""``shardkv convert``: pack every array of a Zarr v2 or v3 hierarchy (or a 2022 draft one) into shards.

The public names are here; the work is in one module per job:

============  ================================================================
``job``       :func:`convert`: options, stores, which run
``run``       the run's steps (listing, tasks, metadata, the final check) for a Zarr v2 source
``listing``   the source listed lazily, array by array (a bit per chunk position)
``v3_job``    the steps that differ for a Zarr v3 source (chunks as inner chunks, resharding)
``v3_listing``  a Zarr v3 source's nodes, and each array's stored chunks as bits
``plan``      per array: sharded with which ``chunks_per_shard``, or copied unsharded and why
``tasks``     shard-aligned tasks and where they run (here, local processes, dask.distributed)
``meta``      the destination's metadata documents (pure): v3 all the way down, as the proxy stores it
``progress``  the progress bar's total and steps (pure)
``report``    :class:`ConvertReport`, what the conversion did
``draft``     the 2022 draft hierarchy's conversion (sharding storage transformer)
============  ================================================================
"""

from __future__ import annotations

from shardkv.cli.convert.job import (
    TASK_CHUNKS,
    ArrayReport,
    ChunksPerShard,
    ConvertReport,
    DestinationNotEmptyError,
    SameLocationError,
    check_chunks_per_shard,
    convert,
    parse_chunks_per_shard,
)

__all__ = [
    "TASK_CHUNKS",
    "ChunksPerShard",
    "ArrayReport",
    "ConvertReport",
    "DestinationNotEmptyError",
    "SameLocationError",
    "parse_chunks_per_shard",
    "check_chunks_per_shard",
    "convert",
]

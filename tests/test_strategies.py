"""Write strategies ("rewrite", "append", "inplace"), slack, compact() and the fallback to rewrite.

Shards are checked with an independent reader (:func:`parse_shard`: numpy on
the raw bytes, following the v1.0 ``sharding_indexed`` layout: ``uint64``
little-endian ``(offset, nbytes)`` pairs, 4-byte CRC32C after them, the index
at the start or the end), not with shardkv's own decoder.
"""

from __future__ import annotations

import itertools
import json
import os
import tempfile
import uuid
from pathlib import Path
from typing import Any, Iterator

import fsspec
import numcodecs
import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardkv import ShardedStore, ShardIndex
from shardkv.engine.strategies import plan_append
from shardkv.format.layout import ShardLayout
from shardkv.storage.adapters import FSMapAdapter

EMPTY = 2**64 - 1


def parse_shard(blob: bytes, n_chunks: int, index_location: str) -> tuple[dict[int, bytes], np.ndarray]:
    """Chunks (by row-major local position) and raw ``(n_chunks, 2)`` index of a v1.0 shard with CRC32C."""
    index_nbytes = 16 * n_chunks + 4
    raw = blob[-index_nbytes:] if index_location == "end" else blob[:index_nbytes]
    entries = np.frombuffer(raw[: 16 * n_chunks], dtype="<u8").reshape(n_chunks, 2)
    chunks = {i: blob[int(o) : int(o) + int(n)] for i, (o, n) in enumerate(entries) if o != EMPTY}
    return chunks, entries


def assert_compact(blob: bytes, n_chunks: int, index_location: str) -> None:
    """No unused byte: chunks back to back, the index at its end, nothing else."""
    chunks, entries = parse_shard(blob, n_chunks, index_location)
    index_nbytes = 16 * n_chunks + 4
    assert len(blob) == index_nbytes + sum(len(c) for c in chunks.values())
    spans = sorted((int(o), int(o) + int(n)) for o, n in entries if o != EMPTY)
    cursor = index_nbytes if index_location == "start" else 0
    for start, stop in spans:
        assert start == cursor
        cursor = stop


# -- plan_append (pure) ----------------------------------------------------------------------


def stored_shard(layout: ShardLayout, chunks: dict[tuple[int, ...], bytes], slack: int = 0) -> bytes:
    return b"".join(layout.encode_shard_with_index(chunks, slack)[0])


def apply_plan(blob: bytes, plan: Any) -> bytes:
    out = bytearray(blob)
    for w in plan.writes:
        end = w.offset + len(w.data)
        if end > len(out):
            out.extend(bytes(end - len(out)))
        out[w.offset : end] = w.data
    return bytes(out)


@pytest.mark.parametrize("index_location", ["end", "start"])
@pytest.mark.parametrize("inplace", [False, True], ids=["append", "inplace"])
def test_plan_append_result_parses_to_the_updated_chunks(index_location: str, inplace: bool) -> None:
    layout = ShardLayout.v3((4,), index_location)
    before = {(0,): b"aaaa", (1,): b"bbbbbb", (2,): b"cc"}
    blob = stored_shard(layout, before)
    index = layout.index_of_shard(blob, "s")
    updates = {(0,): b"AA", (1,): b"BBBBBBBB", (2,): None, (3,): b"dd"}
    plan = plan_append(layout, index, len(blob), updates, inplace=inplace)
    after = apply_plan(blob, plan)
    assert len(after) == plan.new_nbytes
    chunks, _ = parse_shard(after, 4, index_location)
    assert chunks == {0: b"AA", 1: b"BBBBBBBB", 3: b"dd"}
    assert layout.index_of_shard(after, "s") == plan.index
    appended = sum(len(w.data) for w in plan.writes)
    assert appended == 2 + 8 + 2 + layout.index_nbytes  # new chunk bytes and one index, never the whole shard
    old_offset = index.get((0,))[0]  # type: ignore[index]
    if inplace:  # chunk 0 fits its old slot; chunks 1 and 3 are appended
        assert plan.index.get((0,))[0] == old_offset  # type: ignore[union-attr, index]
        assert len(after) == len(blob) + 10 + (layout.index_nbytes if index_location == "end" else 0)
    else:
        assert plan.index.get((0,))[0] != old_offset  # type: ignore[union-attr, index]
        assert len(after) == len(blob) + 12 + (layout.index_nbytes if index_location == "end" else 0)


def test_plan_inplace_uses_gaps_up_to_the_next_chunk() -> None:
    layout = ShardLayout.v3((3,), "end")
    blob = stored_shard(layout, {(0,): b"x" * 4, (1,): b"y" * 4, (2,): b"z" * 4})
    index = layout.index_of_shard(blob, "s")
    shrink = plan_append(layout, index, len(blob), {(0,): b"X"}, inplace=True)
    blob = apply_plan(blob, shrink)
    index = shrink.index
    assert len(blob) == shrink.new_nbytes == 12 + layout.index_nbytes
    regrow = plan_append(layout, index, len(blob), {(0,): b"X" * 4}, inplace=True)  # the slot is still 4 bytes
    assert regrow.new_nbytes == len(blob)
    too_big = plan_append(layout, index, len(blob), {(0,): b"X" * 5}, inplace=True)
    assert too_big.new_nbytes == len(blob) + 5 + layout.index_nbytes


def test_plan_rejects_negative_slack() -> None:
    layout = ShardLayout.v3((2,))
    with pytest.raises(ValueError, match="slack_bytes"):
        plan_append(layout, ShardIndex.empty((2,)), layout.index_nbytes, {}, inplace=True, slack_bytes=-1)


# -- the proxy on a local directory ---------------------------------------------------------
# (the proxy's write_strategy/slack_bytes options are retired, issue 18: every update rewrites the shard)

CPS = 4


def zarray(n_chunks: int = 16, chunk: int = 64) -> bytes:
    doc = {
        "zarr_format": 2, "shape": [n_chunks * chunk], "chunks": [chunk], "dtype": "|u1",
        "compressor": None, "fill_value": 0, "filters": None, "order": "C",
    }  # fmt: skip
    return json.dumps(doc).encode()


# -- every mode reads back equal under zarr-python 2.18 ------------------------------------


def zarr_ops(z: Any) -> None:
    """Partial and whole writes whose encodings change size (zlib), so slots are reused and outgrown."""
    rng = np.random.default_rng(11)
    z[:] = 1
    z[3:17, 2:9] = rng.integers(0, 1000, (14, 7))  # noisy: larger encodings
    z[0:5, 0:30] = 2
    z[10:30, 20:30] = rng.integers(0, 5, (20, 10))
    z[12:14, 21:29] = 0
    z[25:30, 0:30] = rng.integers(0, 1000, (5, 30))
    z.resize(27, 30)
    z[26, :] = 9


MODES = list(itertools.product(["rewrite"], [None, 600], ["end", "start"]))


@pytest.mark.parametrize(
    "write_strategy, buffer_bytes, index_location",
    MODES,
    ids=[f"{s}-{'buffer' if b else 'direct'}-{loc}" for s, b, loc in MODES],
)
def test_every_mode_reads_back_equal_under_zarr2(
    tmp_path: Path, write_strategy: str, buffer_bytes: int | None, index_location: str
) -> None:
    root = str(tmp_path / "store")
    store = ShardedStore(root, chunks_per_shard=(2, 3), buffer_bytes=buffer_bytes, index_location=index_location)
    oracle: dict[str, bytes] = {}
    arrays = [
        zarr.open_array(s, mode="w", path="a", shape=(30, 30), chunks=(4, 4), dtype="i4", fill_value=-1,
                        compressor=numcodecs.Zlib(level=1))  # fmt: skip
        for s in (store, oracle)
    ]
    for z in arrays:
        zarr_ops(z)
    expected = arrays[1][:]
    np.testing.assert_array_equal(arrays[0][:], expected)
    store.close()
    np.testing.assert_array_equal(zarr.open_array(ShardedStore(root), mode="r", path="a")[:], expected)
    ShardedStore(root).compact()
    np.testing.assert_array_equal(zarr.open_array(ShardedStore(root), mode="r", path="a")[:], expected)


# -- property: any sequence of writes and deletes equals a dict model ------------------------

ops = st.lists(
    st.tuples(st.integers(0, 11), st.one_of(st.none(), st.binary(min_size=1, max_size=24))),
    min_size=1,
    max_size=30,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=ops,
    index_location=st.sampled_from(["end", "start"]),
    batch=st.integers(1, 3),
    buffer_bytes=st.sampled_from([None, 0, 40]),
)
def test_random_writes_and_deletes_then_compact_equal_a_dict(
    ops: list[tuple[int, bytes | None]],
    index_location: str,
    batch: int,
    buffer_bytes: int | None,
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = ShardedStore(
            tmp,
            chunks_per_shard=CPS,
            index_location=index_location,
            buffer_bytes=buffer_bytes,
        )
        store["a/.zarray"] = zarray(n_chunks=12)
        model: dict[str, bytes] = {}
        for start in range(0, len(ops), batch):
            group = dict((f"a/{i}", v) for i, v in ops[start : start + batch])
            store.setitems({k: v for k, v in group.items() if v is not None})
            store.delitems([k for k, v in group.items() if v is None])
            model.update({k: v for k, v in group.items() if v is not None})
            for k, v in group.items():
                if v is None:
                    model.pop(k, None)

        def content(s: ShardedStore) -> dict[str, bytes]:
            return {k: s[k] for k in s.keys_under("a") if not k.endswith(".zarray")}

        assert content(store) == model  # listing flushes the buffer
        assert content(ShardedStore(tmp)) == model
        store.compact()
        assert content(ShardedStore(tmp)) == model
        for shard in range(3):
            path = Path(tmp) / "a" / str(shard)
            if path.exists():
                assert_compact(path.read_bytes(), CPS, index_location)
            else:
                assert not any(f"a/{i}" in model for i in range(shard * CPS, (shard + 1) * CPS))

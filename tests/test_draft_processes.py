"""The 2022 draft layout across processes: a cached shard index is checked against the stored shard.

Process A (this one) reads a chunk, so the draft store caches its shard's
index; process B (a subprocess, run to its end before A reads again: no
sleeps) rewrites that shard so that the chunk moves. A's next read must give
B's value, never bytes at the old offsets, on every base store the draft
path takes that keeps its data in a directory: a path, an fsspec local file
system that is not fsspec's own ``LocalFileSystem`` (a subclass), and a
``DirFileSystem`` over one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import fsspec
import pytest
from fsspec.implementations.dirfs import DirFileSystem
from fsspec.implementations.local import LocalFileSystem

from shardkv import open_store
from shardkv.metadata.documents import DRAFT_ZARR_FORMAT
from shardkv.proxy.draft import DraftShardedStore

pytestmark = pytest.mark.zarr2

ENTRY_POINT = json.dumps(
    {"zarr_format": DRAFT_ZARR_FORMAT, "metadata_encoding": DRAFT_ZARR_FORMAT, "metadata_key_suffix": ".json"}
).encode()
ARRAY = json.dumps(
    {
        "shape": [4],
        "data_type": "|u1",
        "chunk_grid": {"type": "regular", "chunk_shape": [1], "separator": "/"},
        "chunk_memory_layout": "C",
        "fill_value": 0,
        "extensions": [],
        "attributes": {},
    }
).encode()
C0, C1 = "data/root/arr/c0", "data/root/arr/c1"  # both in shard data/root/arr/c0 (4 chunks per shard)


class SubclassedLocal(LocalFileSystem):
    """A LocalFileSystem subclass (what a user might pass to count or log reads): not fsspec's own class."""


def _base(kind: str, path: Path) -> Any:
    if kind == "path":
        return str(path)
    if kind == "local-subclass":
        return fsspec.FSMap(str(path), SubclassedLocal(skip_instance_cache=True))
    if kind == "dirfs-over-subclass":
        return fsspec.FSMap("", DirFileSystem(str(path), SubclassedLocal(skip_instance_cache=True)))
    raise AssertionError(kind)


_REWRITE = textwrap.dedent(
    """
    import sys
    from shardkv import open_store
    store = open_store(sys.argv[1], layout="draft2022")
    store.setitems({"data/root/arr/c0": b"\\t\\t\\t", "data/root/arr/c1": b"\\x05"})  # c1 moves one byte on
    """
)


def _rewrite_in_another_process(path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", _REWRITE, str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("kind", ["path", "local-subclass", "dirfs-over-subclass"])
def test_a_chunk_moved_by_another_process_is_read_at_its_new_place(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "draft"
    path.mkdir()
    a = open_store(_base(kind, path), chunks_per_shard=4, layout="draft2022")
    assert isinstance(a, DraftShardedStore)
    a["zarr.json"] = ENTRY_POINT
    a["meta/root/arr.array.json"] = ARRAY
    a.setitems({C0: b"\t\t", C1: b"\x01\x02"})
    assert a[C1] == b"\x01\x02"  # A's store now caches the shard's index: c1 at bytes 2-4
    _rewrite_in_another_process(path)
    assert a[C1] == b"\x05"  # not b"\t\x05": the bytes at c1's old offsets
    assert a[C0] == b"\t\t\t"
    assert open_store(str(path))[C1] == b"\x05"


def test_draft_store_hands_its_engine_the_base_store(tmp_path: Path) -> None:
    store = open_store(str(tmp_path), chunks_per_shard=4, layout="draft2022")
    store["zarr.json"] = ENTRY_POINT
    store["meta/root/arr.array.json"] = ARRAY
    top = store.transformer("arr")
    assert top is not None
    assert top.engine.kv is store.base.kv  # type: ignore[attr-defined]  # one KVStore: its generations, its locks
    assert top.engine.kv.caps.stamps == "native" and top.concurrency_mode == "files"  # type: ignore[attr-defined]


def test_an_erase_in_another_process_is_seen(tmp_path: Path) -> None:
    """An erase of one chunk rewrites its shard through the engine: a new generation other processes see."""
    path = tmp_path / "draft"
    path.mkdir()
    a = open_store(str(path), chunks_per_shard=4, layout="draft2022")
    a["zarr.json"] = ENTRY_POINT
    a["meta/root/arr.array.json"] = ARRAY
    a.setitems({C0: b"\t\t", C1: b"\x01\x02"})
    assert a[C1] == b"\x01\x02"
    script = _REWRITE.replace(
        'store.setitems({"data/root/arr/c0": b"\\t\\t\\t", "data/root/arr/c1": b"\\x05"})',
        'del store["data/root/arr/c1"]',
    )
    done = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert C1 not in a and a.getitems([C0, C1]) == {C0: b"\t\t"}
    assert os.listdir(path / "data" / "root" / "arr") == ["c0"]

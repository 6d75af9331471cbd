"""Paths never leave the store: every path-taking method of both proxies refuses traversal.

Each proxy sits on a local directory ``outer/store`` with files beside it
(``outer/precious``, ``outer/sibling/x``) and in it. Every method that takes a
path (or a prefix) is called with paths that would reach outside (``..``,
absolute, empty segments, backslash tricks): each call must raise
:class:`InvalidKeyError` naming the path, and no file anywhere under
``outer`` may change (nor may the store's own files).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

from shardkv import ShardedStore
from shardkv.errors import InvalidKeyError
from shardkv.keys.paths import validate_path
from shardkv.metadata.documents import DRAFT_ZARR_FORMAT
from shardkv.proxy.draft import DraftShardedStore

BAD_PATHS = [
    "..",
    "../",
    "../sibling",
    "a/../..",
    "a/../../precious",
    "/",
    "/etc",
    "//x",
    "a//b",
    "a/",
    "..\\precious",
    "a\\..\\..",
    ".",
    "a/./b",
    "a/..",
]
# "/" and "a/" are fine (root, trailing '/'); they are dropped below
BAD_PATHS = [p for p in BAD_PATHS if p not in ("/", "a/")]


def tree(root: Path) -> dict[str, str]:
    """Every file under ``root`` (relative path -> sha256 of its bytes) and every directory."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for d in dirs:
            out[os.path.relpath(os.path.join(dirpath, d), root)] = "dir"
        for f in files:
            p = os.path.join(dirpath, f)
            out[os.path.relpath(p, root)] = hashlib.sha256(Path(p).read_bytes()).hexdigest()
    return out


@pytest.fixture
def outer(tmp_path: Path) -> Path:
    (tmp_path / "store").mkdir()
    (tmp_path / "precious").write_text("do not touch")
    (tmp_path / "sibling").mkdir()
    (tmp_path / "sibling" / "x").write_text("nor this")
    return tmp_path


def v2_store(outer: Path) -> ShardedStore:
    st = ShardedStore(str(outer / "store"), chunks_per_shard=2)
    z = zarr.open_array(st, mode="w", path="a", shape=(8, 8), chunks=(2, 2), dtype="i4")
    z[:] = np.arange(64).reshape(8, 8)
    return st


DRAFT_ENTRY = json.dumps(
    {
        "zarr_format": DRAFT_ZARR_FORMAT,
        "metadata_encoding": DRAFT_ZARR_FORMAT,
        "metadata_key_suffix": ".json",
        "extensions": [],
    }
).encode()
DRAFT_ARRAY = json.dumps(
    {
        "shape": [8, 8],
        "data_type": "<i2",
        "fill_value": 0,
        "extensions": [],
        "attributes": {},
        "chunk_grid": {"type": "regular", "chunk_shape": [2, 2], "separator": "/"},
        "chunk_memory_layout": "C",
    }
).encode()
DRAFT_CHUNKS = {f"data/root/a/c{i}/{j}": np.full(4, 10 * i + j, "<i2").tobytes() for i in range(4) for j in range(4)}


def draft_store(outer: Path) -> DraftShardedStore:
    """A 2022 draft hierarchy (written through the proxy's keys, as zarr 2.18's v3 API would)."""
    st = DraftShardedStore(str(outer / "store"), chunks_per_shard=(2, 2))
    st["zarr.json"] = DRAFT_ENTRY
    st["meta/root/a.array.json"] = DRAFT_ARRAY
    st.setitems(DRAFT_CHUNKS)
    assert st.storage_transformers("a")  # the array is sharded
    return st


V2_CALLS: dict[str, Callable[[Any, str], Any]] = {
    "rmdir": lambda st, p: st.rmdir(p),
    "rename_src": lambda st, p: st.rename(p, "moved"),
    "rename_dst": lambda st, p: st.rename("a", p),
    "getsize": lambda st, p: st.getsize(p),
    "listdir": lambda st, p: st.listdir(p),
    "keys_under": lambda st, p: list(st.keys_under(p)),
    "compact": lambda st, p: st.compact(p),
    "sharded_array": lambda st, p: st.sharded_array(p),
    "v3_metadata": lambda st, p: st.v3_metadata(p),
}

DRAFT_CALLS: dict[str, Callable[[Any, str], Any]] = {
    "rmdir": lambda st, p: st.rmdir(p),
    "rename_src": lambda st, p: st.rename(p, "moved"),
    "rename_dst": lambda st, p: st.rename("a", p),
    "getsize": lambda st, p: st.getsize(p),
    "listdir": lambda st, p: st.listdir(p),
    "erase_prefix": lambda st, p: st.erase_prefix(p),
    "list_prefix": lambda st, p: st.list_prefix(p),
    "list_dir": lambda st, p: st.list_dir(p),
    "storage_transformers": lambda st, p: st.storage_transformers(p),
    "transformer": lambda st, p: st.transformer(p),
}


def check_refused(outer: Path, st: Any, call: Callable[[Any, str], Any]) -> None:
    before = tree(outer)
    for path in BAD_PATHS:
        with pytest.raises(InvalidKeyError) as info:
            call(st, path)
        assert info.value.key == path, f"the error names {info.value.key!r}, not the path {path!r}"
        assert repr(path) in str(info.value)
    assert tree(outer) == before  # nothing outside the store changed, nor inside it


@pytest.mark.parametrize("method", list(V2_CALLS))
def test_sharded_store_paths_stay_inside(outer: Path, method: str) -> None:
    st = v2_store(outer)
    check_refused(outer, st, V2_CALLS[method])
    assert np.array_equal(zarr.open_array(st, mode="r", path="a")[:], np.arange(64).reshape(8, 8))


@pytest.mark.parametrize("method", list(DRAFT_CALLS))
def test_draft_store_paths_stay_inside(outer: Path, method: str) -> None:
    st = draft_store(outer)
    check_refused(outer, st, DRAFT_CALLS[method])
    assert st.getitems(list(DRAFT_CHUNKS)) == DRAFT_CHUNKS


def test_good_paths_still_work_on_both_proxies(outer: Path) -> None:
    st = v2_store(outer)
    assert st.listdir("/") == st.listdir("") == st.listdir(None) == [".zgroup", "a"]
    assert st.getsize("a/") == st.getsize("a") > 0
    st.rename("a/", "b")
    assert np.array_equal(zarr.open_array(st, mode="r", path="b")[:], np.arange(64).reshape(8, 8))
    assert not (outer / "store" / "a").exists()  # no empty directory left behind
    st.rmdir("b/")
    assert "b" not in st.listdir() and (outer / "precious").exists()
    draft = draft_store(outer)
    assert draft.getsize("a/") == draft.getsize("a") > 0
    draft.rmdir("a/")
    assert "a" not in draft.listdir("meta/root") and (outer / "sibling" / "x").exists()


def test_validate_path_rules() -> None:
    assert [validate_path(p) for p in (None, "", "/", "a", "a/", "g/a")] == ["", "", "", "a", "a", "g/a"]
    with pytest.raises(TypeError):
        validate_path(3)
    with pytest.raises(InvalidKeyError, match="src_path"):
        validate_path("x/..", what="src_path")
    with pytest.raises(InvalidKeyError, match="NUL"):
        validate_path("a\x00b")

"""``shardkv.open_store`` and ``ShardedStore(...)``: one layout choice, made with one read."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from counting_fs import CountingDict

import shardkv
from shardkv import ConfigurationError, ShardedStore, open_store
from shardkv.proxy.draft import DraftShardedStore

DRAFT_ENTRY_POINT = json.dumps(
    {
        "zarr_format": "https://purl.org/zarr/spec/protocol/core/3.0",
        "metadata_key_suffix": ".json",
        "metadata_encoding": "https://purl.org/zarr/spec/protocol/core/3.0",
        "extensions": [],
    }
).encode()
V3_GROUP = json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}}).encode()


ENTRY_POINTS = {
    "empty": ({}, ShardedStore),
    "zarr-v2": ({".zgroup": b'{"zarr_format": 2}'}, ShardedStore),
    "zarr-v3": ({"zarr.json": V3_GROUP}, ShardedStore),
    "draft2022": ({"zarr.json": DRAFT_ENTRY_POINT}, DraftShardedStore),
}


@pytest.mark.parametrize("hierarchy", sorted(ENTRY_POINTS))
def test_layout_is_detected_with_one_read(hierarchy: str) -> None:
    contents, expected = ENTRY_POINTS[hierarchy]
    base = CountingDict(contents)
    proxy = shardkv.open_store(base, 2)
    assert type(proxy) is expected
    assert base.reads == Counter({"zarr.json": 1})  # one read (a miss, for v2 and empty stores)


@pytest.mark.parametrize("hierarchy", sorted(ENTRY_POINTS))
def test_the_constructor_is_its_own_class_and_reads_nothing(hierarchy: str) -> None:
    contents, _ = ENTRY_POINTS[hierarchy]
    base = CountingDict(contents)
    assert type(ShardedStore(base, 2)) is ShardedStore  # open_store is the one code that detects a layout
    assert base.reads == Counter()
    assert type(ShardedStore(dict(), 2)) is ShardedStore


def test_a_given_layout_is_not_detected() -> None:
    draft = CountingDict({"zarr.json": DRAFT_ENTRY_POINT})
    assert type(open_store(draft, 2, layout="v2")) is ShardedStore  # what the caller asked for, no read
    assert draft.reads == Counter()
    empty = CountingDict()
    assert type(open_store(empty, 2, layout="draft2022")) is DraftShardedStore
    assert empty.reads == Counter()


def test_unknown_layout_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="draft2023"):
        open_store({}, 2, layout="draft2023")


def test_a_v3_root_read_for_detection_is_not_read_again() -> None:
    base = CountingDict({"zarr.json": V3_GROUP})
    proxy = open_store(base, 2)
    assert proxy[".zgroup"] and ".zgroup" in proxy and "zarr.json" not in proxy
    assert base.reads["zarr.json"] == 1


def test_options_of_the_v2_proxy_are_refused_in_draft_mode() -> None:
    with pytest.raises(ConfigurationError, match="buffer_bytes"):
        open_store({"zarr.json": DRAFT_ENTRY_POINT}, 2, buffer_bytes=1024)


def test_options_reach_the_chosen_proxy() -> None:
    proxy = open_store({}, (2, 3), index_location="start", buffer_bytes=1024)
    proxy[".zarray"] = json.dumps(
        {
            "zarr_format": 2,
            "shape": [8, 9],
            "chunks": [2, 2],
            "dtype": "|u1",
            "compressor": None,
            "fill_value": 0,
            "filters": None,
            "order": "C",
        }
    ).encode()
    config = proxy.v3_metadata("")["codecs"][0]["configuration"]
    assert config["index_location"] == "start"
    assert proxy.sharded_array("").chunks_per_shard == (2, 3)
    proxy["0.0"] = b"x"
    assert list(proxy.base.list_prefix("")) == ["zarr.json"]  # v3 only; buffered (write-back) until flush
    proxy.flush()
    assert "0.0" in set(proxy.base.list_prefix(""))


def test_the_constructor_takes_no_layout_and_subclasses_keep_their_class() -> None:
    class Mine(ShardedStore):
        pass

    assert type(Mine({}, 2)) is Mine
    with pytest.raises(TypeError, match="layout"):
        Mine({}, 2, layout="draft2022")  # type: ignore[call-arg]


def test_options_are_given_as_keywords_or_as_one_options_object(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from shardkv.engine.options import Options
    from shardkv.format.ranges import ReadPolicy

    keywords = dict(
        index_location="start",
        index_checksum=False,
        index_cache_bytes=1 << 20,
        read_policy=ReadPolicy(max_gap=7),
        buffer_bytes=1 << 16,
        concurrency="files",
        lock_timeout=2.0,
    )
    by_keywords = ShardedStore(str(tmp_path), 4, **keywords)  # type: ignore[arg-type]
    by_object = ShardedStore(str(tmp_path), options=by_keywords.options)
    assert by_object.options == by_keywords.options == Options.from_keywords(4, **keywords)  # type: ignore[arg-type]
    assert by_object.options.buffer_bytes == 1 << 16 and by_object.concurrency_mode == "files"
    with pytest.raises(ConfigurationError, match="chunks_per_shard"):
        ShardedStore(str(tmp_path), 4, options=by_keywords.options)
    with pytest.raises(ConfigurationError, match="buffer_bytes"):
        ShardedStore(str(tmp_path), options=by_keywords.options, buffer_bytes=1)
    with pytest.raises(TypeError, match="index_cache"):
        ShardedStore(str(tmp_path), index_cache=1)  # type: ignore[call-arg]
    with pytest.raises(ConfigurationError, match="lock_timeout"):
        ShardedStore(str(tmp_path), lock_timeout=-1.0)

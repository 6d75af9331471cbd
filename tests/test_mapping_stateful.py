"""Stateful test: ShardedStore against a ``dict`` model of its chunk keys.

Hypothesis drives random sequences of set / batch set / delete / batch delete / get /
contains / iterate / reopen over a small 2-D sharded array with edge shards (shape
(5, 7), inner chunks (2, 2), chunks_per_shard (2, 3): a 3 x 4 chunk grid in 2 x 2
shards), and checks after every step that the proxy and the model are the same mapping.
Variants check that the base store holds exactly the expected shard keys, run over an
fsspec ``memory://`` store (ranged reads and the index cache), and in write-back mode;
the same machine drives the 2022 draft sharding transformer (the same engine, through
``TransformerMapping``) over a dict, ``memory://`` and a local directory.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import uuid
from typing import Any

import fsspec
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from transformer_mapping import META_KEY as TRANSFORMER_META_KEY
from transformer_mapping import TransformerMapping, transformer_over
from transformer_mapping import chunk_key as transformer_chunk_key

from shardkv import ShardedStore, open_store
from shardkv.metadata.hierarchy import group_paths
from shardkv.proxy.draft import DraftShardedStore

SHAPE, CHUNKS, CPS, GRID = (5, 7), (2, 2), (2, 3), (3, 4)
META = (".zarray", ".zgroup", ".zattrs", "zarr.json")

coords = st.tuples(st.integers(0, GRID[0] - 1), st.integers(0, GRID[1] - 1))
values = st.binary(max_size=12)


def zarray(sep: str) -> bytes:
    return json.dumps(
        {
            "zarr_format": 2,
            "shape": list(SHAPE),
            "chunks": list(CHUNKS),
            "dtype": "|u1",
            "compressor": None,
            "fill_value": 0,
            "filters": None,
            "order": "C",
            "dimension_separator": sep,
        }
    ).encode()


class ShardedStoreMachine(RuleBasedStateMachine):
    """The proxy over a dict, root array with '.' separator."""

    path, sep = "", "."
    proxy_options: dict[str, Any] = {}

    n_metadata_keys = 1  # keys the proxy lists besides chunks (.zarray)

    def __init__(self) -> None:
        super().__init__()
        self.base = self.make_base()
        self.store = self.open_store(new=True)
        self.model: dict[str, bytes] = {}

    def make_base(self) -> Any:
        return {}

    def open_store(self, new: bool) -> Any:
        """The mapping under test over ``self.base``: a new array, or one found in the store."""
        if not new:  # no chunks_per_shard: read from zarr.json
            return open_store(self.base, **{k: v for k, v in self.proxy_options.items() if k == "buffer_bytes"})
        store = open_store(self.base, chunks_per_shard=CPS, **self.proxy_options)
        store[self.meta_key] = self.array_metadata()
        return store

    def array_metadata(self) -> bytes:
        return zarray(self.sep)

    @property
    def meta_key(self) -> str:
        return f"{self.path}/.zarray" if self.path else ".zarray"

    def key(self, c: tuple[int, int]) -> str:
        suffix = self.sep.join(map(str, c))
        return f"{self.path}/{suffix}" if self.path else suffix

    def chunk_keys_of_proxy(self) -> set[str]:
        return {k for k in self.store if k.rsplit("/", 1)[-1] not in META}

    # -- rules -----------------------------------------------------------------

    @rule(c=coords, value=values)
    def set_chunk(self, c: tuple[int, int], value: bytes) -> None:
        self.store[self.key(c)] = value
        self.model[self.key(c)] = value

    @rule(items=st.dictionaries(coords, values, max_size=8))
    def set_many(self, items: dict[tuple[int, int], bytes]) -> None:
        batch = {self.key(c): v for c, v in items.items()}
        self.store.setitems(batch)
        self.model.update(batch)

    @rule(c=coords)
    def delete_chunk(self, c: tuple[int, int]) -> None:
        key = self.key(c)
        if key in self.model:
            del self.store[key]
            del self.model[key]
        else:
            with pytest.raises(KeyError):
                del self.store[key]

    @rule(cs=st.lists(coords, max_size=6))
    def delete_many(self, cs: list[tuple[int, int]]) -> None:
        keys = [self.key(c) for c in cs]
        self.store.delitems(keys)
        for k in keys:
            self.model.pop(k, None)

    @precondition(lambda self: bool(self.model))
    @rule(data=st.data())
    def delete_existing(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.model)))
        del self.store[key]
        del self.model[key]

    @rule(c=coords)
    def get(self, c: tuple[int, int]) -> None:
        key = self.key(c)
        if key in self.model:
            assert self.store[key] == self.model[key]
        else:
            with pytest.raises(KeyError):
                self.store[key]

    @rule(cs=st.lists(coords, max_size=6))
    def get_many(self, cs: list[tuple[int, int]]) -> None:
        keys = [self.key(c) for c in cs]
        assert self.store.getitems(keys) == {k: self.model[k] for k in keys if k in self.model}

    @rule(c=coords)
    def contains(self, c: tuple[int, int]) -> None:
        assert (self.key(c) in self.store) == (self.key(c) in self.model)

    @rule()
    def iterate(self) -> None:
        assert self.chunk_keys_of_proxy() == set(self.model)
        assert len(self.store) == len(self.model) + self.n_metadata_keys

    @rule()
    def reopen(self) -> None:
        """A new proxy over the same base store (no chunks_per_shard: read from zarr.json)."""
        self.store.flush()
        self.store = self.open_store(new=False)

    # -- invariants ------------------------------------------------------------

    @invariant()
    def proxy_equals_model(self) -> None:
        keys = self.chunk_keys_of_proxy()
        assert keys == set(self.model)
        assert {k: self.store[k] for k in keys} == self.model


class ShardKeysMachine(ShardedStoreMachine):
    """Also: the base store holds exactly one shard per shard with a stored chunk."""

    @invariant()
    def base_holds_expected_shards(self) -> None:
        self.store.flush()
        stored = {k for k in self.store.base.list_prefix("") if k.rsplit("/", 1)[-1] not in META}
        expected = set()
        for key in self.model:
            r, c = (int(x) for x in key[len(self.path) + 1 if self.path else 0 :].split(self.sep))
            expected.add(self.key((r // CPS[0], c // CPS[1])))
        assert stored == expected
        meta = {k for k in self.store.base.list_prefix("") if k.rsplit("/", 1)[-1] in META}
        groups = {f"{g}/zarr.json" if g else "zarr.json" for g in group_paths(self.path)} if self.path else set()
        assert meta == {self.meta_key.replace(".zarray", "zarr.json")} | groups  # v3 only


class MemoryFSMachine(ShardKeysMachine):
    """Over fsspec memory:// (ranged reads, index cache), nested '/'-separated array, index at start."""

    path, sep = "g/arr", "/"
    proxy_options = {"index_location": "start"}
    n_metadata_keys = 3  # .zarray, and the .zgroup of "" and "g" (v3 groups)

    def make_base(self) -> Any:
        self.root = f"memory://shardkv-stateful-{uuid.uuid4().hex}"
        return self.root

    def teardown(self) -> None:
        fs = fsspec.filesystem("memory")
        if fs.exists(self.root):
            fs.rm(self.root, recursive=True)


class WriteBackMachine(ShardKeysMachine):
    """Write-back mode with a tiny buffer, so shards are also forced out by the limit."""

    proxy_options = {"buffer_bytes": 24, "index_checksum": False}


class TransformerMachine(ShardedStoreMachine):
    """The 2022 draft sharding transformer (through TransformerMapping) over a dict; same rules, same model.

    Its base store holds the relayed array metadata key and exactly one shard
    per shard with a stored chunk.
    """

    def open_store(self, new: bool) -> Any:
        store = TransformerMapping(transformer_over(self.base))  # reopened: a cold index cache
        if new:
            store[self.meta_key] = b"{}"
        return store

    @property
    def meta_key(self) -> str:
        return TRANSFORMER_META_KEY

    def key(self, c: tuple[int, int]) -> str:
        return transformer_chunk_key(c)

    def chunk_keys_of_proxy(self) -> set[str]:
        return {k for k in self.store if k != TRANSFORMER_META_KEY}

    @invariant()
    def base_holds_expected_shards(self) -> None:
        coords = (tuple(int(x) for x in k[len(transformer_chunk_key(())) :].split("/")) for k in self.model)
        expected = {transformer_chunk_key((r // CPS[0], c // CPS[1])) for r, c in coords}
        assert set(self.store.base.list_prefix("")) == expected | {TRANSFORMER_META_KEY}


class TransformerMemoryFSMachine(TransformerMachine):
    """The transformer over fsspec memory:// (ranged reads, sizes free: no read guard)."""

    make_base = MemoryFSMachine.make_base
    teardown = MemoryFSMachine.teardown


class TransformerLocalMachine(TransformerMachine):
    """The transformer over a local directory (atomic rewrites, positional index writes on erase)."""

    def make_base(self) -> Any:
        self.root = tempfile.mkdtemp(prefix="shardkv-stateful-")
        return self.root

    def teardown(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


class DraftMachine(ShardedStoreMachine):
    """The same rules on the 2022 draft proxy (ShardedStore detects the draft hierarchy), nested array."""

    n_metadata_keys = 2  # zarr.json entry point, array metadata

    def make_base(self) -> Any:
        return {
            "zarr.json": json.dumps(
                {
                    "zarr_format": "https://purl.org/zarr/spec/protocol/core/3.0",
                    "metadata_encoding": "https://purl.org/zarr/spec/protocol/core/3.0",
                    "metadata_key_suffix": ".json",
                    "extensions": [],
                }
            ).encode()
        }

    def array_metadata(self) -> bytes:
        return json.dumps(
            {
                "shape": list(SHAPE),
                "data_type": "|u1",
                "chunk_grid": {"type": "regular", "chunk_shape": list(CHUNKS), "separator": "/"},
                "chunk_memory_layout": "C",
                "fill_value": 0,
                "extensions": [],
                "attributes": {},
            }
        ).encode()

    @property
    def meta_key(self) -> str:
        return "meta/root/g/arr.array.json"

    def key(self, c: tuple[int, int]) -> str:
        return f"data/root/g/arr/c{c[0]}/{c[1]}"

    def chunk_keys_of_proxy(self) -> set[str]:
        return {k for k in self.store if k.startswith("data/")}

    @invariant()
    def opened_as_draft_proxy(self) -> None:
        assert isinstance(self.store, DraftShardedStore)


_settings = settings(
    max_examples=40, stateful_step_count=25, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def _test_case(machine: type[RuleBasedStateMachine], chosen: settings) -> Any:
    case = machine.TestCase
    case.settings = chosen
    return case


TestShardedStoreStateful = _test_case(ShardedStoreMachine, _settings)
TestShardKeysStateful = _test_case(ShardKeysMachine, _settings)
TestMemoryFSStateful = _test_case(MemoryFSMachine, _settings)
TestWriteBackStateful = _test_case(WriteBackMachine, _settings)
_transformer_settings = settings(
    max_examples=15, stateful_step_count=15, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestTransformerStateful = _test_case(TransformerMachine, _transformer_settings)
TestTransformerMemoryFSStateful = _test_case(TransformerMemoryFSMachine, _transformer_settings)
TestTransformerLocalStateful = _test_case(TransformerLocalMachine, _transformer_settings)
TestDraftStateful = _test_case(DraftMachine, _settings)


# -- metadata through the proxy, with zarr-python 2 semantics -----------------------------------

_NAMES = ("a", "b")
_attrs = st.dictionaries(st.sampled_from(["x", "y", "units"]), st.integers(-3, 3) | st.text(max_size=3), max_size=2)
_shapes = st.tuples(st.integers(0, 9), st.integers(0, 9))


def _grid(shape: list[int]) -> tuple[int, int]:
    return (-(-shape[0] // CHUNKS[0]), -(-shape[1] // CHUNKS[1]))


class MetadataMachine(RuleBasedStateMachine):
    """Groups, arrays, resizes, attributes and rmdir through the proxy over a dict, against a model.

    The model holds the presented v2 documents by key (``.zgroup``, ``.zarray``,
    ``.zattrs``) and the chunks by key. Arrays are 2-D and sharded (chunks
    ``CHUNKS``, ``CPS`` per shard); resizing goes through zarr-python 2.18's
    ``Array.resize`` (which rewrites ``.zarray`` and deletes the chunks outside the
    new grid), deletion through zarr's ``rmdir``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.base: dict[str, bytes] = {}
        self.store = ShardedStore(self.base, chunks_per_shard=CPS)
        self.docs: dict[str, dict[str, Any]] = {}
        self.chunks: dict[str, bytes] = {}
        self._write(".zgroup", {"zarr_format": 2})

    def _write(self, key: str, doc: dict[str, Any]) -> None:
        self.store[key] = json.dumps(doc).encode()
        self.docs[key] = doc

    def _nodes(self, name: str) -> list[str]:
        return sorted(k.rpartition("/")[0] for k in self.docs if k.rpartition("/")[2] == name)

    def _arrays(self) -> list[str]:
        return self._nodes(".zarray")

    def _groups(self) -> list[str]:
        return [g for g in self._nodes(".zgroup") if g]  # the root is never removed

    def _free(self, path: str) -> bool:
        return not any(k == path or k.startswith(path + "/") for k in [*self.docs, *self.chunks])

    # -- rules -----------------------------------------------------------------

    @rule(parent=st.sampled_from(["", "g"]), name=st.sampled_from(["g", "h"]))
    def create_group(self, parent: str, name: str) -> None:
        path = f"{parent}/{name}" if parent else name
        if (parent and f"{parent}/.zgroup" not in self.docs) or not self._free(path):
            return
        self._write(f"{path}/.zgroup", {"zarr_format": 2})

    @rule(parent=st.sampled_from(["", "g", "g/h"]), name=st.sampled_from(_NAMES), shape=_shapes)
    def create_array(self, parent: str, name: str, shape: tuple[int, int]) -> None:
        path = f"{parent}/{name}" if parent else name
        if (parent and f"{parent}/.zgroup" not in self.docs) or not self._free(path):
            return
        doc = json.loads(zarray("."))
        doc["shape"] = list(shape)
        self._write(f"{path}/.zarray", doc)

    @precondition(lambda self: bool(self._arrays()))
    @rule(data=st.data(), value=values)
    def set_chunk(self, data: st.DataObject, value: bytes) -> None:
        path = data.draw(st.sampled_from(self._arrays()))
        grid = _grid(self.docs[f"{path}/.zarray"]["shape"])
        if 0 in grid:
            return
        c = data.draw(st.tuples(st.integers(0, grid[0] - 1), st.integers(0, grid[1] - 1)))
        key = f"{path}/{c[0]}.{c[1]}"
        self.store[key] = value
        self.chunks[key] = value

    @precondition(lambda self: bool(self._arrays()))
    @rule(data=st.data(), shape=_shapes)
    def resize(self, data: st.DataObject, shape: tuple[int, int]) -> None:
        import zarr

        path = data.draw(st.sampled_from(self._arrays()))
        zarr.Array(self.store, path=path).resize(*shape)
        self.docs[f"{path}/.zarray"]["shape"] = list(shape)
        grid = _grid(list(shape))
        for key in [k for k in self.chunks if k.rpartition("/")[0] == path]:
            r, c = (int(x) for x in key.rpartition("/")[2].split("."))
            if r >= grid[0] or c >= grid[1]:
                del self.chunks[key]

    @rule(data=st.data(), attrs=_attrs)
    def set_attributes(self, data: st.DataObject, attrs: dict[str, Any]) -> None:
        path = data.draw(st.sampled_from(["", *self._groups(), *self._arrays()]))
        self._write(f"{path}/.zattrs" if path else ".zattrs", attrs)

    @precondition(lambda self: bool(self._groups() or self._arrays()))
    @rule(data=st.data())
    def remove(self, data: st.DataObject) -> None:
        from zarr.storage import rmdir

        path = data.draw(st.sampled_from([*self._groups(), *self._arrays()]))
        rmdir(self.store, path)
        for model in (self.docs, self.chunks):
            for key in [k for k in model if k.startswith(path + "/")]:
                del model[key]

    @rule()
    def reopen(self) -> None:
        self.store.flush()
        self.store = ShardedStore(self.base, chunks_per_shard=CPS)  # new arrays sharded as before

    # -- invariants ------------------------------------------------------------

    @invariant()
    def presented_documents_equal_the_model(self) -> None:
        # zarr 2 reads a missing .zattrs as {}: empty attributes may be presented or not (v3 stores them inline)
        listed = {k for k in self.store if k.rpartition("/")[2] in (".zarray", ".zattrs", ".zgroup")}
        for key, doc in self.docs.items():
            if key.endswith(".zattrs") and doc == {} and key not in listed:
                assert key not in self.store, key
                continue
            assert key in listed and json.loads(self.store[key]) == doc, key
        for key in listed - set(self.docs):
            assert key.endswith(".zattrs") and json.loads(self.store[key]) == {}, key

    @invariant()
    def chunks_equal_the_model(self) -> None:
        chunks = {k for k in self.store if k.rpartition("/")[2] not in META}
        assert chunks == set(self.chunks)
        assert {k: self.store[k] for k in chunks} == self.chunks

    @invariant()
    def stored_documents_agree(self) -> None:
        self.store.flush()
        for path in self._arrays():
            prefix = f"{path}/"
            assert prefix + ".zarray" not in self.base and prefix + ".zattrs" not in self.base, path
            stored = json.loads(self.base[prefix + "zarr.json"])
            assert stored["shape"] == self.docs[prefix + ".zarray"]["shape"], path
            assert stored["attributes"] == self.docs.get(prefix + ".zattrs", {}), path
            grid = _grid(stored["shape"])
            shard_grid = (-(-grid[0] // CPS[0]), -(-grid[1] // CPS[1]))
            for key in [k for k in self.base if k.rpartition("/")[0] == path and k.rpartition("/")[2] not in META]:
                r, c = (int(x) for x in key.rpartition("/")[2].split("."))
                assert r < shard_grid[0] and c < shard_grid[1], f"shard {key} outside the grid {grid}"
        for key, raw in self.base.items():
            path, _, name = key.rpartition("/")
            doc = json.loads(raw) if name == "zarr.json" else None
            if doc is not None and doc.get("node_type") == "group":
                zattrs = f"{path}/.zattrs" if path else ".zattrs"
                assert doc["attributes"] == self.docs.get(zattrs, {}), key


TestMetadataStateful = _test_case(
    MetadataMachine,
    settings(max_examples=30, stateful_step_count=20, deadline=None, suppress_health_check=[HealthCheck.too_slow]),
)

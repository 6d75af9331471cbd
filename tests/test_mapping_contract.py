"""The MutableMapping contract, applied to ShardedStore and the draft transformer over every kind of base store.

:class:`MutableMappingContract` is a reusable suite: a subclass provides a ``mapping``
fixture, the ``initial`` items it holds and ``items`` to add. It runs once against a
plain ``dict`` (so the suite itself is known to describe real mapping semantics) and
then against ``ShardedStore`` over ``dict``, fsspec ``memory://``, a local directory and
a zarr-python 2 ``DirectoryStore``, with a sharded array created by writing a ``.zarray``,
and against the 2022 draft sharding transformer (through :class:`TransformerMapping`)
over ``dict``, ``memory://`` and a local directory.
:class:`TestShardedStoreRules` adds the proxy's own rules (bad input, hidden metadata,
shards appearing and disappearing in the base store).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator, MutableMapping
from pathlib import Path
from typing import Any

import fsspec
import pytest
import zarr
from transformer_mapping import META_KEY as TRANSFORMER_META_KEY
from transformer_mapping import TransformerMapping, transformer_over
from transformer_mapping import chunk_key as transformer_chunk_key

from shardkv import ChunkOutOfGridError, InvalidKeyError, ReservedKeyError, ShardedStore, open_store
from shardkv.proxy.draft import DraftShardedStore

# The test array: shape (5, 7), inner chunks (2, 2) -> chunk grid (3, 4);
# chunks_per_shard (2, 3) -> shard grid (2, 2), edge shards in both dimensions
# (shard (1, 1) holds a single in-grid chunk, (2, 3)).
SHAPE, CHUNKS, CPS = (5, 7), (2, 2), (2, 3)
GRID = (3, 4)


def zarray_json(separator: str, shape: tuple[int, ...] = SHAPE, chunks: tuple[int, ...] = CHUNKS) -> bytes:
    doc = {
        "zarr_format": 2,
        "shape": list(shape),
        "chunks": list(chunks),
        "dtype": "|u1",
        "compressor": None,
        "fill_value": 0,
        "filters": None,
        "order": "C",
        "dimension_separator": separator,
    }
    return json.dumps(doc, indent=4, sort_keys=True).encode()


def make_base(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Any:
    """A fresh, empty base store of the given kind (cleaned up after the test)."""
    if kind == "dict":
        return {}
    if kind == "memory":
        root = f"memory://shardkv-test-{uuid.uuid4().hex}"
        fs = fsspec.filesystem("memory")

        def cleanup() -> None:
            if fs.exists(root):
                fs.rm(root, recursive=True)

        request.addfinalizer(cleanup)
        return root
    if kind == "local":
        return str(tmp_path / "local-store")
    if kind == "zarr-DirectoryStore":
        return zarr.storage.DirectoryStore(str(tmp_path / "directory-store"))
    raise ValueError(kind)


ZGROUP = b'{\n    "zarr_format": 2\n}'
BASES = ["dict", "memory", "local", "zarr-DirectoryStore"]

# where the sharded array lives: (array path, separator, group keys above it)
PLACEMENTS = {
    "root-dot": ("", ".", {}),
    # groups above a sharded array are stored as v3 groups and presented in zarr-python 2's own spelling
    "nested-slash": ("g/a", "/", {".zgroup": ZGROUP, "g/.zgroup": ZGROUP}),
}


def chunk_key(path: str, sep: str, coords: tuple[int, ...]) -> str:
    suffix = sep.join(str(c) for c in coords)
    return f"{path}/{suffix}" if path else suffix


def value_for(coords: tuple[int, ...]) -> bytes:
    return bytes([17 * coords[0] + coords[1]]) * (1 + coords[0] + 2 * coords[1])  # distinct lengths too


def sharded_store(base: Any, placement: str, **kwargs: Any) -> tuple[ShardedStore, dict[str, bytes]]:
    """A proxy over ``base`` holding one empty sharded array; returns it and its initial items."""
    path, sep, groups = PLACEMENTS[placement]
    store = ShardedStore(base, chunks_per_shard=CPS, **kwargs)
    initial = dict(groups)
    for k, v in groups.items():
        store[k] = v
    zarray_key = f"{path}/.zarray" if path else ".zarray"
    store[zarray_key] = zarray_json(sep)
    initial[zarray_key] = zarray_json(sep)
    assert store.sharded_array(path) is not None
    return store, initial


# -- the reusable contract ---------------------------------------------------------


class MutableMappingContract:
    """MutableMapping semantics. Subclasses provide fixtures ``mapping``, ``initial``, ``items``.

    ``initial``: the items ``mapping`` holds at the start; ``items``: at least four
    ``(key, value)`` pairs with distinct keys not in ``initial`` and bytes values.
    """

    @staticmethod
    def _as_dict(mapping: MutableMapping) -> dict[str, bytes]:
        return {k: bytes(v) for k, v in mapping.items()}

    def test_initial_contents(self, mapping, initial) -> None:
        assert self._as_dict(mapping) == initial
        assert len(mapping) == len(initial)
        assert sorted(mapping) == sorted(initial)

    def test_set_then_get(self, mapping, initial, items) -> None:
        for k, v in items:
            mapping[k] = v
        for k, v in items:
            assert bytes(mapping[k]) == v
        assert self._as_dict(mapping) == {**initial, **dict(items)}

    def test_overwrite(self, mapping, items) -> None:
        (k, v), (_, other) = items[0], items[1]
        mapping[k] = v
        mapping[k] = other
        assert bytes(mapping[k]) == other
        mapping[k] = b""
        assert bytes(mapping[k]) == b""  # an empty value is a stored value
        assert k in mapping

    def test_contains(self, mapping, initial, items) -> None:
        for k in initial:
            assert k in mapping
        for k, _ in items:
            assert k not in mapping
        mapping[items[0][0]] = items[0][1]
        assert items[0][0] in mapping
        assert all(k not in mapping for k, _ in items[1:])
        assert items[0][0] in mapping.keys()

    def test_missing_key(self, mapping, items) -> None:
        k = items[0][0]
        with pytest.raises(KeyError):
            mapping[k]
        assert mapping.get(k) is None
        assert mapping.get(k, b"default") == b"default"

    def test_delete(self, mapping, initial, items) -> None:
        for k, v in items:
            mapping[k] = v
        del mapping[items[1][0]]
        assert items[1][0] not in mapping
        with pytest.raises(KeyError):
            mapping[items[1][0]]
        with pytest.raises(KeyError):
            del mapping[items[1][0]]
        expected = {**initial, **dict(items)}
        del expected[items[1][0]]
        assert self._as_dict(mapping) == expected

    def test_delete_missing(self, mapping, items) -> None:
        with pytest.raises(KeyError):
            del mapping[items[0][0]]

    def test_views(self, mapping, initial, items) -> None:
        for k, v in items:
            mapping[k] = v
        expected = {**initial, **dict(items)}
        assert sorted(mapping.keys()) == sorted(expected)
        assert sorted(bytes(v) for v in mapping.values()) == sorted(expected.values())
        assert sorted((k, bytes(v)) for k, v in mapping.items()) == sorted(expected.items())
        assert len(mapping) == len(expected)
        assert len(list(iter(mapping))) == len(set(mapping))  # no key listed twice

    def test_pop(self, mapping, initial, items) -> None:
        (k, v), (missing, _) = items[0], items[1]
        mapping[k] = v
        assert bytes(mapping.pop(k)) == v
        assert k not in mapping
        assert mapping.pop(missing, b"dflt") == b"dflt"
        with pytest.raises(KeyError):
            mapping.pop(missing)
        assert self._as_dict(mapping) == initial

    def test_update(self, mapping, initial, items) -> None:
        mapping.update(dict(items[:2]))
        mapping.update(iter(items[2:]))
        assert self._as_dict(mapping) == {**initial, **dict(items)}

    def test_setdefault(self, mapping, items) -> None:
        (k, v), (_, other) = items[0], items[1]
        assert bytes(mapping.setdefault(k, v)) == v
        assert bytes(mapping.setdefault(k, other)) == v
        assert bytes(mapping[k]) == v

    def test_clear(self, mapping, items) -> None:
        for k, v in items:
            mapping[k] = v
        mapping.clear()
        assert len(mapping) == 0
        assert list(mapping) == []
        assert all(k not in mapping for k, _ in items)


# -- the contract on a dict: the suite itself is right --------------------------------


class TestContractOnDict(MutableMappingContract):
    @pytest.fixture
    def initial(self) -> dict[str, bytes]:
        return {".zarray": zarray_json(".")}

    @pytest.fixture
    def mapping(self, initial) -> dict[str, bytes]:
        return dict(initial)

    @pytest.fixture
    def items(self) -> list[tuple[str, bytes]]:
        return [(chunk_key("", ".", c), value_for(c)) for c in [(0, 0), (0, 1), (2, 3), (1, 2), (2, 0)]]


# -- the contract on ShardedStore --------------------------------------------------------


PROXY_CASES = [
    pytest.param((base, placement, {}), id=f"{base}-{placement}") for base in BASES for placement in PLACEMENTS
] + [
    pytest.param(
        ("dict", "root-dot", {"index_location": "start", "index_checksum": False}), id="dict-root-dot-index-start-nocrc"
    ),
    pytest.param(("memory", "nested-slash", {"index_location": "start"}), id="memory-nested-slash-index-start"),
    pytest.param(("local", "root-dot", {"buffer_bytes": 1 << 20}), id="local-root-dot-write-back"),
]


def _proxy_case(
    param: Any, tmp_path: Path, request: pytest.FixtureRequest
) -> tuple[Any, dict[str, bytes], str, str, Any]:
    kind, placement, kwargs = param
    base = make_base(kind, tmp_path, request)
    if placement == "draft2022":
        return (*draft_store(base), "", "", base)
    store, initial = sharded_store(base, placement, **kwargs)
    path, sep, _ = PLACEMENTS[placement]
    return store, initial, path, sep, base


@pytest.fixture(params=PROXY_CASES)
def proxy_case(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[ShardedStore, dict[str, bytes], str, str, Any]:
    return _proxy_case(request.param, tmp_path, request)


# the 2022 draft proxy (DraftShardedStore, found by ShardedStore's layout detection) under the same contract
DRAFT_CASES = [pytest.param((base, "draft2022", {}), id=f"draft2022-{base}") for base in ("dict", "memory")]
DRAFT_ENTRY_POINT = json.dumps(
    {
        "zarr_format": "https://purl.org/zarr/spec/protocol/core/3.0",
        "metadata_key_suffix": ".json",
        "extensions": [],
        "metadata_encoding": "https://purl.org/zarr/spec/protocol/core/3.0",
    }
).encode()


def draft_store(base: Any) -> tuple[Any, dict[str, bytes]]:
    """The proxy over a new draft hierarchy holding one empty sharded array at ``g/a``; and its initial items."""
    if isinstance(base, str):
        fsspec.get_mapper(base)["zarr.json"] = DRAFT_ENTRY_POINT
    else:
        base["zarr.json"] = DRAFT_ENTRY_POINT
    store = open_store(base, chunks_per_shard=CPS)
    assert isinstance(store, DraftShardedStore)
    store["meta/root/g/a.array.json"] = json.dumps(
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
    assert store.storage_transformers("g/a") != []
    return store, {"zarr.json": DRAFT_ENTRY_POINT, "meta/root/g/a.array.json": store["meta/root/g/a.array.json"]}


@pytest.fixture(params=PROXY_CASES + DRAFT_CASES)
def contract_case(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Any, dict[str, bytes], str, str, Any]:
    return _proxy_case(request.param, tmp_path, request)


def _base_keys(mapping: Any) -> list[str]:
    base = mapping.base
    return list(base.list_prefix(""))


class TestContractOnShardedStore(MutableMappingContract):
    @pytest.fixture
    def mapping(self, contract_case) -> ShardedStore:
        return contract_case[0]

    @pytest.fixture
    def initial(self, contract_case) -> dict[str, bytes]:
        return contract_case[1]

    @pytest.fixture
    def items(self, contract_case) -> list[tuple[str, bytes]]:
        store, _, path, sep, _ = contract_case
        coords = [(0, 0), (0, 1), (2, 3), (1, 2), (2, 0)]
        if isinstance(store, DraftShardedStore):
            return [(f"data/root/g/a/c{r}/{c}", value_for((r, c))) for r, c in coords]
        # (0,0),(0,1) share shard (0,0); (2,3) is alone in edge shard (1,1); (1,2) in shard (0,0); (2,0) in (1,0)
        return [(chunk_key(path, sep, c), value_for(c)) for c in coords]

    def test_clear_empties_the_base_store(self, mapping, items) -> None:
        for k, v in items:
            mapping[k] = v
        mapping.clear()
        assert _base_keys(mapping) == []


# -- the contract on the 2022 draft sharding transformer (one engine, same contract) ----------


@pytest.fixture(params=["dict", "memory", "local"])
def transformer_case(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[TransformerMapping, dict[str, bytes]]:
    base = make_base(request.param, tmp_path, request)
    mapping = TransformerMapping(transformer_over(base))
    initial = {TRANSFORMER_META_KEY: b"{}"}  # a relayed key, stored as it is
    mapping.update(initial)
    return mapping, initial


class TestContractOnShardingTransformer(MutableMappingContract):
    @pytest.fixture
    def mapping(self, transformer_case) -> TransformerMapping:
        return transformer_case[0]

    @pytest.fixture
    def initial(self, transformer_case) -> dict[str, bytes]:
        return transformer_case[1]

    @pytest.fixture
    def items(self) -> list[tuple[str, bytes]]:
        # the same chunks as for the proxy: shared shards, an edge shard, two shards of one row
        return [(transformer_chunk_key(c), value_for(c)) for c in [(0, 0), (0, 1), (2, 3), (1, 2), (2, 0)]]

    def test_clear_empties_the_base_store(self, mapping, items) -> None:
        for k, v in items:
            mapping[k] = v
        mapping.clear()
        assert list(mapping.base.list_prefix("")) == []


# -- the proxy's own rules ----------------------------------------------------------------


class _Proxy:
    """Small helper bundle for the rule tests."""

    def __init__(self, store: ShardedStore, path: str, sep: str) -> None:
        self.store, self.path, self.sep = store, path, sep

    def key(self, *coords: int) -> str:
        return chunk_key(self.path, self.sep, coords)

    def shard(self, *coords: int) -> str:
        return chunk_key(self.path, self.sep, coords)  # shard keys use the array's v2 encoding too

    def base_keys(self) -> set[str]:
        self.store.flush()
        return set(self.store.base.list_prefix(""))

    def prefixed(self, name: str) -> str:
        return f"{self.path}/{name}" if self.path else name


@pytest.fixture
def proxy(proxy_case) -> _Proxy:
    store, _, path, sep, _ = proxy_case
    return _Proxy(store, path, sep)


class TestShardedStoreRules:
    @pytest.mark.parametrize(
        "value",
        [
            pytest.param(123, id="int"),
            pytest.param("text", id="str"),
            pytest.param(None, id="None"),
            pytest.param([1, 2], id="list"),
            pytest.param(object(), id="object"),
        ],
    )
    def test_non_bytes_value_is_type_error_naming_the_key(self, proxy: _Proxy, value: Any) -> None:
        key = proxy.key(1, 1)
        with pytest.raises(TypeError, match=repr(key)):
            proxy.store[key] = value
        with pytest.raises(TypeError, match=repr(key)):
            proxy.store.update({proxy.key(0, 0): b"ok", key: value})
        assert key not in proxy.store

    def test_bytes_like_values_are_accepted(self, proxy: _Proxy) -> None:
        import numpy as np

        proxy.store[proxy.key(0, 0)] = bytearray(b"ab")
        proxy.store[proxy.key(0, 1)] = memoryview(b"cd")
        proxy.store[proxy.key(1, 0)] = np.array([[1, 2], [3, 4]], dtype="<u2")
        assert proxy.store[proxy.key(0, 0)] == b"ab"
        assert proxy.store[proxy.key(0, 1)] == b"cd"
        assert proxy.store[proxy.key(1, 0)] == np.array([[1, 2], [3, 4]], dtype="<u2").tobytes()

    @pytest.mark.parametrize(
        "coords",
        [
            pytest.param((3, 0), id="row-past-grid"),
            pytest.param((0, 4), id="col-past-grid"),
            pytest.param((9, 9), id="both"),
        ],
    )
    def test_out_of_grid_chunk_key(self, proxy: _Proxy, coords: tuple[int, int]) -> None:
        key = proxy.key(*coords)
        before = proxy.base_keys()
        with pytest.raises(ChunkOutOfGridError) as info:
            proxy.store[key]
        assert info.value.grid_shape == GRID and info.value.chunk_coords == coords
        assert isinstance(info.value, ValueError)
        with pytest.raises(ChunkOutOfGridError):
            proxy.store[key] = b"x"
        assert key not in proxy.store
        # nothing can be stored outside the grid: deleting is a plain KeyError
        with pytest.raises(KeyError):
            del proxy.store[key]
        assert proxy.base_keys() == before

    @pytest.mark.parametrize(
        "suffix",
        [
            pytest.param("01{s}0", id="leading-zero"),
            pytest.param("0{s}0{s}0", id="too-many-coords"),
            pytest.param("0", id="too-few-coords"),
            pytest.param("c0{s}0", id="v3-style"),
            pytest.param("0{s}{s}1", id="empty-coord"),
            pytest.param("-1{s}0", id="negative"),
            pytest.param("+1{s}0", id="plus-sign"),
            pytest.param("1{s}-0", id="negative-zero"),
        ],
    )
    def test_malformed_chunk_key(self, proxy: _Proxy, suffix: str) -> None:
        key = proxy.prefixed(suffix.format(s=proxy.sep))
        with pytest.raises(InvalidKeyError) as info:
            proxy.store[key]
        assert info.value.key == key and not isinstance(info.value, ChunkOutOfGridError)
        with pytest.raises(InvalidKeyError):
            proxy.store[key] = b"x"
        with pytest.raises(InvalidKeyError):
            del proxy.store[key]
        assert key not in proxy.store

    @pytest.mark.parametrize(
        "key",
        [
            pytest.param("../0.0", id="dotdot-first"),
            pytest.param("g/../0.0", id="dotdot-inside"),
            pytest.param("g//a/0.0", id="empty-segment"),
            pytest.param("/0.0", id="leading-slash"),
            pytest.param("g/a/", id="trailing-slash"),
            pytest.param("./0.0", id="dot"),
            pytest.param("", id="empty"),
        ],
    )
    def test_key_hygiene(self, proxy: _Proxy, key: str) -> None:
        with pytest.raises(InvalidKeyError):
            proxy.store[key]
        with pytest.raises(InvalidKeyError):
            proxy.store[key] = b"x"
        with pytest.raises(InvalidKeyError):
            del proxy.store[key]
        assert key not in proxy.store

    @pytest.mark.parametrize(
        "key", [pytest.param(b"0.0", id="bytes"), pytest.param(0, id="int"), pytest.param(None, id="None")]
    )
    def test_non_str_keys(self, proxy: _Proxy, key: Any) -> None:
        with pytest.raises(TypeError):
            proxy.store[key]
        with pytest.raises(TypeError):
            proxy.store[key] = b"x"
        assert key not in proxy.store

    def test_missing_chunk_is_key_error(self, proxy: _Proxy) -> None:
        with pytest.raises(KeyError):  # no shard at all
            proxy.store[proxy.key(0, 0)]
        proxy.store[proxy.key(0, 0)] = b"x"
        with pytest.raises(KeyError) as info:  # shard stored, chunk empty
            proxy.store[proxy.key(1, 1)]
        assert info.value.args == (proxy.key(1, 1),)
        assert not isinstance(info.value, ValueError)

    def test_delete_last_chunk_deletes_the_shard(self, proxy: _Proxy) -> None:
        a, b, edge = proxy.key(0, 0), proxy.key(1, 2), proxy.key(2, 3)
        proxy.store.update({a: b"a", b: b"b", edge: b"e"})
        assert {proxy.shard(0, 0), proxy.shard(1, 1)} <= proxy.base_keys()
        del proxy.store[a]
        assert proxy.shard(0, 0) in proxy.base_keys()
        del proxy.store[b]
        assert proxy.shard(0, 0) not in proxy.base_keys()
        del proxy.store[edge]
        assert proxy.shard(1, 1) not in proxy.base_keys()
        assert proxy.base_keys() == {
            k for k in proxy.base_keys() if k.rsplit("/", 1)[-1] in (".zarray", ".zgroup", "zarr.json")
        }

    def test_listing_shows_only_stored_chunks(self, proxy: _Proxy) -> None:
        written = [(0, 0), (1, 2), (2, 3), (2, 0)]
        for c in written:
            proxy.store[proxy.key(*c)] = value_for(c)
        chunk_keys = {k for k in proxy.store if k.rsplit("/", 1)[-1] not in (".zarray", ".zgroup")}
        assert chunk_keys == {proxy.key(*c) for c in written}
        assert len(proxy.store) == len(list(proxy.store))
        for r in range(GRID[0]):
            for c in range(GRID[1]):
                assert (proxy.key(r, c) in proxy.store) == ((r, c) in written)
        # the base store holds shards, one per touched shard, not chunks
        shards = {k for k in proxy.base_keys() if k.rsplit("/", 1)[-1] not in (".zarray", ".zgroup", "zarr.json")}
        assert shards == {proxy.shard(0, 0), proxy.shard(1, 1), proxy.shard(1, 0)}

    def test_managed_zarr_json_is_hidden(self, proxy: _Proxy) -> None:
        zjson = proxy.prefixed("zarr.json")
        assert zjson in proxy.base_keys()
        assert zjson not in proxy.store
        assert zjson not in set(proxy.store)
        with pytest.raises(KeyError):
            proxy.store[zjson]
        with pytest.raises(ReservedKeyError) as info:
            proxy.store[zjson] = b"{}"
        assert isinstance(info.value, ValueError)
        with pytest.raises(ReservedKeyError):
            del proxy.store[zjson]
        assert zjson in proxy.base_keys()
        assert proxy.store.sharded_array(proxy.path) is not None

    def test_sharding_survives_a_new_proxy(self, proxy_case) -> None:
        store, _, path, sep, base = proxy_case
        store[chunk_key(path, sep, (2, 3))] = b"edge"
        store.flush()
        again = ShardedStore(base)  # chunks_per_shard=None: found from the stored zarr.json
        assert again[chunk_key(path, sep, (2, 3))] == b"edge"
        assert again.sharded_array(path).chunks_per_shard == CPS  # type: ignore[union-attr]


# -- errors of the base store propagate -------------------------------------------------------


class DenyingStore(MutableMapping):
    """A dict-backed mapping whose reads of chosen keys raise PermissionError."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.deny: Callable[[str], bool] = lambda key: False

    def __getitem__(self, key: str) -> bytes:
        if self.deny(key):
            raise PermissionError(f"access denied: {key}")
        return self.data[key]

    def __setitem__(self, key: str, value: bytes) -> None:
        self.data[key] = bytes(value)

    def __delitem__(self, key: str) -> None:
        del self.data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(list(self.data))

    def __len__(self) -> int:
        return len(self.data)


@pytest.mark.parametrize("placement", list(PLACEMENTS))
@pytest.mark.parametrize("denied", ["shards", "everything"])
def test_permission_error_propagates_and_is_not_key_error(placement: str, denied: str) -> None:
    base = DenyingStore()
    store, _ = sharded_store(base, placement, concurrency="process")
    path, sep, _ = PLACEMENTS[placement]
    stored, empty = chunk_key(path, sep, (0, 0)), chunk_key(path, sep, (0, 1))
    store[stored] = b"secret"
    fresh = ShardedStore(base, concurrency="process")  # nothing cached: discovers the array under the denial
    if denied == "shards":
        base.deny = lambda key: key.rsplit("/", 1)[-1] not in (".zarray", ".zgroup", "zarr.json")
    else:
        base.deny = lambda key: True
        with pytest.raises(PermissionError):
            ShardedStore(base, concurrency="process")[stored]
    for proxy in (store, fresh):
        for key in (stored, empty):
            with pytest.raises(PermissionError) as info:
                proxy[key]
            assert not isinstance(info.value, KeyError)
            with pytest.raises(PermissionError):
                proxy.get(key, b"default")  # Mapping.get only swallows KeyError
            with pytest.raises(PermissionError):
                key in proxy  # noqa: B015
            with pytest.raises(PermissionError):
                proxy.getitems([key])
        with pytest.raises(PermissionError):
            proxy[chunk_key(path, sep, (1, 1))] = b"needs the old shard"
    base.deny = lambda key: False
    assert fresh[stored] == b"secret"  # nothing was lost or rewritten


# -- damaged shards are never served as data ------------------------------------------------


@pytest.mark.parametrize("kind", ["dict", "memory", "local"])
@pytest.mark.parametrize("location", ["end", "start"])
@pytest.mark.parametrize("damage", ["flip-index-bit", "truncate-chunk-data"])
def test_damaged_shard_raises_corrupt_shard_error(
    kind: str, location: str, damage: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    from shardkv import ChecksumError, CorruptShardError

    base = make_base(kind, tmp_path, request)
    store, _ = sharded_store(base, "root-dot", index_location=location)
    store.update({"0.0": b"a" * 10, "0.1": b"b" * 10, "1.2": b"c" * 10})  # all in shard "0.0"
    shard = bytearray(store.base.get("0.0").whole())
    index_nbytes = 16 * CPS[0] * CPS[1] + 4
    if damage == "flip-index-bit":
        shard[3 if location == "start" else len(shard) - index_nbytes + 3] ^= 0x01
        expected: type = ChecksumError
    elif location == "start":
        del shard[-4:]  # the tail of the last chunk
        expected = CorruptShardError
    else:
        del shard[26:30]  # the tail of the last chunk, before the index
        expected = CorruptShardError
    store.base.put("0.0", bytes(shard))
    fresh = ShardedStore(base)
    with pytest.raises(expected) as info:
        fresh["1.2"]
    assert info.value.shard_key == "0.0"
    assert "'0.0'" in str(info.value)
    assert not isinstance(info.value, KeyError)

"""Shared pieces of the benchmark workloads: sizes, data, counters, output.

Each workload is a script run by ``benchmarks/run.py`` in one of the two test
environments (zarr-python 2.18 or zarr-python 3); it prints one JSON line of
raw measurements (every repetition, no summary) on stdout. This module imports
neither zarr nor shardkv at import time, so every workload can use it in either
environment.

Array layout shared by every workload: 2-D float32, inner chunks 64 x 64,
shards 512 x 512 (``chunks_per_shard`` 8 x 8), blosc lz4 clevel 5 byte shuffle.
Data: standard normal float32 noise (seeded), which blosc compresses only a
little, so stored bytes stay close to array bytes.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import platform
import resource
import shutil
import statistics
import sys
import tempfile
from collections.abc import Iterator, MutableMapping
from typing import Any

import numpy as np

CHUNKS = (64, 64)
SHARD_SHAPE = (512, 512)
CHUNKS_PER_SHARD = 8
DTYPE = "float32"
MiB = 1 << 20

# Array shapes per size. p2 (chunk-by-chunk writes) uses a smaller array at
# full size: every chunk is one zarr call, and the mode without write-back
# rewrites a whole shard per chunk (quadratic in chunks per shard). ``smoke``
# is the test suite's check that every workload runs and reports its fields
# (tests/test_benchmarks_smoke.py): a few chunks, two shards (the second
# partial); its figures mean nothing.
SIZES: dict[str, dict[str, Any]] = {
    "smoke": {"p1_shape": (256, 576), "p2_shape": (256, 576), "p3_reads": 4, "p6_shape": (512, 1024)},
    "tiny": {"p1_shape": (512, 512), "p2_shape": (512, 512), "p3_reads": 20, "p6_shape": (1024, 1024)},
    "small": {"p1_shape": (1024, 1024), "p2_shape": (1024, 1024), "p3_reads": 200, "p6_shape": (4096, 4096)},
    "full": {"p1_shape": (8192, 8192), "p2_shape": (2048, 2048), "p3_reads": 200, "p6_shape": (16384, 16384)},
}


def warmup_shape(size: str) -> tuple[int, int]:
    """The array of a workload's untimed warm-up round: tiny's P1 array, or smoke's at size smoke."""
    return SIZES["smoke" if size == "smoke" else "tiny"]["p1_shape"]


def p6_buffer_bytes(shape: tuple[int, ...]) -> int:
    """Write-back buffer of the peak-memory workload: 64 MiB, or a quarter of a smaller array.

    At full size (1 GiB) this is the 64 MiB of the issue; the smaller sizes
    scale it down so that the buffer still has to be flushed while writing.
    """
    array_bytes = int(np.prod(shape)) * np.dtype(DTYPE).itemsize
    return min(64 * MiB, array_bytes // 4)


def parse_args(description: str, impls: tuple[str, ...], shardkv_options: bool = False) -> argparse.Namespace:
    """The command line shared by the workloads.

    With ``shardkv_options``, also ``--shardkv-option NAME=VALUE`` (repeatable; ``args.shardkv_options``, a
    dict, each value parsed as JSON when it parses, else kept as text) and ``--dir PATH`` (``args.dir``: the
    directory the workload makes its temporary directories in; default the system's).
    """
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--json", action="store_true", help="print one JSON line (for benchmarks/run.py)")
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--repeat", type=int, default=1, help="repetitions inside this process")
    parser.add_argument("--impl", choices=impls, default=impls[0])
    parser.add_argument("--seed", type=int, default=0)
    if shardkv_options:
        parser.add_argument(
            "--shardkv-option",
            action="append",
            default=[],
            metavar="NAME=VALUE",
            help="an option of every shardkv store the workload makes (repeatable); VALUE is read as JSON "
            'when it parses (0.5, true, null, "auto"), else as text',
        )
        parser.add_argument("--dir", default=None, help="make the temporary directories in this directory")
    args = parser.parse_args()
    if shardkv_options:
        try:
            args.shardkv_options = parse_shardkv_options(args.shardkv_option)
        except ValueError as exc:
            parser.error(str(exc))
    if args.repeat < 1:
        parser.error(f"--repeat must be >= 1, got {args.repeat}")
    return args


def parse_shardkv_options(items: list[str]) -> dict[str, Any]:
    """The ``--shardkv-option`` texts as keywords: ``["a=append", "b=0.5"]`` -> ``{"a": "append", "b": 0.5}``.

    A value is parsed as JSON when it parses (numbers, ``true``/``false``, ``null``, quoted text), else kept
    as the text it is. ``ValueError`` for an item without ``=`` or a name given twice.
    """
    out: dict[str, Any] = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not name:
            raise ValueError(f"--shardkv-option takes NAME=VALUE, got {item!r}")
        if name in out:
            raise ValueError(f"--shardkv-option {name} given twice")
        try:
            out[name] = json.loads(text)
        except json.JSONDecodeError:
            out[name] = text
    return out


def unknown_shardkv_options(names: Any) -> list[str]:
    """The names among ``names`` that the installed shardkv's stores take no keyword for (sorted).

    The stores take the keywords of ``shardkv.engine.options.OptionKeywords`` (what ``Options.from_keywords``
    accepts), so an option another branch adds is known here once it is installed.
    """
    import typing

    from shardkv.engine.options import OptionKeywords

    return sorted(set(names) - set(typing.get_type_hints(OptionKeywords)))


def make_data(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """Seeded standard normal float32 data of ``shape``."""
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)


def numcodecs_blosc() -> Any:
    """The numcodecs (zarr-python 2) form of the benchmark compressor."""
    from numcodecs import Blosc

    return Blosc(cname="lz4", clevel=5, shuffle=Blosc.SHUFFLE)


def zarr3_blosc() -> Any:
    """The zarr-python 3 form of the benchmark compressor."""
    from zarr.codecs import BloscCodec

    return BloscCodec(cname="lz4", clevel=5, shuffle="shuffle", typesize=4)


def zarr2_array(store: Any, shape: tuple[int, ...]) -> Any:
    """A new zarr-python 2 array ``arr`` of the benchmark layout (chunks, dtype, blosc) in ``store``."""
    import zarr

    return zarr.create(shape=shape, chunks=CHUNKS, dtype=DTYPE, compressor=numcodecs_blosc(), store=store, path="arr")


def zarr3_array(root: str, shape: tuple[int, ...]) -> Any:
    """A new zarr-python 3 array ``arr`` of the benchmark layout, sharded by zarr 3 itself, in a local dir."""
    import zarr
    from zarr.storage import LocalStore

    return zarr.create_array(
        store=LocalStore(root),
        name="arr",
        shape=shape,
        chunks=CHUNKS,
        shards=SHARD_SHAPE,
        dtype=DTYPE,
        compressors=zarr3_blosc(),
        fill_value=0,
    )


def chunk_blocks(shape: tuple[int, int]) -> Iterator[tuple[slice, slice]]:
    """Selections of every inner chunk of a 2-D array, in row-major order."""
    for i in range(0, shape[0], CHUNKS[0]):
        for j in range(0, shape[1], CHUNKS[1]):
            yield slice(i, i + CHUNKS[0]), slice(j, j + CHUNKS[1])


class TempDir:
    """A fresh temporary directory per use (``with TempDir() as path``), removed afterwards.

    ``parent``: the directory to make it in (made if missing; default the system's temporary directory).
    """

    def __init__(self, parent: str | None = None) -> None:
        self.parent = parent

    def __enter__(self) -> str:
        if self.parent is not None:
            os.makedirs(self.parent, exist_ok=True)
        self.path = tempfile.mkdtemp(prefix="shardkv-bench-", dir=self.parent)
        return self.path

    def __exit__(self, *exc: object) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def io_bytes() -> tuple[int, int]:
    """(``rchar``, ``wchar``) of ``/proc/self/io``: bytes this process (every thread) passed to read and write calls.

    They count every read and write system call (files, pipes, this file), cached or not; the caller takes the
    difference around what it measures.
    """
    with open("/proc/self/io") as f:
        fields = dict(line.split(":", 1) for line in f)
    return int(fields["rchar"]), int(fields["wchar"])


def dir_bytes(path: str) -> int:
    """Total size in bytes of the files under ``path``."""
    total = 0
    for root, _, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return total


# -- shardkv feature detection -------------------------------------------------


def shardkv_features() -> dict[str, Any]:
    """What the installed ``ShardedStore`` offers, read from its signature.

    ``write_back`` is True when the constructor takes ``buffer_bytes`` and the
    class has ``flush``. Options taken as ``**keywords`` are read from the
    ``TypedDict`` that annotates them (``Unpack[OptionKeywords]``); a
    ``__new__`` that dispatches adds the parameters of ``__init__``.
    """
    import typing

    from shardkv import ShardedStore

    named: list[str] = []
    for function in (ShardedStore, ShardedStore.__init__):
        hints = typing.get_type_hints(function) if function is ShardedStore.__init__ else {}
        for p in inspect.signature(function).parameters.values():
            if p.kind is p.VAR_KEYWORD and typing.get_origin(hints.get(p.name)) is typing.Unpack:
                named += list(typing.get_type_hints(typing.get_args(hints[p.name])[0]))
            elif p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name != "self":
                named.append(p.name)
    params = list(dict.fromkeys(named))
    return {
        "params": params,
        "write_back": "buffer_bytes" in params and callable(getattr(ShardedStore, "flush", None)),
    }


# -- counting wrappers -----------------------------------------------------------


class CountingMapping(MutableMapping):
    """A ``dict``-backed store counting bytes written and requests made.

    ``bytes_written`` sums the length of every value stored (metadata and
    data); ``writes`` and ``reads`` count calls per key.
    """

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.bytes_written = 0
        self.writes = 0
        self.reads = 0

    def __getitem__(self, key: str) -> bytes:
        self.reads += 1
        return self.data[key]

    def __contains__(self, key: object) -> bool:
        self.reads += 1
        return key in self.data

    def __setitem__(self, key: str, value: Any) -> None:
        value = bytes(memoryview(value).cast("B"))
        self.writes += 1
        self.bytes_written += len(value)
        self.data[key] = value

    def __delitem__(self, key: str) -> None:
        del self.data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(list(self.data))

    def __len__(self) -> int:
        return len(self.data)

    def stored_bytes(self) -> int:
        return sum(len(v) for v in self.data.values())


# -- memory -----------------------------------------------------------------------


def rss_now_bytes() -> int:
    """Current resident set size of this process, in bytes (Linux ``/proc/self/statm``)."""
    with open("/proc/self/statm") as f:
        resident_pages = int(f.read().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far, in bytes (``ru_maxrss`` is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# -- output -----------------------------------------------------------------------


def versions() -> dict[str, str]:
    """Python and library versions of this environment (missing libraries are left out)."""
    out = {"python": platform.python_version()}
    for name in ("zarr", "numcodecs", "numpy", "shardkv"):
        try:
            out[name] = str(importlib.import_module(name).__version__)
        except ImportError:
            continue
    return out


def emit(args: argparse.Namespace, workload: str, result: dict[str, Any]) -> None:
    """Print the result: one JSON line with ``--json``, else indented JSON for people."""
    doc = {"workload": workload, "impl": args.impl, "size": args.size, "repeat": args.repeat, "versions": versions()}
    doc.update(result)
    if args.json:
        sys.stdout.write(json.dumps(doc, default=_jsonable) + "\n")
    else:
        sys.stdout.write(json.dumps(doc, default=_jsonable, indent=2) + "\n")
        for key, samples in doc.get("samples", {}).items():
            if samples and all(isinstance(s, (int, float)) for s in samples):
                sys.stdout.write(f"median {key}: {statistics.median(samples):.4g}\n")
    sys.stdout.flush()


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, (set, frozenset, tuple)):
        return sorted(obj) if isinstance(obj, (set, frozenset)) else list(obj)
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot encode {type(obj).__name__} as JSON")

"""The ``shardkv`` command line: ``convert``, ``info``, ``compact`` and ``demo``.

Argument parsing only; the work is done by :mod:`shardkv.cli.convert`,
:mod:`shardkv.cli.info` and :mod:`shardkv.cli.demo`. Bad input ends with exit
status 2 (usage) or 1 (the job failed) and one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import NoReturn, Sequence

from shardkv._version import __version__
from shardkv.errors import ShardKVError

__all__ = ["main", "build_parser"]

_EXAMPLES = """\
examples:
  shardkv demo                                            # a small local example, end to end
  shardkv convert data/in.zarr data/sharded.zarr --chunks-per-shard 4
  shardkv convert s3://bucket/in.zarr s3://bucket/out.zarr --chunks-per-shard 2,2,1 --index-location start
  shardkv info data/sharded.zarr
  shardkv info data/sharded.zarr --json
  shardkv compact data/sharded.zarr                       # reclaim unused bytes inside shards
  shardkv verify data/sharded.zarr --decode               # check every shard; exit status 1 on damage
"""

_CONVERT_HELP = """\
Copy a Zarr v2 hierarchy, packing the chunks of every array into shards (v1.0
sharding_indexed layout) without decoding or re-encoding a chunk. Metadata
(.zgroup, .zattrs, .zarray, .zmetadata) is copied; each sharded array gets a
zarr.json beside its .zarray, so shardkv.ShardedStore (and Zarr v3 readers)
read the result. Chunks outside an array's grid are skipped and counted. An
array stored with '/' chunk keys but no dimension_separator in .zarray
(zarr-python's NestedDirectoryStore) is detected, and the destination .zarray
says "dimension_separator": "/".

A 2022-draft Zarr v3 hierarchy (root zarr.json of the draft protocol,
meta/root/..., data/root/...) is converted into a draft-sharded copy instead:
each array's metadata gets the sharding storage transformer, and shards use
the draft's fixed "indexed" layout (index at the end, no checksum), so
--index-location start and --no-checksum are refused for such a source.
"""

_CONVERT_EXAMPLES = """\
examples:
  shardkv convert in.zarr out.zarr --chunks-per-shard 4        # 4 chunks along every dimension
  shardkv convert in.zarr out.zarr --chunks-per-shard 2,2,1    # 3-d arrays only; others copied unsharded
  shardkv convert in.zarr out.zarr --chunks-per-shard 8 --index-location start --no-checksum
  shardkv convert in.zarr out.zarr --chunks-per-shard 4 --overwrite
"""

_INFO_HELP = """\
Per array: path, shape, chunks, shard shape (or "unsharded"), chunks present,
shards, bytes stored (shards or chunks, metadata excluded), bytes unused inside
shards (shard bytes - index bytes - bytes of present chunks) and whether Zarr v3
readers can read the array through its zarr.json view (and why not).
"""


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line on stderr (exit status 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def _chunks_per_shard(text: str) -> int | tuple[int, ...]:
    from shardkv.cli.convert import parse_chunks_per_shard

    try:
        return parse_chunks_per_shard(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    """The ``shardkv`` argument parser (sub-commands ``convert``, ``info``, ``demo``)."""
    parser = _Parser(
        prog="shardkv",
        description="Pack the chunks of Zarr v2 arrays into indexed shards, and inspect sharded stores.",
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"shardkv {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser(
        "convert",
        help="shard every array of a Zarr v2 hierarchy (chunks are moved, not re-encoded)",
        description=_CONVERT_HELP,
        epilog=_CONVERT_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("src", metavar="SRC", help="source Zarr v2 hierarchy: a local path or an fsspec URL")
    p.add_argument("dst", metavar="DST", help="destination (must be empty unless --overwrite): a path or an fsspec URL")
    p.add_argument(
        "--chunks-per-shard",
        required=True,
        type=_chunks_per_shard,
        metavar="N|N,N,...",
        help="inner chunks per shard: one int for every dimension of every array, or one per dimension "
        "(like 2,2,1) for the arrays with that many dimensions; other arrays are copied unsharded",
    )
    p.add_argument(
        "--index-location",
        choices=("start", "end"),
        default="end",
        help="where each shard keeps its index of (offset, nbytes) pairs (default: end)",
    )
    p.add_argument(
        "--no-checksum",
        dest="index_checksum",
        action="store_false",
        help="do not protect shard indexes with a CRC32C (default: protect them)",
    )
    p.add_argument("--overwrite", action="store_true", help="delete everything in DST first")
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of a summary")

    p = sub.add_parser(
        "info",
        help="per array: shape, chunks, shard shape, chunks present, shards, bytes, v3 readability",
        description=_INFO_HELP,
        epilog="examples:\n  shardkv info data/sharded.zarr\n  shardkv info s3://bucket/out.zarr --json\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("store", metavar="STORE", help="a Zarr v2 hierarchy (sharded or not): a path or an fsspec URL")
    p.add_argument("--json", action="store_true", help="machine-readable output")

    p = sub.add_parser(
        "compact",
        help="rewrite shards that hold unused bytes (after append-only or in-place writes, or slack)",
        description="Rewrite every shard of the sharded arrays in STORE (or of one array) that holds bytes no "
        "index entry references, leaving chunks back to back and the index in place. The data is unchanged; "
        "each shard is replaced whole (atomically on local disks).",
        epilog="examples:\n  shardkv compact data/sharded.zarr\n  shardkv compact data/sharded.zarr --array temp\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("store", metavar="STORE", help="a sharded hierarchy: a path or an fsspec URL")
    p.add_argument("--array", metavar="PATH", default=None, help="only the array at PATH (default: every array)")

    p = sub.add_parser(
        "demo",
        help="make a small Zarr v2 hierarchy, convert it, inspect it, and read it back",
        description="Create a small Zarr v2 hierarchy in DIR (with zarr-python 2 if installed, else with "
        "numpy), convert it into DIR/../sharded with --chunks-per-shard 4, print the summary and the info "
        "table, and read an array back through ShardedStore to show it equals the input.",
        epilog="example:\n  shardkv demo /tmp/shardkv-demo/input\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("dir", metavar="DIR", nargs="?", default="shardkv-demo/input", help="default: ./shardkv-demo/input")

    from shardkv.cli import verify as verify_cli  # the verify sub-command lives whole in cli/verify.py

    verify_cli.add_parser(sub)
    return parser


def _run(args: argparse.Namespace) -> int:
    if args.command == "verify":
        from shardkv.cli.verify import run

        return run(args)
    if args.command == "convert":
        from shardkv.cli.convert import convert

        report = convert(
            args.src,
            args.dst,
            args.chunks_per_shard,
            index_location=args.index_location,
            index_checksum=args.index_checksum,
            progress=sys.stderr.isatty(),
            overwrite=args.overwrite,
        )
        print(json.dumps(report.to_json(), indent=2) if args.json else report.summary())
        return 0
    if args.command == "info":
        from shardkv.cli.info import format_info, inspect_store

        infos = inspect_store(args.store)
        if args.json:
            print(json.dumps({"store": args.store, "arrays": [i.to_json() for i in infos]}, indent=2))
        else:
            print(format_info(infos))
        return 0
    if args.command == "compact":
        from shardkv.proxy.store import ShardedStore

        with ShardedStore(args.store) as store:
            reclaimed = store.compact(args.array)
        print(f"compacted {args.store}: {reclaimed} bytes reclaimed")
        return 0
    from shardkv.cli.demo import run_demo

    return run_demo(args.dir)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 1 the job failed, 2 bad usage)."""
    args = build_parser().parse_args(argv)
    try:
        return _run(args)
    except (ShardKVError, OSError, ValueError, ImportError) as exc:
        message = " ".join(str(exc).split()) or type(exc).__name__
        print(f"shardkv {args.command}: error: {message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"shardkv {args.command}: interrupted", file=sys.stderr)
        return 130

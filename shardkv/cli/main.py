"""The ``shardkv`` command line: ``convert``, ``unshard``, ``info``, ``compact`` and ``demo``.

Argument parsing only; the work is done by :mod:`shardkv.cli.convert`,
:mod:`shardkv.cli.unshard`, :mod:`shardkv.cli.info` and
:mod:`shardkv.cli.demo`. Each sub-command is one entry of :data:`COMMANDS`:
a function that adds its parser and a function that runs it. Bad input ends
with exit status 2 (usage) or 1 (the job failed) and one line on stderr,
never a traceback; errors of a store (endpoint, bucket, credentials,
permission) name the store's URL.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from shardkv._version import __version__
from shardkv.cli import help_texts as texts
from shardkv.cli.errors import ArrayNotFoundError, StoreAccessError
from shardkv.errors import CorruptShardError, ShardKVError

__all__ = ["main", "build_parser", "COMMANDS"]


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


def _storage_options(text: str) -> dict[str, Any]:
    from shardkv.cli.stores import parse_storage_options

    try:
        return parse_storage_options(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected an int >= 1, got {text!r}")
    return int(text)


def _sub(sub: Any, name: str, help: str, description: str, epilog: str) -> argparse.ArgumentParser:
    return sub.add_parser(
        name, help=help, description=description, epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter
    )


def _add_storage_options(p: argparse.ArgumentParser, two_stores: bool = False) -> None:
    p.add_argument(
        "--storage-options",
        type=_storage_options,
        default=None,
        metavar="JSON",
        help="fsspec options for the store URL(s), a JSON object: '{\"anon\": true}', "
        '\'{"client_kwargs": {"endpoint_url": "http://127.0.0.1:9000"}}\', \'{"profile": "work"}\'',
    )
    if two_stores:
        for side in ("source", "dest"):
            p.add_argument(
                f"--{side}-storage-options",
                type=_storage_options,
                default=None,
                metavar="JSON",
                help=f"like --storage-options, for the {'source' if side == 'source' else 'destination'} only",
            )


def _side_options(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "src_storage_options": args.source_storage_options
        if args.source_storage_options is not None
        else args.storage_options,
        "dst_storage_options": args.dest_storage_options
        if args.dest_storage_options is not None
        else args.storage_options,
    }


def _add_progress(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="show a progress bar on stderr (default: only when stderr is a terminal)",
    )


def _progress(args: argparse.Namespace) -> bool:
    return sys.stderr.isatty() if args.progress is None else bool(args.progress)


def _warn_on_one_line(command: str) -> Callable[..., None]:
    """A ``warnings.showwarning`` that prints ``shardkv COMMAND: warning: ...`` (no file and line)."""

    def show(message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any) -> None:
        print(f"shardkv {command}: warning: {' '.join(str(message).split())}", file=sys.stderr)

    return show


def _print_report(report: Any, as_json: bool) -> None:
    print(json.dumps(report.to_json(), indent=2) if as_json else report.summary())


# -- convert -----------------------------------------------------------------------


def _add_convert(sub: Any) -> None:
    p = _sub(
        sub,
        "convert",
        "shard every array of a Zarr v2 hierarchy (chunks are moved, not re-encoded)",
        texts.CONVERT_HELP,
        texts.CONVERT_EXAMPLES,
    )
    p.add_argument("src", metavar="SRC", help="source Zarr v2 or v3 hierarchy: a local path or an fsspec URL")
    p.add_argument("dst", metavar="DST", help="destination (must be empty unless --overwrite): a path or an fsspec URL")
    p.add_argument(
        "--chunks-per-shard",
        required=True,
        type=_chunks_per_shard,
        metavar="N|N,N,...",
        help="inner chunks per shard: one int for every dimension of every array, or one per dimension "
        "(like 2,2,1) for the arrays with that many dimensions; other arrays are copied unsharded, "
        "and a list that fits no array is an error",
    )
    p.add_argument(
        "--skip-mismatched",
        action="store_true",
        help="copy the arrays --chunks-per-shard does not fit unsharded even when it fits none of them",
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
    p.add_argument("--overwrite", action="store_true", help="delete everything in DST first (never a regular file)")
    p.add_argument(
        "--workers",
        type=_positive,
        default=1,
        metavar="N",
        help="local processes writing shards in parallel (default: 1, this process)",
    )
    p.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        default=None,
        help="address of a running dask.distributed scheduler (tcp://host:8786) whose workers write "
        "the shards; SRC and DST must be reachable from them",
    )
    p.add_argument(
        "--task-chunks",
        type=_positive,
        default=256,
        metavar="N",
        help="source chunks per parallel task (whole shards; default: 256)",
    )
    p.add_argument(
        "--all-v3",
        action="store_true",
        help="describe the hierarchy in Zarr v3 even when no array is sharded: every array and group "
        "also gets a zarr.json, their v2 documents are kept (once an array is sharded, every node "
        "gets a zarr.json anyway)",
    )
    _add_storage_options(p, two_stores=True)
    _add_progress(p)
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of a summary")


def _run_convert(args: argparse.Namespace) -> int:
    from shardkv.cli.convert import convert

    warnings.showwarning = _warn_on_one_line("convert")  # restored by main()'s catch_warnings
    warnings.simplefilter("always", UserWarning)
    report = convert(
        args.src,
        args.dst,
        args.chunks_per_shard,
        index_location=args.index_location,
        index_checksum=args.index_checksum,
        progress=_progress(args),
        overwrite=args.overwrite,
        skip_mismatched=args.skip_mismatched,
        workers=args.workers,
        scheduler=args.scheduler,
        task_chunks=args.task_chunks,
        all_v3=args.all_v3,
        **_side_options(args),
    )
    _print_report(report, args.json)
    return 0


# -- unshard -----------------------------------------------------------------------


def _add_unshard(sub: Any) -> None:
    p = _sub(
        sub,
        "unshard",
        "turn a sharded hierarchy back into plain Zarr v2 (or v3) chunks (no chunk is decoded)",
        texts.UNSHARD_HELP,
        texts.UNSHARD_EXAMPLES,
    )
    p.add_argument("src", metavar="SRC", help="a hierarchy written by shardkv convert or ShardedStore: a path or URL")
    p.add_argument("dst", metavar="DST", help="destination (must be empty unless --overwrite): a path or an fsspec URL")
    p.add_argument("--overwrite", action="store_true", help="delete everything in DST first (never a regular file)")
    p.add_argument(
        "--zarr-format",
        type=int,
        choices=(2, 3),
        default=2,
        help="2: plain Zarr v2 (.zarray, keys 0.0); 3: plain Zarr v3 as zarr-python 3 writes it by default "
        "(zarr.json, keys c/0/0) from a Zarr v3 hierarchy (default: 2)",
    )
    _add_storage_options(p, two_stores=True)
    _add_progress(p)
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of a summary")


def _run_unshard(args: argparse.Namespace) -> int:
    from shardkv.cli.unshard import unshard

    report = unshard(
        args.src,
        args.dst,
        overwrite=args.overwrite,
        progress=_progress(args),
        zarr_format=args.zarr_format,
        **_side_options(args),
    )
    _print_report(report, args.json)
    return 0


# -- info --------------------------------------------------------------------------


def _add_info(sub: Any) -> None:
    p = _sub(
        sub,
        "info",
        "per array: shape, chunks, shard shape, chunks present, shards, bytes, v3 readability",
        texts.INFO_HELP,
        texts.INFO_EXAMPLES,
    )
    p.add_argument("store", metavar="STORE", help="a Zarr hierarchy (v2 sharded or not, 2022 draft, v3): a path or URL")
    _add_storage_options(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    _add_progress(p)


def _run_info(args: argparse.Namespace) -> int:
    from shardkv.cli.info import format_info, inspect_store

    if not _progress(args):
        infos = inspect_store(args.store, args.storage_options)
    else:  # a step per array (each array's shard indexes are read in one go)
        from tqdm import tqdm

        with tqdm(file=sys.stderr, unit="array", desc="shardkv info", mininterval=1.0) as bar:

            def advance(done: int, total: int) -> None:
                bar.total = total
                bar.update(done - bar.n)

            infos = inspect_store(args.store, args.storage_options, progress=advance)
    if args.json:
        print(json.dumps({"store": args.store, "arrays": [i.to_json() for i in infos]}, indent=2))
    else:
        print(format_info(infos))
    return 0


# -- compact -----------------------------------------------------------------------


def _add_compact(sub: Any) -> None:
    p = _sub(
        sub,
        "compact",
        "finish or undo interrupted appends, then rewrite shards that hold unused bytes",
        texts.COMPACT_HELP,
        texts.COMPACT_EXAMPLES,
    )
    p.add_argument("store", metavar="STORE", help="a sharded hierarchy: a path or an fsspec URL")
    p.add_argument("--array", metavar="PATH", default=None, help="only the array at PATH (default: every array)")
    _add_storage_options(p)
    _add_progress(p)


def _run_compact(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from shardkv.cli.info import read_hierarchy
    from shardkv.cli.info_draft import is_draft
    from shardkv.cli.stores import open_store
    from shardkv.cli.view import HierarchyView, refuse_shard_directories
    from shardkv.engine.options import Options
    from shardkv.proxy.draft import DraftShardedStore, draft_options
    from shardkv.proxy.store import ShardedStore
    from shardkv.proxy.verify import remove_stale_temporaries
    from shardkv.transformers import ShardingStorageTransformer

    kv = open_store(args.store, args.storage_options)
    store: ShardedStore | DraftShardedStore
    if is_draft(kv):  # a 2022 draft hierarchy: its arrays are those of meta/root/<path>.array.json
        store = DraftShardedStore._reopen(kv, draft_options())
        paths = sorted(p for k in kv.list_prefix("meta/") if (p := store.array_path_of(k)) is not None)
    else:  # a missing or empty store, or no hierarchy, is an error
        store = ShardedStore._reopen(kv, Options.from_keywords())  # no zarr-python needed: any zarr installed
        paths = list(read_hierarchy(HierarchyView(kv), args.store).arrays)
    with store:
        if args.array is not None and store.sharded_array(args.array) is None:
            raise ArrayNotFoundError(args.store, args.array.strip("/"), "sharded array")
        wanted = [args.array.strip("/")] if args.array is not None else [p for p in paths if store.sharded_array(p)]
        refuse_shard_directories(kv, [a for p in wanted if (a := store.sharded_array(p)) is not None])
        if isinstance(store, DraftShardedStore):
            remove_stale_temporaries(kv)  # as ShardedStore.compact does: files killed writers left
        reclaimed = 0
        with tqdm(
            total=len(wanted), file=sys.stderr, unit="array", desc="shardkv compact", disable=not _progress(args)
        ) as bar:
            for path in wanted:
                if isinstance(store, ShardedStore):
                    reclaimed += store.compact(path)
                elif isinstance(top := store.transformer(path), ShardingStorageTransformer):
                    reclaimed += top.compact()
                bar.update(1)
    print(f"compacted {args.store}: {reclaimed} bytes reclaimed")
    return 0


# -- demo --------------------------------------------------------------------------


def _add_demo(sub: Any) -> None:
    p = _sub(
        sub,
        "demo",
        "make a small Zarr v2 hierarchy, convert it, inspect it, and read it back",
        texts.DEMO_HELP,
        texts.DEMO_EXAMPLES,
    )
    p.add_argument(
        "dir",
        metavar="DIR",
        nargs="?",
        default=None,
        help="write the input hierarchy here and the sharded copy beside it, in DIR/../sharded",
    )
    p.add_argument(
        "--out",
        metavar="OUT",
        default=None,
        help="keep the files in OUT (OUT/input, OUT/sharded); default: a temporary directory, removed at the end",
    )


def _run_demo(args: argparse.Namespace) -> int:
    from shardkv.cli.demo import run_demo_in

    return run_demo_in(args.dir, args.out)


# -- verify ------------------------------------------------------------------------


def _add_verify(sub: Any) -> None:
    from shardkv.cli import verify

    _add_storage_options(verify.add_parser(sub))


def _run_verify(args: argparse.Namespace) -> int:
    from shardkv.cli import verify

    return verify.run(args)


COMMANDS: dict[str, tuple[Callable[[Any], None], Callable[[argparse.Namespace], int]]] = {
    "convert": (_add_convert, _run_convert),
    "unshard": (_add_unshard, _run_unshard),
    "info": (_add_info, _run_info),
    "compact": (_add_compact, _run_compact),
    "verify": (_add_verify, _run_verify),
    "demo": (_add_demo, _run_demo),
}
"""Sub-command name -> (add its parser, run it). A new sub-command is one more entry."""


def build_parser() -> argparse.ArgumentParser:
    """The ``shardkv`` argument parser, one sub-parser per entry of :data:`COMMANDS`."""
    parser = _Parser(
        prog="shardkv",
        description="Pack the chunks of Zarr v2 arrays into indexed shards, and inspect sharded stores.",
        epilog=texts.EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"shardkv {__version__}")
    parser.add_argument("--debug", action="store_true", help="show the Python traceback of an unexpected error")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add, _ in COMMANDS.values():
        add(sub)
    return parser


def _stores_named(args: argparse.Namespace) -> str:
    names = [getattr(args, a) for a in ("src", "dst", "store") if isinstance(getattr(args, a, None), str)]
    return " -> ".join(names) or "the store"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 1 the job failed, 2 bad usage)."""
    # no command does linear algebra: numpy's OpenBLAS, loaded after this, then starts no thread per core,
    # each spinning about 0.1 s of CPU (here and in each --workers process); a user's setting is kept
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from shardkv.cli.stores import describe, store_errors

    args = build_parser().parse_args(argv)
    try:
        with warnings.catch_warnings():
            # dependencies' deprecation notices are for developers, not for a command's user
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", FutureWarning)
            return COMMANDS[args.command][1](args)
    except (ShardKVError, ValueError, ImportError) as exc:
        message = describe(exc) if not isinstance(exc, ShardKVError) else " ".join(str(exc).split())
        store = next((v for a in ("store", "src") if isinstance(v := getattr(args, a, None), str)), None)
        if isinstance(exc, CorruptShardError) and store is not None and args.command != "compact":
            # commands that read shards without their locks cannot repair an interrupted in-place append
            # (compact repairs it first: a shard still damaged there is damaged)
            message += (
                f" (`shardkv verify {store}` tells whether a killed writer's in-place append left it; "
                f"`shardkv compact {store}` repairs one)"
            )
        print(f"shardkv {args.command}: error: {message}", file=sys.stderr)
        return 1
    except store_errors() as exc:
        error = exc if isinstance(exc, StoreAccessError) else StoreAccessError(_stores_named(args), describe(exc))
        print(f"shardkv {args.command}: error: {' '.join(str(error).split())}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"shardkv {args.command}: interrupted{_RESUME.get(args.command, '')}", file=sys.stderr)
        return 130
    except (Exception, RecursionError, MemoryError) as exc:  # noqa: BLE001 - one line, never a traceback
        if args.debug:
            raise
        print(
            f"shardkv {args.command}: error: unexpected {type(exc).__name__} working on {_stores_named(args)}: "
            f"{' '.join(str(exc).split())[:500]} (run 'shardkv --debug {args.command} ...' for the traceback)",
            file=sys.stderr,
        )
        return 1


_RESUME = {
    "convert": "; run the same command again to resume (the shards already written are skipped)",
    "unshard": "; run the same command again to resume (the shards already unpacked are skipped)",
}
"""What an interrupted command's message adds: how to resume it."""

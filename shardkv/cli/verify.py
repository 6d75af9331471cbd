"""``shardkv verify STORE``: check every shard of a sharded store (the work is in :mod:`shardkv.proxy.verify`).

Exit status 0 when nothing is damaged (and nothing removable is left, or
``--repair`` removed it), 1 when damage is found or the store cannot be opened.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

__all__ = ["add_parser", "run"]

_HELP = """\
Read every shard of every sharded array in STORE (a Zarr v2 hierarchy sharded by
shardkv, Zarr v3 arrays with sharding_indexed, or a 2022 draft hierarchy with the
sharding storage transformer) and check its index (length,
CRC32C, every entry inside the shard, not overlapping the index or another
entry, no overflow); with --decode also decode every inner chunk with the
array's compressor and filters. Also lists keys that look like chunk keys but
lie outside an array's shard grid (reported only), chunk-like keys left by
deleted arrays (orphans), metadata documents that cannot be read, and
temporary files of killed writers (no live process holds their lock; those
whose lock cannot be tried: older than --temp-age seconds). --repair
removes only what is proven garbage: the stale temporaries. Orphans are
removed only with --remove-orphans (run verify first: they are listed);
nothing under an array or group whose metadata cannot be read is ever
removed, and damaged shards are reported, never deleted. Exit status 1 when
anything is damaged or left.
"""


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the ``verify`` sub-command to an argparse sub-parsers object (the caller adds ``--storage-options``)."""
    p = sub.add_parser(
        "verify",
        help="check every shard (index, checksums, entry ranges, optionally chunk decoding); --repair",
        description=_HELP,
        epilog="examples:\n  shardkv verify data/sharded.zarr --decode\n"
        "  shardkv verify s3://bucket/out.zarr --storage-options '{\"anon\": true}' --json\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("store", metavar="STORE", help="a sharded hierarchy: a path or an fsspec URL")
    p.add_argument("--decode", action="store_true", help="also decode every stored inner chunk")
    p.add_argument("--repair", action="store_true", help="remove stale temporary files (proven garbage only)")
    p.add_argument(
        "--remove-orphans",
        action="store_true",
        help="remove chunk-like keys of paths without array metadata (verify lists them)",
    )
    p.add_argument(
        "--temp-age",
        metavar="SECONDS",
        type=float,
        default=3600.0,
        help="age (seconds) from which a temporary file whose lock cannot be tried counts as stale (default 3600)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="show a progress bar on stderr (default: only when stderr is a terminal)",
    )
    return p


def _summary(store: str, report: Any) -> str:
    lines = [f"verified {store}: {len(report.shards)} shards, {len(report.damaged)} damaged"]
    for shard in report.damaged:
        for problem in shard.problems:
            lines.append(f"  DAMAGED {shard.shard_key}: {problem}")
    for key in report.stray_keys:
        lines.append(f"  STRAY {key}: chunk-like key outside the array's shard grid")
    for key, reason in report.unreadable_metadata.items():
        lines.append(f"  UNREADABLE {key}: {reason}")
    if report.kept_keys:
        lines.append(f"  KEPT {len(report.kept_keys)} keys under unreadable metadata (never removed)")
    for key in report.orphan_keys:
        lines.append(f"  ORPHAN {key}: chunk-like key of a path with no array metadata (--remove-orphans removes it)")
    for path in report.stale_temporaries:
        lines.append(f"  STALE {path}: temporary file of a killed writer")
    for item in report.removed:
        lines.append(f"  REMOVED {item}")
    lines.append("ok" if report.ok else "damage found")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Run ``shardkv verify``; returns the exit status (1 when anything is damaged).

    Raises
    ------
    NotAHierarchyError
        If the store is missing, empty or not a Zarr hierarchy.
    StoreAccessError
        If the store cannot be reached or used.
    """
    # imported here: the parser (``add_parser``) is built for every command
    from shardkv.cli.info import read_hierarchy
    from shardkv.cli.info_draft import is_draft
    from shardkv.cli.stores import open_store
    from shardkv.cli.view import HierarchyView
    from shardkv.proxy.verify import verify_store

    kv = open_store(args.store, args.storage_options)
    # a missing or empty store, or no hierarchy, is an error; unreadable nodes are reported below, not raised.
    # A 2022 draft hierarchy (what info and convert take too) is checked as such by verify_store
    if not is_draft(kv):
        read_hierarchy(HierarchyView(kv), args.store, strict=False)
    bar = None
    if args.progress if args.progress is not None else sys.stderr.isatty():
        from tqdm import tqdm

        bar = tqdm(file=sys.stderr, unit="key", desc="shardkv verify", mininterval=1.0)

    def advance(done: int, total: int) -> None:
        if bar is not None:
            bar.total = total
            bar.update(done - bar.n)

    try:
        report = verify_store(
            kv,
            decode=args.decode,
            repair=args.repair,
            min_temp_age=args.temp_age,
            remove_orphans=args.remove_orphans,
            progress=advance,
        )
    finally:
        if bar is not None:
            bar.close()
        kv.close()
    print(json.dumps(report.to_json(), indent=2) if args.json else _summary(args.store, report))
    return 0 if report.ok else 1

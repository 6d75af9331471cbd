"""The ``shardkv info`` table: one line per array (:class:`shardkv.cli.info.ArrayInfo`), then totals."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shardkv.cli.info_model import ArrayInfo

__all__ = ["format_info"]


def _dims(values: Sequence[int] | None) -> str:
    if values is None:
        return "-"
    return "(" + ", ".join(str(v) for v in values) + ")"


def format_info(infos: Sequence[ArrayInfo]) -> str:
    """The ``shardkv info`` table: one line per array, then totals.

    The ``v3`` column says ``yes`` when v3 readers can open the sharded array
    through its ``zarr.json``, ``no: <why>`` when they cannot, ``-`` when the
    array is unsharded.
    """
    header = (
        "array",
        "shape",
        "chunks",
        "shard shape",
        "chunks present",
        "shards",
        "bytes stored",
        "bytes unused",
        "v3 view",
    )
    rows = []
    for i in infos:
        if i.shard_shape is None:
            shard, v3 = "unsharded", "-"
        else:
            shard = f"{_dims(i.shard_shape)} = {'x'.join(str(n) for n in i.chunks_per_shard or ())} chunks"
            v3 = "yes" if i.v3_readable else "no: " + "; ".join(i.v3_problems)
        rows.append(
            (
                i.path or "/",
                _dims(i.shape),
                _dims(i.chunks),
                shard,
                str(i.chunks_present),
                str(i.shards),
                str(i.bytes_stored),
                str(i.bytes_unused) if i.shard_shape else "-",
                v3,
            )
        )
    widths = [max(len(r[c]) for r in [header, *rows]) for c in range(len(header) - 1)]
    lines = []
    for r in [header, *rows]:
        cells = [r[c].rjust(widths[c]) if 4 <= c <= 7 else r[c].ljust(widths[c]) for c in range(len(widths))]
        lines.append("  ".join([*cells, r[-1]]).rstrip())
    n_sharded = sum(1 for i in infos if i.shard_shape is not None)
    lines.append(
        f"{len(infos)} arrays ({n_sharded} sharded, {len(infos) - n_sharded} unsharded), "
        f"{sum(i.chunks_present for i in infos)} chunks in {sum(i.objects for i in infos)} objects, "
        f"{sum(i.bytes_stored for i in infos)} bytes stored, "
        f"{sum(i.bytes_unused for i in infos)} bytes unused inside shards"
    )
    return "\n".join(lines)

"""The ``shardkv info`` table: one line per array (:class:`shardkv.cli.info.ArrayInfo`), then totals."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shardkv.cli.info_model import ArrayInfo

__all__ = ["format_info", "counted"]


def counted(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1 (``"1 array"``, ``"2 arrays"``; the plural adds an s)."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _dims(values: Sequence[int] | None) -> str:
    if values is None:
        return "-"
    return "(" + ", ".join(str(v) for v in values) + ")"


def format_info(infos: Sequence[ArrayInfo]) -> str:
    """The ``shardkv info`` table: one line per array, then totals.

    The ``v3 view`` column says what zarr-python 3 opening the hierarchy at its
    root does with each array (:func:`shardkv.cli.info_v3.zarr3_view`): ``yes``
    (it reads it as Zarr v3; ``yes; other v3 readers: <why not>`` when
    tensorstore and the like refuse a part zarr-python 3 reads), ``no: <why>``,
    or ``as Zarr v2`` when the root is Zarr v2 (zarr-python 3 reads the whole
    hierarchy as v2).
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
            shard = "unsharded"
        else:
            shard = f"{_dims(i.shard_shape)} = {'x'.join(str(n) for n in i.chunks_per_shard or ())} chunks"
        if i.v3_readable is None:
            v3 = "as Zarr v2"
        elif i.v3_readable:
            v3 = "yes" + ("; other v3 readers: " + "; ".join(i.v3_problems) if i.v3_problems else "")
        else:
            v3 = "no: " + "; ".join(i.v3_problems)
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
    n_chunks, n_objects = sum(i.chunks_present for i in infos), sum(i.objects for i in infos)
    lines.append(
        f"{counted(len(infos), 'array')} ({n_sharded} sharded, {len(infos) - n_sharded} unsharded), "
        f"{counted(n_chunks, 'chunk')} in {counted(n_objects, 'object')}, "
        f"{sum(i.bytes_stored for i in infos)} bytes stored, "
        f"{sum(i.bytes_unused for i in infos)} bytes unused inside shards"
    )
    return "\n".join(lines)

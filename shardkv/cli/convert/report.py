"""The report of ``shardkv convert``: what happened to each array, and the totals.

:class:`ConvertReport` is returned by :func:`shardkv.cli.convert.convert`; the
command line prints :meth:`ConvertReport.summary` or :meth:`ConvertReport.to_json`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from shardkv.cli.info_format import counted

__all__ = ["ArrayReport", "ConvertReport"]


@dataclass
class ArrayReport:
    """What the conversion did with one array.

    Attributes
    ----------
    path : str
        Array path (``""`` for a root array).
    ndim : int
        Number of dimensions.
    chunks_per_shard : tuple of int or None
        Inner chunks per shard; ``None`` when the array was copied unsharded.
    reason : str or None
        Why the array was copied unsharded.
    chunks : int
        In-grid chunks stored in the source (packed into shards, or copied); of an array
        that was sharded already, the chunks its shards hold.
    stale_chunks : int
        Chunks outside the chunk grid that were skipped (sharded arrays only).
    shards : int
        Shards written.
    separator : {".", "/"}
        Chunk (and shard) key separator.
    separator_detected : bool
        True when ``"/"`` was detected from the stored keys and written to the destination ``.zarray``.
    shards_copied : int
        Shards of an array that was sharded already, copied as they are.
    """

    path: str
    ndim: int
    chunks_per_shard: tuple[int, ...] | None
    reason: str | None
    chunks: int
    stale_chunks: int
    shards: int
    separator: str
    separator_detected: bool
    shards_copied: int = 0

    @property
    def sharded(self) -> bool:
        return self.chunks_per_shard is not None


@dataclass
class ConvertReport:
    """The outcome of :func:`convert`.

    Attributes
    ----------
    src, dst : str
        Source and destination, as given.
    arrays : list of ArrayReport
        One per array, in path order.
    objects_before, objects_after : int
        Stored objects (keys) in the source, and written to the destination.
    bytes_before, bytes_after : int
        Their total size in bytes.
    metadata_bytes_before, metadata_bytes_after : int
        Of those, the bytes of the metadata documents (``zarr.json``, ``.zarray``, ``.zattrs``,
        ``.zgroup``, ``.zmetadata``): the destination's are written as JSON indented by 4 spaces.
    shards_skipped : int
        Shards a resumed conversion found finished (in the progress manifest) and did not write again.
    shards_verified : int
        Of those, the last ones recorded, read back and checked before being skipped.
    workers : int
        Processes that wrote shards (1: this process alone; 0: a dask.distributed cluster).
    groups : int
        Groups of the source, every one checked to be in the output (as every array is).
    v3_root : bool
        True when the output's root is a Zarr v3 group (an array is sharded, or ``all_v3``):
        zarr-python 3 reads the hierarchy as v3; otherwise as the Zarr v2 hierarchy it is.
    zarr2_only : dict of str to str
        Arrays zarr-python 3 does not reach from the root (path -> why: a data type no
        v3 reader decodes); zarr-python 2 reads them, with shardkv or without.
    """

    src: str
    dst: str
    arrays: list[ArrayReport] = field(default_factory=list)
    objects_before: int = 0
    objects_after: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    metadata_bytes_before: int = 0
    metadata_bytes_after: int = 0
    shards_skipped: int = 0
    shards_verified: int = 0
    workers: int = 1
    groups: int = 0
    v3_root: bool = False
    zarr2_only: dict[str, str] = field(default_factory=dict)

    @property
    def sharded(self) -> list[ArrayReport]:
        """The arrays packed into shards."""
        return [a for a in self.arrays if a.sharded]

    @property
    def unsharded(self) -> list[ArrayReport]:
        """The arrays copied unsharded."""
        return [a for a in self.arrays if not a.sharded]

    @property
    def chunks(self) -> int:
        """In-grid chunks of all arrays."""
        return sum(a.chunks for a in self.arrays)

    @property
    def stale_chunks(self) -> int:
        """Skipped chunks outside the chunk grid."""
        return sum(a.stale_chunks for a in self.arrays)

    @property
    def shards(self) -> int:
        """Shards written."""
        return sum(a.shards for a in self.arrays)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict of the report."""
        doc = asdict(self)
        doc["shards"] = self.shards
        for a, d in zip(self.arrays, doc["arrays"], strict=True):
            d["sharded"] = a.sharded
        return doc

    def summary(self, max_listed: int = 10) -> str:
        """A few human-readable lines: arrays, chunks, objects and bytes before and after."""
        lines = [
            f"converted {counted(len(self.arrays), 'array')} from {self.src} to {self.dst}: "
            f"{len(self.sharded)} sharded, {len(self.unsharded)} copied unsharded"
        ]
        if self.unsharded:
            names = [f"{a.path or '/'} ({a.reason})" for a in self.unsharded]
            more = f", ... and {len(names) - max_listed} more" if len(names) > max_listed else ""
            lines.append("  unsharded: " + ", ".join(names[:max_listed]) + more)
        packed = sum(a.chunks for a in self.sharded)
        already = [a for a in self.unsharded if a.shards_copied]
        in_shards = sum(a.chunks for a in already)
        n_copied = sum(a.shards_copied for a in already)
        copied = f", {in_shards} in {counted(n_copied, 'shard')} copied as they are" if already else ""
        lines.append(
            f"  chunks: {self.chunks} ({packed} packed into {counted(self.shards, 'shard')}, "
            f"{self.chunks - packed - in_shards} copied unsharded{copied})"
        )
        if self.stale_chunks:
            lines.append(f"  stale chunks outside the array grid, skipped: {self.stale_chunks}")
        detected = [a.path or "/" for a in self.arrays if a.separator_detected]
        if detected:
            lines.append(
                "  '/' dimension_separator detected from the stored keys and written to .zarray: "
                + ", ".join(detected[:max_listed])
                + (f", ... and {len(detected) - max_listed} more" if len(detected) > max_listed else "")
            )
        if self.shards_skipped:
            lines.append(
                f"  resumed: {self.shards_skipped} shards finished by an earlier run skipped "
                f"({self.shards_verified} of them read back and checked), "
                f"{self.shards - self.shards_skipped} written now"
            )
        zarr3 = "as Zarr v3" if self.v3_root else "as the Zarr v2 hierarchy it is"
        reached = len(self.arrays) - len(self.zarr2_only)
        lines.append(
            f"  checked: the output holds every array ({len(self.arrays)}) and group ({self.groups}) "
            f"of the source; zarr 3 opens it at the root {zarr3} and reaches {counted(reached, 'array')} "
            f"and every group"
        )
        if self.zarr2_only:
            names = [f"{p} ({why})" for p, why in self.zarr2_only.items()]
            more = f", ... and {len(names) - max_listed} more" if len(names) > max_listed else ""
            lines.append("  zarr 2 only (zarr 3 does not read them): " + ", ".join(names[:max_listed]) + more)
        lines.append(f"  objects: {self.objects_before} -> {self.objects_after}")
        ratio = (
            f" ({100 * (self.bytes_after - self.bytes_before) / self.bytes_before:+.2f}%)" if self.bytes_before else ""
        )
        lines.append(
            f"  bytes: {self.bytes_before} -> {self.bytes_after}{ratio}; of which metadata documents "
            f"{self.metadata_bytes_before} -> {self.metadata_bytes_after} (written as JSON indented by 4 spaces)"
        )
        return "\n".join(lines)

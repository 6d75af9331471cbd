"""Write strategies for stores that can append to and write inside an object. Pure planning.

The default strategy rewrites a shard whole (atomically, through a temporary
object). On local files two strategies that re-encode no unchanged chunk exist (draft 2022 and v1.0
codec, "Binary shard format": chunk order and unused space are free, write
strategies are runtime options never stored in metadata):

* ``"append"``: new chunk bytes and then a new index are appended; replaced
  chunks and the old index become unused bytes (``shardkv compact`` reclaims
  them). With the index at the start the new index replaces it (in the copy, see below).
* ``"inplace"``: like append, but a chunk whose new encoding fits the slot of
  the one it replaces (its bytes plus any unused bytes up to the next chunk)
  is written into that slot. ``slack_bytes`` reserves room after every chunk
  written so later, slightly larger encodings still fit (the BLZ format's
  slack space).

Neither ever writes into the live shard. The positional writes of a plan are
applied by :meth:`shardkv.storage.adapters.FSMapAdapter.write_at` to a copy
of the shard (``copy_file_range``: shared extents on file systems with
reflinks, an in-kernel copy elsewhere), which is fsync'd and renamed over the
shard. So a failed or killed writer leaves the previous shard whole (the
index it points to and every byte that index references), with either index
location: a new index at the ``start`` is written into the copy too. The
cost is a copy of the shard per update, without decoding or re-encoding any
chunk; on reflink file systems it is proportional to the change. An
append-in-place scheme cannot offer this: extending a file is not atomic, and
with the index at the end a partly written append leaves a file whose last
bytes are no index (an invalid shard for every reader) until it is repaired.

In-place slot reuse therefore only ever overwrites bytes of the private copy.
A reader in another process that holds the old index and reads chunk bytes
after the rename can still see the new bytes of a reused slot (as with
``"rewrite"``, which moves every chunk): cross-process readers of a shard
being written need ``validate_index_cache`` or :meth:`ShardedStore.refresh`.

Byte picture of one append (index at the end)::

    before: | chunks ... | index0 |                                    (live file)
    copy:   | chunks ... | index0 | new chunk(s) + slack | index1 |    (temporary file)
                           (unused)                        (valid)
    then:   fsync(copy); rename(copy -> shard); fsync(directory)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Mapping

import numpy as np

from shardkv.format.index import ShardIndex
from shardkv.format.layout import ShardLayout

__all__ = ["WriteStrategy", "PositionalWrite", "AppendPlan", "plan_append", "slot_capacities"]

WriteStrategy = Literal["rewrite", "append", "inplace"]


@dataclass(frozen=True, slots=True)
class PositionalWrite:
    """Bytes to write at ``offset`` (bytes from the start of the shard)."""

    offset: int
    data: bytes


@dataclass
class AppendPlan:
    """What to write to update a shard without rewriting it.

    ``writes`` are applied in order; the shard's new size is ``new_nbytes``
    and its index ``index`` (already encoded in the last write).
    """

    writes: list[PositionalWrite] = field(default_factory=list)
    index: ShardIndex | None = None
    new_nbytes: int = 0


def slot_capacities(index: ShardIndex, data_stop: int) -> dict[tuple[int, ...], int]:
    """Bytes available to each present chunk: up to the next chunk's start or ``data_stop``.

    Parameters
    ----------
    index : ShardIndex
        The current index.
    data_stop : int
        End (exclusive, bytes from shard start) of the region chunks may occupy.
    """
    present = list(index.present())
    offsets = sorted({index.get(p)[0] for p in present} | {data_stop})  # type: ignore[index]
    out = {}
    for p in present:
        offset, nbytes = index.get(p)  # type: ignore[misc]
        nxt = offsets[int(np.searchsorted(offsets, offset, side="right"))] if offset < data_stop else offset + nbytes
        out[p] = max(nbytes, nxt - offset)
    return out


def plan_append(
    layout: ShardLayout,
    index: ShardIndex,
    shard_nbytes: int,
    updates: Mapping[tuple[int, ...], bytes | None],
    *,
    inplace: bool,
    slack_bytes: int = 0,
) -> AppendPlan:
    """Plan the writes that apply ``updates`` to a stored shard by appending.

    Parameters
    ----------
    layout : ShardLayout
        The shard's layout (index location, encoding).
    index : ShardIndex
        The shard's current index (not modified).
    shard_nbytes : int
        Current size of the shard (bytes).
    updates : mapping of local coords to bytes or None
        New encoded chunks; ``None`` marks a chunk empty.
    inplace : bool
        Write a chunk into its old slot when it fits.
    slack_bytes : int
        Zero bytes reserved after each appended chunk (bytes, >= 0).

    Returns
    -------
    AppendPlan
        Positional writes, the new index and the new shard size.

    Raises
    ------
    ValueError
        If ``slack_bytes`` < 0.
    """
    if slack_bytes < 0:
        raise ValueError(f"slack_bytes must be >= 0, got {slack_bytes}")
    new = index.copy()
    end = layout.index_location == "end"
    data_stop = shard_nbytes - layout.index_nbytes if end else shard_nbytes
    capacity = slot_capacities(index, data_stop) if inplace else {}
    plan = AppendPlan()
    appended: list[bytes] = []
    cursor = shard_nbytes  # appends go after everything, the old index included
    for local in sorted(updates):
        value = updates[local]
        if value is None:
            new.clear(local)
            continue
        entry = index.get(local)
        if inplace and entry is not None and len(value) <= capacity.get(local, 0):
            plan.writes.append(PositionalWrite(entry[0], bytes(value)))
            new.set(local, entry[0], len(value))
            continue
        new.set(local, cursor, len(value))
        appended.append(bytes(value))
        if slack_bytes:
            appended.append(bytes(slack_bytes))
        cursor += len(value) + slack_bytes
    encoded = layout.encode_index(new)
    if end:
        if appended:
            appended.append(encoded)
            plan.writes.append(PositionalWrite(shard_nbytes, b"".join(appended)))
            plan.new_nbytes = cursor + len(encoded)
        else:  # only in-place writes and deletions: the index stays where it is
            plan.writes.append(PositionalWrite(shard_nbytes - layout.index_nbytes, encoded))
            plan.new_nbytes = shard_nbytes
    else:
        if appended:
            plan.writes.append(PositionalWrite(shard_nbytes, b"".join(appended)))
        plan.writes.append(PositionalWrite(0, encoded))
        plan.new_nbytes = cursor
    plan.index = new
    return plan

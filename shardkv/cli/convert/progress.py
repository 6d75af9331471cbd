"""The progress bar of ``shardkv convert``: its total known before it starts, never going back. Pure.

The bar counts *chunk-grid positions* (a position per chunk of each array's
grid, stored or not): their number is known from the arrays' ``.zarray``
documents before any array is listed, so the total is fixed from the start.
Each shard advances the bar by the positions it covers
(:func:`shard_positions`) once it is written, skipped, or found to hold no
chunk; an unsharded array by its grid's positions once it is copied.

A resumed run starts where the earlier one stopped: the shards its manifest
records are counted before the bar starts, except the last ones recorded,
which the resumed run reads back and may write again
(:func:`shardkv.cli.manifest.verify_last`); those count when they are skipped
or written. So the bar never goes backwards and ends at its total.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from shardkv.cli.manifest import ArrayProgress

__all__ = ["grid_positions", "shard_positions", "BarPlan"]


def grid_positions(grid: Sequence[int]) -> int:
    """Chunk-grid positions of an array (1 for a 0-d array)."""
    return math.prod(grid)


def shard_positions(index: int, grid: Sequence[int], cps: Sequence[int]) -> int:
    """Chunk-grid positions covered by the shard at ``index`` (C order in the shard grid); edge shards cover fewer."""
    shard_grid = [-(-g // n) for g, n in zip(grid, cps, strict=True)]
    coords = []
    for g in reversed(shard_grid):
        index, c = divmod(index, g) if g else (index, 0)
        coords.append(c)
    coords.reverse()
    return math.prod(max(0, min(n, g - c * n)) for c, g, n in zip(coords, grid, cps, strict=True))


class BarPlan:
    """The bar's total and start, and which shards it counted already.

    Parameters
    ----------
    grids : mapping of str to (tuple of int, tuple of int or None)
        Array path -> (its chunk grid, its chunks per shard; ``None`` when copied unsharded).
    recorded : mapping of str to ArrayProgress
        The shards the manifest records as finished (a resumed run), per array.
    reread : iterable of (str, int)
        ``(path, shard index)`` of the recorded shards the run reads back (counted when done).
    """

    def __init__(
        self,
        grids: Mapping[str, tuple[tuple[int, ...], tuple[int, ...] | None]],
        recorded: Mapping[str, ArrayProgress],
        reread: Iterable[tuple[str, int]] = (),
    ) -> None:
        self.grids = dict(grids)
        self.total = sum(grid_positions(grid) for grid, _ in self.grids.values())
        again = set(reread)
        self._counted: dict[str, set[int]] = {}
        self.initial = 0
        for path, progress in recorded.items():
            grid, cps = self.grids.get(path, ((), None))
            if cps is None:
                continue
            done = {i for i in _indices(progress) if (path, i) not in again}
            self._counted[path] = done
            self.initial += sum(shard_positions(i, grid, cps) for i in done)

    def counted(self, path: str, index: int) -> bool:
        """True for a shard counted before the bar started (not to count again)."""
        return index in self._counted.get(path, ())

    def shard(self, path: str, index: int) -> int:
        """The bar's step for a shard of ``path`` done now: its positions, or 0 when counted already."""
        if self.counted(path, index):
            return 0
        grid, cps = self.grids[path]
        return shard_positions(index, grid, cps or grid)

    def array(self, path: str) -> int:
        """The bar's step for an unsharded array copied now: its grid's positions."""
        return grid_positions(self.grids[path][0])


def _indices(progress: ArrayProgress) -> Iterable[int]:
    for byte_index, byte in enumerate(progress.bits):
        if byte:
            for bit in range(8):
                if byte & (1 << bit):
                    yield byte_index * 8 + bit

"""``convert``'s progress bar: its total is known before it starts, and it never goes backwards, resumed or not.

The bar is observed as tqdm sees it: a tqdm subclass records ``(n, total)`` when the bar is made
and after every update. A run is interrupted in this process right after its manifest records a
chosen shard (no signal races the work), then resumed.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import tqdm as tqdm_module
import zarr

from shardkv.cli.convert import convert
from shardkv.cli.convert.progress import BarPlan, shard_positions
from shardkv.cli.manifest import ArrayProgress, Manifest

GRID_POSITIONS = 40 + 4 * 5 + 6 * 3 + 1  # a, b, sparse, scalar


def _source(root):
    g = zarr.open_group(str(root), mode="w")
    g.create_dataset("a", data=np.arange(80, dtype="i4"), chunks=(2,))  # 40 chunks
    g.create_dataset("b", data=np.arange(100.0).reshape(10, 10), chunks=(3, 2))  # 4 x 5 chunks, edge chunks
    sparse = g.create_dataset("sparse", shape=(12, 6), chunks=(2, 2), dtype="i2", fill_value=0)  # 6 x 3, mostly empty
    sparse[0:2, 0:2] = 1
    sparse[10:12, 4:6] = 2
    g.create_dataset("scalar", data=np.array(7))  # 0-d: copied unsharded, one position
    return root


@pytest.fixture
def bars(monkeypatch):
    """Every bar made during the test, as its list of (n, total) states."""
    made: list[list[tuple[int, int]]] = []

    class Recording(tqdm_module.tqdm):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.states = [(self.n, self.total)]
            made.append(self.states)

        def update(self, n=1):
            out = super().update(n)
            self.states.append((self.n, self.total))
            return out

    monkeypatch.setattr(tqdm_module, "tqdm", Recording)
    return made


def _interrupt_after(monkeypatch, n_shards):
    record = Manifest.record
    seen = []

    def interrupted(self, *args, **kwargs):
        record(self, *args, **kwargs)
        self.flush()
        seen.append(1)
        if len(seen) == n_shards:
            raise KeyboardInterrupt

    monkeypatch.setattr(Manifest, "record", interrupted)


def _never_back(states):
    totals = {total for _, total in states}
    assert totals == {GRID_POSITIONS}, totals  # fixed before the first step
    ns = [n for n, _ in states]
    assert ns == sorted(ns), ns


def test_the_total_is_known_first_and_the_bar_ends_at_it(tmp_path, bars):
    convert(str(_source(tmp_path / "src")), str(tmp_path / "dst"), 2, progress=True, task_chunks=2)
    (states,) = bars
    _never_back(states)
    assert states[0][0] == 0 and states[-1][0] == GRID_POSITIONS


def test_a_resumed_run_starts_where_the_interrupted_one_stopped(tmp_path, bars, monkeypatch):
    src, dst = _source(tmp_path / "src"), tmp_path / "dst"
    with monkeypatch.context() as patch:
        _interrupt_after(patch, 12)
        with pytest.raises(KeyboardInterrupt):
            convert(str(src), str(dst), 2, progress=True, task_chunks=2)
    convert(str(src), str(dst), 2, progress=True, task_chunks=2)
    first, resumed = bars
    _never_back(first)
    _never_back(resumed)
    stopped_at = first[-1][0]
    # 12 shards recorded, the last 4 are read back again (counted when skipped): the others are counted first
    assert 0 < resumed[0][0] <= stopped_at and resumed[0][0] >= stopped_at - 4 * 2 - 1
    assert resumed[-1][0] == GRID_POSITIONS


def test_shard_positions():
    grid, cps = (5, 3), (2, 2)  # shard grid 3 x 2
    assert [shard_positions(i, grid, cps) for i in range(6)] == [4, 2, 4, 2, 2, 1]
    assert sum(shard_positions(i, grid, cps) for i in range(6)) == math.prod(grid)
    assert shard_positions(0, (), ()) == 1


def test_bar_plan_counts_recorded_shards_except_the_ones_read_back():
    progress = ArrayProgress()
    for index in (0, 1, 5):
        progress.add(index, 10, 10)
    plan = BarPlan({"a": ((5, 3), (2, 2)), "u": ((4,), None)}, {"a": progress}, reread=[("a", 5)])
    assert plan.total == 15 + 4 and plan.initial == 4 + 2
    assert plan.shard("a", 0) == 0 and plan.shard("a", 5) == 1 and plan.shard("a", 2) == 4
    assert plan.array("u") == 4

"""shardkv.zarr3.batching.Batcher: concurrent calls answered from one run per batch.

The event loop keeps only a weak reference to a task; the batcher holds the task that
runs its batches, so that task lives as long as calls wait on it.
"""

from __future__ import annotations

import asyncio
import gc
import threading

import pytest

pytest.importorskip("zarr.abc.store")

from shardkv.zarr3.batching import Batcher  # noqa: E402


def test_calls_made_while_a_batch_runs_are_answered_by_the_next_batch() -> None:
    first_started, release = threading.Event(), threading.Event()
    batches: list[list[int]] = []

    def run(items: list[int]) -> list[int]:
        batches.append(items)
        if len(batches) == 1:
            first_started.set()
            assert release.wait(10), "the test never released the first batch"
        return [item * 10 for item in items]

    async def main() -> list[int]:
        batcher: Batcher[int, int] = Batcher(run)
        first = asyncio.ensure_future(batcher.submit(1))
        await asyncio.to_thread(first_started.wait, 10)
        rest = [asyncio.ensure_future(batcher.submit(i)) for i in (2, 3, 4)]
        await asyncio.sleep(0)  # the three calls are queued behind the running batch
        release.set()
        return list(await asyncio.gather(first, *rest))

    assert asyncio.run(main()) == [10, 20, 30, 40]
    assert batches == [[1], [2, 3, 4]]


def test_an_error_of_a_batch_reaches_each_of_its_calls() -> None:
    def run(items: list[int]) -> list[int]:
        raise OSError(f"cannot run {items}")

    async def main() -> list[BaseException | int]:
        batcher: Batcher[int, int] = Batcher(run)
        return list(await asyncio.gather(batcher.submit(1), batcher.submit(2), return_exceptions=True))

    outcomes = asyncio.run(main())
    assert [type(o) for o in outcomes] == [OSError, OSError]


def test_the_task_running_a_batch_is_held_by_the_batcher() -> None:
    """A task only the event loop's weak set refers to can be collected while calls wait on it."""
    started, release = threading.Event(), threading.Event()

    def run(items: list[int]) -> list[int]:
        started.set()
        assert release.wait(10), "the test never released the batch"
        return items

    async def main() -> None:
        batcher: Batcher[int, int] = Batcher(run)
        call = asyncio.ensure_future(batcher.submit(7))
        await asyncio.to_thread(started.wait, 10)
        try:
            running = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and t is not call]
            assert len(running) == 1
            gc.collect()
            holders = [vars(state) for state in batcher._loops.values()]
            assert any(r is h for r in gc.get_referrers(running[0]) for h in holders)
        finally:
            release.set()
        assert await call == 7

    asyncio.run(main())

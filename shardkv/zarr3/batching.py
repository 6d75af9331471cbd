"""Concurrent chunk calls of zarr 3 (one per chunk) gathered into one engine call per batch.

A :class:`Batcher` collects the calls made while the previous batch runs and
hands them to the engine together, in one worker thread call.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class _LoopState(Generic[T, R]):
    """The calls waiting on one event loop, and the task running their batches there (if any)."""

    def __init__(self) -> None:
        self.pending: list[tuple[T, asyncio.Future[R]]] = []
        # held here: the event loop keeps only a weak reference to a task, and a task nothing else
        # holds may be collected before it has answered the calls waiting on it
        self.drain: asyncio.Task[None] | None = None


class Batcher(Generic[T, R]):
    """Runs ``run`` on batches of the items submitted concurrently.

    Parameters
    ----------
    run : callable
        Blocking; takes a list of items, returns one result per item, in order.
        An exception fails every call of the batch.
    """

    def __init__(self, run: Callable[[list[T]], Sequence[R]]) -> None:
        self._run = run
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopState[T, R]] = (
            weakref.WeakKeyDictionary()
        )

    async def submit(self, item: T) -> R:
        """The result of ``item``, computed in a batch with the items submitted alongside."""
        loop = asyncio.get_running_loop()
        state = self._loops.get(loop)
        if state is None:
            state = self._loops[loop] = _LoopState()
        future: asyncio.Future[R] = loop.create_future()
        state.pending.append((item, future))
        if state.drain is None or state.drain.done():
            state.drain = loop.create_task(self._drain(state))
        return await future

    async def _drain(self, state: _LoopState[T, R]) -> None:
        while state.pending:
            batch, state.pending = state.pending, []
            try:
                results = await asyncio.to_thread(self._run, [item for item, _ in batch])
            except BaseException as exc:  # handed to every caller of the batch, none lost
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                if not isinstance(exc, Exception):
                    raise
                continue
            for (_, future), result in zip(batch, results, strict=True):  # run returns one result per item
                if not future.done():
                    future.set_result(result)

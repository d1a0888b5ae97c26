"""An asyncio loop on its own thread, for trainers that call gymflow synchronously (TRL's `rollout_func`).

The gymflow client is bound to the loop it was connected on; a synchronous trainer thread hands coroutines to
that loop and waits for them. Calling back from the loop's own thread would deadlock, so it is refused.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoopGone(RuntimeError):
    """The loop that gymflow's client lives on is closed or stopped: the stack was shut down."""


def run_on(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T], timeout_s: float | None) -> T:
    """Run `coro` on `loop` from another thread and wait for it (at most `timeout_s`)."""
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        coro.close()
        raise RuntimeError("called on the gymflow client's own event loop thread, which would deadlock: call it "
                           "from another thread (e.g. `await asyncio.to_thread(trainer.train)`)")
    if loop.is_closed() or not loop.is_running():
        coro.close()
        raise LoopGone("the event loop of gymflow's client is not running (the stack was shut down)")
    future = asyncio.run_coroutine_threadsafe(coro, loop)
    try:
        return future.result(timeout_s)
    except concurrent.futures.TimeoutError:
        future.cancel()
        raise


class LoopThread:
    """`with LoopThread() as lt: client = lt.run(GymflowClient.connect(settings))`; `lt.loop` for the rest."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        started = threading.Event()
        self.loop.call_soon(started.set)
        self._thread = threading.Thread(target=self.loop.run_forever, name="gymflow-loop", daemon=True)
        self._thread.start()
        started.wait()  # run() refuses a loop that is not running yet; the first call must not race the thread

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        return run_on(self.loop, coro, timeout_s)

    def close(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self.loop.close()

    def __enter__(self) -> LoopThread:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""A synchronous client for scripts and notebooks: `gymflow.connect()` returns a `SyncClient`.

The async `GymflowClient` runs on a private event loop in a background thread, so the calls here block the
caller only, and work where a loop already runs (Jupyter). Every wait is bounded: a call that outlives its
timeout is cancelled and raises TimeoutError.

    with gymflow.connect() as client:                      # $GYMFLOW_CONFIG, ./gymflow.yaml, or defaults
        results = client.collect("my-run", tasks, n=4, model="policy")
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine, Iterable
from contextlib import aclosing
from pathlib import Path
from typing import Any, TypeVar

from gymflow.client import CollectResult, GymflowClient
from gymflow.kernel.config import Settings, load_settings
from gymflow.kernel.wire import SamplingParams, Task

T = TypeVar("T")
CONNECT_WAIT_S = 60.0  # for Postgres and Temporal to answer
COLLECT_TIMEOUT_S = 3600.0
CALL_TIMEOUT_S = 300.0  # report, export
CLOSE_TIMEOUT_S = 30.0


class SyncClient:
    """Blocking calls on a `GymflowClient` (`.aio`, for what is only async) run on a private loop thread.
    Any coroutine of the async API runs through `run`, e.g. `client.run(gymflow.export(client.aio, ...))`."""

    def __init__(self, settings: Settings, *, wait_s: float = CONNECT_WAIT_S) -> None:
        self.settings = settings
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="gymflow-sync", daemon=True)
        self._thread.start()
        self._client: GymflowClient | None = None
        try:
            self._client = self._run(GymflowClient.connect(settings, wait_s=wait_s), wait_s + 30.0,
                                     "connecting to Temporal and Postgres")
        except BaseException:
            self._stop_loop()
            raise

    @property
    def aio(self) -> GymflowClient:
        """The async client underneath; await its calls only through `run`."""
        if self._client is None:
            raise RuntimeError("this gymflow client is closed")
        return self._client

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float = CALL_TIMEOUT_S) -> T:
        """Run `coro` (e.g. `group_records(client.aio, groups)`) on the client's loop and return its result."""
        self.aio  # noqa: B018 - fails clearly when closed
        return self._run(coro, timeout_s, "the call")

    def _run(self, coro: Coroutine[Any, Any, T], timeout_s: float, what: str) -> T:
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout=timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"gymflow: {what} did not finish within {timeout_s:.0f} s (cancelled)") from None
        except BaseException:  # Ctrl-C in a script or a notebook: stop the work on the loop too
            future.cancel()
            raise

    def collect(self, run_id: str, tasks: Iterable[Task], *, n: int, model: str = "policy",
                sampling: SamplingParams | None = None, max_turns: int | None = None, max_in_flight: int = 1000,
                retry_failed: bool = False, timeout_s: float = COLLECT_TIMEOUT_S) -> list[CollectResult]:
        """Run every task `n` times as run `run_id`; every result, in the order they finished. Collecting the
        same run again attaches to running rollouts and skips finished ones (GymflowClient.collect)."""
        client = self.aio

        async def gather() -> list[CollectResult]:
            async with aclosing(client.collect(run_id, list(tasks), n=n, model=model, sampling=sampling,
                                               max_turns=max_turns, max_in_flight=max_in_flight,
                                               retry_failed=retry_failed)) as results:
                return [r async for r in results]

        return self._run(gather(), timeout_s, f"collecting run {run_id!r}")

    def report(self, run_id: str, timeout_s: float = CALL_TIMEOUT_S) -> dict[str, list[dict[str, Any]]]:
        """Mean reward and pass@k, failures by type, latency percentiles for one run."""
        return self._run(self.aio.report(run_id), timeout_s, f"the report of run {run_id!r}")

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Close the connections and stop the loop thread; closing twice is a no-op."""
        client, self._client = self._client, None
        try:
            if client is not None and self._loop.is_running():
                self._run(client.close(), timeout_s, "closing the client")
        finally:
            self._stop_loop(timeout_s)

    def _stop_loop(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        if self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout_s)
        if not self._thread.is_alive():
            self._loop.close()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(config: str | Path | Settings | None = None, *, wait_s: float = CONNECT_WAIT_S) -> SyncClient:
    """A `SyncClient` for `config`: a Settings, a gymflow.yaml path, or None for $GYMFLOW_CONFIG, else
    ./gymflow.yaml, else the embedded defaults (load_settings). Waits at most `wait_s` for the stack."""
    settings = config if isinstance(config, Settings) else load_settings(config)
    return SyncClient(settings, wait_s=wait_s)


__all__ = ["SyncClient", "connect"]

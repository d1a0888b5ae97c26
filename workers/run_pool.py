"""`gymflow worker --pool ...`: run one pool until SIGTERM/SIGINT, then shut down gracefully."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Callable, Sequence

from gymflow.workers import metrics
from gymflow.workers.local_stack import STOP_WITH_PARENT_ENV
from gymflow.workers.pools import Pool, build_pool, served_models
from temporalio.client import Client

from gymflow.kernel.config import Settings
from gymflow.kernel.connect import (
    connect_temporal,
    resolve_addresses,
    startup_wait_s,
    temporal_options,
    worker_runtime,
)
from gymflow.kernel.store.db import migrate_when_reachable

log = logging.getLogger("gymflow.worker")


async def _dependencies(settings: Settings, pool: Pool, metrics_bind: str | None) -> tuple[Client, str]:
    """Wait (bounded) for Postgres, when the pool writes to it, and for Temporal: a worker may start first."""
    temporal, database = resolve_addresses(settings)
    options = temporal_options(settings)  # TLS / API key: a missing key or cert file fails now, not after waits
    wait_s = startup_wait_s()
    if pool != "workflows":
        # Migrations run here, with retries, so build_pool's own migrate finds the schema at head.
        await migrate_when_reachable(database, wait_s=wait_s, on_wait=log.warning)
    # One endpoint per worker: rollout metrics plus the SDK's (task slots, schedule-to-start, pollers).
    runtime = metrics.serve(metrics_bind) if metrics_bind else worker_runtime()
    client = await connect_temporal(temporal, wait_s=wait_s, runtime=runtime, on_wait=log.warning, options=options)
    log.info("connected to Temporal at %s (%s)", temporal, options.describe())  # describe() never shows secrets
    return client, database


async def run_pool(settings: Settings, pool: Pool, metrics_bind: str | None = None,
                   models: Sequence[str] | None = None, say: Callable[[str], None] = log.info) -> None:
    """`models`: the generate queues to poll (default: every configured model); `say`: where the few lines a
    person at the terminal needs go (polling, stopping, stopped). A pool spawned by `gymflow up` says only
    that it polls: its parent speaks for the stop."""
    spawned = STOP_WITH_PARENT_ENV in os.environ
    if spawned:
        say_stop: Callable[[str], None] = log.info
    else:
        say_stop = say
    served = served_models(settings, models)  # an unknown --models name fails before any wait
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    parent_watch = asyncio.create_task(_stop_with_parent(stop))
    # SIGTERM while still waiting for Postgres or Temporal stops the wait instead of being ignored.
    starting = asyncio.create_task(_dependencies(settings, pool, metrics_bind))
    stopper = asyncio.create_task(stop.wait())
    await asyncio.wait([starting, stopper], return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():
        starting.cancel()
        await asyncio.gather(starting, return_exceptions=True)
        say_stop(f"pool {pool}: stopped before it started; nothing was running here")
        return
    stopper.cancel()
    client, database = starting.result()
    built = build_pool(client, settings, pool, database, generate_models=served)
    queues = ", ".join(w.task_queue for w in built.workers)
    say(f"pool {pool} polling {queues}" if spawned else
        f"pool {pool} polling {queues} (Ctrl-C or SIGTERM: stop after in-flight work)")
    try:
        runs = [asyncio.create_task(w.run()) for w in built.workers]
        waiter = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait([*runs, waiter], return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if task is not waiter and task.exception():
                raise task.exception()  # type: ignore[misc]
        say_stop(f"pool {pool}: stopping; in-flight calls finish first")
        await asyncio.gather(*(w.shutdown() for w in built.workers))
        say_stop(f"pool {pool} stopped. Its rollouts are Temporal's: they go on with another {pool} worker, or with "
            "this one when it starts again.")
    finally:
        parent_watch.cancel()
        await built.close()


async def _stop_with_parent(stop: asyncio.Event, every_s: float = 1.0) -> None:
    """A pool that `gymflow up` or `demo` spawned sits in its own process group (a Ctrl-C reaches only its
    parent, which stops the pools in order): if that parent dies without stopping it, stop as on SIGTERM rather
    than poll on as an orphan."""
    parent = os.environ.get(STOP_WITH_PARENT_ENV)
    if not parent or not parent.isdigit():
        return
    while os.getppid() == int(parent):
        await asyncio.sleep(every_s)
    log.warning("pool's parent (pid %s) is gone: shutting down", parent)
    stop.set()

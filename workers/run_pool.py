"""`gymflow worker --pool ...`: run one pool until SIGTERM/SIGINT, then shut down gracefully."""

from __future__ import annotations

import asyncio
import logging
import signal

from gymflow.kernel.config import Settings
from workers.connect import connect_temporal, prometheus_runtime, resolve_addresses
from workers.pools import Pool, build_pool

log = logging.getLogger("gymflow.worker")


async def run_pool(settings: Settings, pool: Pool, metrics_bind: str | None = None) -> None:
    temporal, database = resolve_addresses(settings)
    runtime = prometheus_runtime(metrics_bind) if metrics_bind else None
    client = await connect_temporal(temporal, settings.temporal.namespace, runtime=runtime)
    built = build_pool(client, settings, pool, database)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log.info("pool %s polling %s", pool, ", ".join(w.task_queue for w in built.workers))
    try:
        runs = [asyncio.create_task(w.run()) for w in built.workers]
        waiter = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait([*runs, waiter], return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if task is not waiter and task.exception():
                raise task.exception()  # type: ignore[misc]
        log.info("pool %s shutting down (finishing in-flight work)", pool)
        await asyncio.gather(*(w.shutdown() for w in built.workers))
    finally:
        await built.close()

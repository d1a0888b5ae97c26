"""psycopg connections for the episode activities' statements (gymflow/kernel/store/episodes.py), from
psycopg_pool: no SQLAlchemy session, compile or pool bookkeeping per statement (~0.4 ms of CPU each)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import psycopg
from psycopg_pool import AsyncConnectionPool

from gymflow.kernel.store.repo import Conn
from gymflow.kernel.store.urls import psycopg_url

CONNECT_TIMEOUT_S = 10
CHECKOUT_TIMEOUT_S = 30
# psycopg_pool logs every failed reconnection while Postgres is down; the activities report the outage already.
logging.getLogger("psycopg.pool").setLevel(logging.ERROR)


class DirectPool:
    """Autocommit connections, opened on first use (inside the worker's event loop). Use `conn.transaction()`
    for more than one statement."""

    def __init__(self, url: str, max_size: int = 20) -> None:
        self._pool = AsyncConnectionPool(psycopg_url(url), min_size=1, max_size=max_size, open=False,
                                         timeout=CHECKOUT_TIMEOUT_S, name="gymflow-episodes",
                                         kwargs={"autocommit": True, "connect_timeout": CONNECT_TIMEOUT_S})
        self._opened = False

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[Conn]:
        if not self._opened:
            self._opened = True
            await self._pool.open(wait=False)
        try:
            async with self._pool.connection() as conn:
                yield conn
        except psycopg.OperationalError:
            # After a Postgres restart every idle connection is dead: drop them all now, so the caller's retry
            # gets a fresh one instead of the next dead one.
            await self._pool.check()
            raise

    async def close(self) -> None:
        if self._opened:
            await self._pool.close(timeout=5)

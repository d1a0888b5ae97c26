"""Loading what a report shows from Postgres, and the Temporal UI links next to rollout ids."""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from sqlalchemy.ext.asyncio import AsyncSession

from gymflow.kernel.config import Settings
from gymflow.kernel.connect import resolve_addresses, stack_file, startup_wait_s
from gymflow.kernel.errors import ConfigError
from gymflow.kernel.store import reports, scores
from gymflow.kernel.store.db import make_engine, make_sessionmaker, migrate_when_reachable
from gymflow.kernel.store.repo import driver

UI_URL_ENV = "GYMFLOW_UI_URL"
Row = dict[str, Any]
Linker = Callable[[str], str | None]  # workflow (= rollout) id -> its Temporal UI page, or None


@dataclass
class RunData:
    """Everything a report about one run shows."""

    run_id: str
    views: dict[str, list[Row]]
    failures: list[Row]  # top messages per failure type (reports.top_failures)
    points: list[Row]  # one row per rollout (reports.rollout_points)
    score_version: str | None = None  # the rescore whose scores these are (None: the collect's own)
    rewards_by_task: dict[str, list[float]] = field(init=False)

    def __post_init__(self) -> None:
        # Scored = completed and not masked, as the run_scores view counts mean reward.
        by_task: dict[str, list[float]] = defaultdict(list)
        for p in self.points:
            if p["status"] == "completed" and not p["masked"] and p["reward"] is not None:
                by_task[p["task_id"]].append(float(p["reward"]))
        self.rewards_by_task = dict(by_task)

    @property
    def rewards(self) -> list[float]:
        return [r for rs in self.rewards_by_task.values() for r in rs]

    @property
    def latencies(self) -> list[float]:
        return [float(p["latency_s"]) for p in self.points if p["latency_s"] is not None]


def ui_base_url(settings: Settings, explicit: str | None = None) -> str | None:
    """The Temporal UI to link to: `explicit` (--ui-url), else $GYMFLOW_UI_URL, else the `ui_url` that
    `gymflow up` wrote to its stack file, if that stack is the Temporal we use; None when unknown."""
    chosen = explicit or os.environ.get(UI_URL_ENV)
    if chosen:
        return chosen.rstrip("/")
    path = stack_file(settings)
    try:
        stack = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    configured = settings.temporal.address
    if not isinstance(stack, dict) or (configured and configured != stack.get("temporal_address")):
        return None  # a stack file of another Temporal would link to the wrong server
    url = stack.get("ui_url")
    return url.rstrip("/") if isinstance(url, str) and url else None


def workflow_url(base: str, namespace: str, workflow_id: str) -> str:
    """The Temporal UI page of a workflow; ids hold '/', so every part is percent-encoded."""
    return f"{base}/namespaces/{quote(namespace, safe='')}/workflows/{quote(workflow_id, safe='')}"


def make_linker(settings: Settings, explicit: str | None = None) -> Linker:
    base = ui_base_url(settings, explicit)
    if base is None:
        return lambda _wid: None
    return lambda wid: workflow_url(base, settings.temporal.namespace, wid)


@asynccontextmanager
async def store_session(settings: Settings, on_wait: Callable[[str], None] | None = None
                        ) -> AsyncIterator[AsyncSession]:
    """A read session on the run store. Only Postgres: a report must work while Temporal is down."""
    try:
        _, database_url = resolve_addresses(settings)
    except ConfigError:
        if not settings.database.url:
            raise
        database_url = settings.database.url
    # Idempotent; makes the views exist on a database no worker has touched yet.
    await migrate_when_reachable(database_url, wait_s=startup_wait_s(), on_wait=on_wait)
    engine = make_engine(database_url, pool_size=1)
    try:
        async with make_sessionmaker(engine)() as session:
            yield session
    finally:
        await engine.dispose()


async def load_run(session: AsyncSession, run_id: str, *, per_type: int = 3, examples: int = 3,
                   score: str = scores.LATEST) -> RunData | None:
    """The run's report data, or None when it has no rollouts. `score`: which score version (`latest`: the newest
    finished rescore, else the collect's own; `collected`; or a version's name); LookupError for an unknown one."""
    version = await scores.resolve(await driver(session), run_id, score)
    vid = version.id if version is not None else None
    points = await reports.rollout_points(session, run_id, vid)
    if not points:
        return None
    return RunData(run_id=run_id, views=await reports.run_report(session, run_id, vid),
                   failures=await reports.top_failures(session, run_id, per_type=per_type, examples=examples,
                                                       version_id=vid),
                   points=points, score_version=version.name if version is not None else None)

"""Persist activity: the idempotent upsert of a finished rollout, keyed by its deterministic id."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import async_sessionmaker
from temporalio import activity

from activities import metrics
from activities.boundary import boundary, retry_store
from gymflow.kernel import names
from gymflow.kernel.store.repo import save_rollout
from gymflow.kernel.wire import RolloutRecord

# Short: the activity's own retry policy (minutes, bounded) handles long outages; this only rides out a blip
# without a round trip through Temporal.
PERSIST_RETRY_S = 10.0


class PersistActivities:
    def __init__(self, sessions: async_sessionmaker) -> None:
        self._sessions = sessions

    @activity.defn(name=names.PERSIST_ROLLOUT)
    async def persist_rollout(self, record: RolloutRecord) -> None:
        async def write() -> None:
            async with self._sessions.begin() as session:
                await save_rollout(session, record)

        with boundary(where=f"persisting {record.summary.rollout_id[:200]}"):
            await retry_store(write, "persisting the rollout", budget_s=PERSIST_RETRY_S)
        metrics.rollout_finished(record)

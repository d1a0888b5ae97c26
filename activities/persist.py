"""Persist activity: the idempotent upsert of a finished rollout, keyed by its deterministic id."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import async_sessionmaker
from temporalio import activity

from gymflow.kernel import names
from gymflow.kernel.store.repo import save_rollout
from gymflow.kernel.wire import RolloutRecord


class PersistActivities:
    def __init__(self, sessions: async_sessionmaker) -> None:
        self._sessions = sessions

    @activity.defn(name=names.PERSIST_ROLLOUT)
    async def persist_rollout(self, record: RolloutRecord) -> None:
        async with self._sessions.begin() as session:
            await save_rollout(session, record)

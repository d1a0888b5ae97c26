"""A rollout's completed record, read back: what the client keeps when the execution it started was closed from
outside (cancelled, terminated, timed out) after it had already persisted the episode."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import defer

from gymflow.kernel.store.models import Rollout
from gymflow.kernel.wire import RolloutSummary, Usage


async def completed_by(session: AsyncSession, rollout_id: str, execution_id: str) -> RolloutSummary | None:
    """The rollout's row when the execution `execution_id` (a workflow run id) completed it, else None (an earlier
    run of the same rollout id, or none, wrote it)."""
    stmt = (sa.select(Rollout).options(defer(Rollout.transcript), defer(Rollout.score_details))
            .where(Rollout.id == rollout_id, Rollout.status == "completed", Rollout.execution_id == execution_id))
    row = (await session.execute(stmt)).scalar_one_or_none()
    if row is None:
        return None
    return RolloutSummary(
        rollout_id=row.id, run_id=row.run_id, task_id=row.task_id, sample_index=row.sample_index, status="completed",
        reward=row.reward, masked=row.masked, failure_type=row.failure_type, turns=row.turns or 0,
        tool_calls=row.tool_calls or 0,
        usage=Usage(prompt_tokens=row.prompt_tokens or 0, completion_tokens=row.completion_tokens or 0),
        attempts=row.attempts or 0, latency_s=row.latency_s or 0.0)

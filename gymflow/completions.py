"""Rollout results for the collecting client, read from Postgres for the whole run at once.

Waiting on each rollout's workflow holds one long-poll per rollout open on the Temporal server (1,000 in flight
are 1,000 history waits, each answered by a history read when the workflow closes). Every rollout's final
summary is in `rollouts` before its workflow completes (the workflow's last step writes it), so one query per
poll interval answers every waiter of the process. Temporal is still asked, with a cheap `describe` on a
widening interval, so a workflow that closed without a row (terminated, timed out, cancelled, its store write
given up) is noticed and recorded by the caller as before.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import async_sessionmaker

from gymflow.kernel.wire import RolloutSummary, Usage

log = logging.getLogger(__name__)

POLL_S = 0.2  # how stale a result may be when the client sees it
CHUNK = 1000  # ids per query

_FINISHED = sa.text("""
SELECT id, run_id, task_id, sample_index, status, reward, masked, failure_type, failure_message, turns, tool_calls,
       prompt_tokens, completion_tokens, attempts, latency_s
FROM rollouts WHERE id = ANY(:ids) AND status <> 'running' AND finished_at IS NOT NULL
""")


def summary_of(row: Any) -> RolloutSummary:
    m = row._mapping
    return RolloutSummary(
        rollout_id=m["id"], run_id=m["run_id"], task_id=m["task_id"], sample_index=m["sample_index"],
        status=m["status"], reward=m["reward"], masked=m["masked"], failure_type=m["failure_type"],
        failure_message=m["failure_message"], turns=m["turns"], tool_calls=m["tool_calls"],
        usage=Usage(prompt_tokens=m["prompt_tokens"], completion_tokens=m["completion_tokens"]),
        attempts=m["attempts"], latency_s=m["latency_s"])


class CompletionStream:
    """`await stream.wait(rollout_id)` returns the rollout's recorded summary once its row is final."""

    def __init__(self, sessions: async_sessionmaker, poll_s: float = POLL_S) -> None:
        self._sessions = sessions
        self.poll_s = poll_s
        self._waiting: dict[str, list[asyncio.Future[RolloutSummary]]] = {}
        self._poller: asyncio.Task[None] | None = None

    async def wait(self, rollout_id: str) -> RolloutSummary:
        future: asyncio.Future[RolloutSummary] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(rollout_id, []).append(future)
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll())
        try:
            return await future
        finally:
            waiters = self._waiting.get(rollout_id, [])
            if future in waiters:
                waiters.remove(future)
            if not waiters:
                self._waiting.pop(rollout_id, None)

    async def _poll(self) -> None:
        while self._waiting:
            ids = list(self._waiting)
            try:
                async with self._sessions() as session:
                    for start in range(0, len(ids), CHUNK):
                        rows = await session.execute(_FINISHED, {"ids": ids[start:start + CHUNK]})
                        for row in rows:
                            summary = summary_of(row)
                            for future in self._waiting.get(summary.rollout_id, []):
                                if not future.done():
                                    future.set_result(summary)
            except (SQLAlchemyError, OSError) as err:  # Postgres blinked: the describe path still bounds each wait
                log.debug("completion poll failed: %s", err)
            await asyncio.sleep(self.poll_s)

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)

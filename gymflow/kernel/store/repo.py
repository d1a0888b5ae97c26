"""Idempotent writes. A retried or replayed activity calls these again; no row is ever duplicated.

Every text and JSONB value is made storable first (`storable`): Postgres refuses a NUL byte in text and the
`\\u0000` escape in JSONB, and psycopg cannot encode a lone surrogate, so one NUL in a model answer or a
program's output once made persist retry for 15 minutes and lose the reward. Such a character becomes U+FFFD
(the Unicode replacement character): one character for one, so offsets into the text stay right, and
unambiguous, where an escape like the text `\\u0000` would be indistinguishable from a model that wrote it.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Any

from psycopg import AsyncConnection
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from gymflow.kernel.store.fence import TAKE_OVER, may_write
from gymflow.kernel.store.models import Run
from gymflow.kernel.wire import RolloutRecord

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
REPLACEMENT = "\ufffd"
Conn = AsyncConnection[Any]


def storable(value: Any) -> Any:
    """`value` with every NUL and lone surrogate in its strings (dict keys too, at any depth) replaced by U+FFFD."""
    if isinstance(value, str):
        return _UNSTORABLE.sub(REPLACEMENT, value) if _UNSTORABLE.search(value) else value
    if isinstance(value, dict):
        return {storable(k): storable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [storable(v) for v in value]
    return value


async def upsert_run(session: AsyncSession, run_id: str, **fields: Any) -> None:
    run_id, fields = storable(run_id), storable(fields)
    stmt = insert(Run).values(id=run_id, **fields)
    await session.execute(stmt.on_conflict_do_update(index_elements=[Run.id], set_=fields) if fields
                          else stmt.on_conflict_do_nothing())


async def driver(session: AsyncSession) -> Conn:
    """The psycopg connection under `session` (in its transaction): for the statements written for psycopg."""
    raw = await (await session.connection()).get_raw_connection()
    return raw.driver_connection


_MARK_STARTED = f"""
INSERT INTO rollout_rows (id, run_id, task_id, sample_index, env, model, status, execution_id, execution_started_at)
VALUES (%(id)s, %(run_id)s, %(task_id)s, %(sample_index)s, %(env)s, %(model)s, 'running', %(execution_id)s,
        %(execution_started_at)s)
ON CONFLICT (id) DO UPDATE SET status = 'running', started_at = now(), finished_at = NULL, {TAKE_OVER}
WHERE rollout_rows.status <> 'completed' AND {may_write("rollout_rows")}
"""


async def mark_rollout_started(conn: Conn, *, rollout_id: str, run_id: str, task_id: str, sample_index: int,
                               env: str, model: str, execution_id: str | None = None,
                               execution_started_at: datetime | None = None) -> None:
    """Insert the row as `running` so SQL sees in-flight episodes. Never downgrades a finished row, and never
    takes the row from a newer execution (gymflow/kernel/store/fence.py)."""
    await conn.execute(_MARK_STARTED, {**storable(dict(id=rollout_id, run_id=run_id, task_id=task_id,
                                                        sample_index=sample_index, env=env, model=model)),
                                       "execution_id": execution_id, "execution_started_at": execution_started_at})


async def save_rollout(session: AsyncSession, record: RolloutRecord) -> None:
    await write_rollout(await driver(session), record)


async def write_rollout(conn: Conn, record: RolloutRecord) -> None:
    """The rollout's row in one statement (atomic on its own): the episode's transcript and turns are its chain's
    up to `record.head_id`, so nothing else is written. A stale execution's write changes nothing (the fence)."""
    await conn.execute(ROLLOUT_UPSERT, rollout_params(record))


_ROLLOUT_COLUMNS = ("id", "run_id", "task_id", "sample_index", "env", "model", "status", "reward", "masked",
                    "failure_type", "failure_message", "turns", "tool_calls", "prompt_tokens", "completion_tokens",
                    "attempts", "latency_s", "head_id", "score_details", "execution_id", "execution_started_at")
_ROLLOUT_JSON = frozenset({"score_details"})
_ROLLOUT_VALUES = ", ".join(f"%({c})s::jsonb" if c in _ROLLOUT_JSON else f"%({c})s" for c in _ROLLOUT_COLUMNS)
# Writes the rollout's row, replacing an earlier one (a retry, a rerun) unless a newer execution owns it
# (gymflow/kernel/store/fence.py). Values come once, as EXCLUDED; the finish time is the database's. The
# transcript is the chain that ends at `head_id` (migration 0008): what a row stored before 0008 goes.
ROLLOUT_UPSERT = f"""
INSERT INTO rollout_rows ({", ".join(_ROLLOUT_COLUMNS)}, finished_at)
VALUES ({_ROLLOUT_VALUES}, now())
ON CONFLICT (id) DO UPDATE SET {", ".join(f"{c} = EXCLUDED.{c}" for c in _ROLLOUT_COLUMNS[1:-2])},
    finished_at = now(), transcript_before_0008 = NULL, {TAKE_OVER}
WHERE {may_write("rollout_rows")}
"""


def rollout_params(record: RolloutRecord) -> dict[str, Any]:
    """The parameters of ROLLOUT_UPSERT: every text made storable, the JSON columns as JSON text."""
    s = record.summary
    values: dict[str, Any] = storable(dict(
        id=s.rollout_id, run_id=s.run_id, task_id=s.task_id, sample_index=s.sample_index,
        env=record.env, model=record.model, status=s.status, reward=s.reward, masked=s.masked,
        failure_type=s.failure_type, failure_message=s.failure_message, turns=s.turns,
        tool_calls=s.tool_calls, prompt_tokens=s.usage.prompt_tokens,
        completion_tokens=s.usage.completion_tokens, attempts=s.attempts, latency_s=s.latency_s,
        score_details=record.score_details,
    ))
    values["score_details"] = json.dumps(values["score_details"])
    values["head_id"] = record.head_id
    values["execution_id"], values["execution_started_at"] = record.execution_id, record.execution_started_at
    return values

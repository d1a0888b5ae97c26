"""Episode data by reference (docs/design-episode-data.md): tasks once per run, messages as an append-only chain.

A workflow holds only a head message id; `read_chain(head)` is exactly the prefix that head extends. Writers
append a batch under a producer key (`<workflow run id>/<activity id>`): the same producer appending again
(a retry, or a zombie attempt racing the new one) gets the batch that was written first, never a second
copy. Rows reachable from no accepted head (a zombie's, a reset run's) are simply not part of any episode. A
finished rollout's row names its accepted head (`rollout_rows.head_id`); its transcript and `generations` are
views of that chain (migration 0008), so each message is stored once.

These run on psycopg connections (`Conn`; a SQLAlchemy session's is `repo.driver(session)`): the episode's hot
path skips SQLAlchemy, which cost ~0.4 ms of CPU per statement against psycopg's ~0.08 (docs/benchmarks.md).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from gymflow.kernel.store.models import TaskRow
from gymflow.kernel.store.repo import Conn, storable
from gymflow.kernel.wire import Task, ToolSpec


async def _one(conn: Conn, sql: str, params: Any) -> Any:
    return await (await conn.execute(sql, params)).fetchone()


def _json(value: Any) -> str:
    return json.dumps(storable(value))


@dataclass(frozen=True)
class NewMessage:
    """What an activity appends: the message (Chat Completions shape), and optionally the episode state after
    it (tool messages that changed it) and its token data (assistant messages from a token-aware server)."""

    role: str
    body: dict[str, Any]
    state: dict[str, Any] | None = None
    tokens: dict[str, Any] | None = None


@dataclass(frozen=True)
class StoredMessage:
    id: int
    parent_id: int | None
    position: int
    role: str
    body: dict[str, Any]
    state: dict[str, Any] | None
    tokens: dict[str, Any] | None


async def save_tasks(session: AsyncSession, run_id: str, tasks: Sequence[Task]) -> None:
    """Store each task of a run once; storing the same run again changes nothing (rows are immutable)."""
    if not tasks:
        return
    rows = [{"run_id": run_id, "task_id": t.id, "env": t.env, "body": t.model_dump(mode="json")} for t in tasks]
    await session.execute(insert(TaskRow).values(storable(rows)).on_conflict_do_nothing())


async def load_task(conn: Conn, run_id: str, task_id: str) -> Task | None:
    row = await _one(conn, "SELECT body FROM tasks WHERE run_id = %s AND task_id = %s", (run_id, task_id))
    return None if row is None else Task.model_validate(row[0])


async def save_task_tools(conn: Conn, run_id: str, task_id: str, tools: Sequence[ToolSpec]) -> None:
    """Record the tool schemas the task's environment offers (written once; the first writer wins)."""
    await conn.execute("UPDATE tasks SET tools = %s::jsonb WHERE run_id = %s AND task_id = %s AND tools IS NULL",
                       (_json([t.model_dump(mode="json") for t in tools]), run_id, task_id))


async def load_task_tools(conn: Conn, run_id: str, task_id: str) -> tuple[ToolSpec, ...] | None:
    """The stored tool schemas, or None when `begin` has not recorded them (a task stored by an older worker)."""
    row = await _one(conn, "SELECT tools FROM tasks WHERE run_id = %s AND task_id = %s", (run_id, task_id))
    return None if row is None or row[0] is None else tuple(ToolSpec.model_validate(t) for t in row[0])


@dataclass(frozen=True)
class EncodedMessage:
    """A NewMessage as the JSON text stored for it (NULs replaced): encoded once, for the write and for the
    writer's own copy of the chain (`as_stored`)."""

    role: str
    body: str
    state: str | None
    tokens: str | None


def encode(messages: Sequence[NewMessage]) -> list[EncodedMessage]:
    return [EncodedMessage(m.role, _json(m.body), None if m.state is None else _json(m.state),
                           None if m.tokens is None else json.dumps(m.tokens)) for m in messages]


async def append_messages(conn: Conn, *, rollout_id: str, parent_id: int | None, producer: str,
                          messages: Sequence[NewMessage]) -> list[int]:
    """Append `messages` after `parent_id` (None: the episode's first) and return their ids, in order.

    Idempotent per (rollout, producer): when the producer already wrote its batch, that batch's ids come back
    and nothing is written. Run it in its own transaction so a conflict is seen, not half-applied. One round trip
    per message: each insert takes its position from its parent's row, which must belong to the rollout."""
    ids, earlier = await append_batch(conn, rollout_id=rollout_id, parent_id=parent_id, producer=producer,
                                      messages=encode(messages))
    return ids if earlier is None else [m.id for m in earlier]


async def append_batch(conn: Conn, *, rollout_id: str, parent_id: int | None, producer: str,
                       messages: Sequence[EncodedMessage]) -> tuple[list[int], list[StoredMessage] | None]:
    """`append_messages`: the new ids and None when `messages` were written; ([], the batch) when the producer had
    already written one, whose contents may differ from `messages`."""
    if not messages:
        raise ValueError("append_messages: nothing to append")
    ids: list[int] = []
    previous = parent_id
    for index, msg in enumerate(messages):
        values = {"rollout_id": rollout_id, "parent_id": previous, "producer": producer, "producer_index": index,
                  "role": msg.role, "body": msg.body, "state": msg.state, "tokens": msg.tokens}
        row = await _one(conn, _APPEND_FIRST if previous is None else _APPEND_AFTER, values)
        if row is None:
            existing = await produced(conn, rollout_id, producer)
            if existing:  # this producer already wrote (a retry, or a concurrent attempt that won): its batch
                return [], existing
            raise LookupError(f"message {previous} is not part of rollout {rollout_id!r}")
        ids.append(row[0])
        previous = row[0]
    return ids, None


# One statement each: the hot path of every turn. The position comes from the parent row, which must belong to
# the rollout; a producer's second write of the same index does nothing.
_APPEND_COLUMNS = "rollout_id, parent_id, producer, producer_index, role, body, state, tokens, position"
_APPEND_VALUES = ("%(rollout_id)s, %(parent_id)s, %(producer)s, %(producer_index)s, %(role)s, %(body)s::jsonb, "
                  "%(state)s::jsonb, %(tokens)s::jsonb")
_APPEND_FIRST = f"""
INSERT INTO messages ({_APPEND_COLUMNS}) VALUES ({_APPEND_VALUES}, 0)
ON CONFLICT ON CONSTRAINT messages_producer_key DO NOTHING RETURNING id
"""
_APPEND_AFTER = f"""
INSERT INTO messages ({_APPEND_COLUMNS})
SELECT {_APPEND_VALUES}, p.position + 1 FROM messages p
WHERE p.id = %(parent_id)s AND p.rollout_id = %(rollout_id)s
ON CONFLICT ON CONSTRAINT messages_producer_key DO NOTHING RETURNING id
"""


def as_stored(ids: Sequence[int], parent: StoredMessage | None, messages: Sequence[EncodedMessage]
              ) -> list[StoredMessage]:
    """The rows `append_batch` just wrote for `messages` after `parent`, as `read_chain` would return them: values
    as JSON stores them (NULs replaced, tuples as lists) and the state's keys in jsonb's order (shorter first),
    which tools that iterate over the state see. Lets a writer keep its chain without reading it back."""
    out: list[StoredMessage] = []
    position = parent.position + 1 if parent is not None else 0
    previous = parent.id if parent is not None else None
    for new_id, msg in zip(ids, messages, strict=True):
        state = None if msg.state is None else _jsonb_order(json.loads(msg.state))
        tokens = None if msg.tokens is None else json.loads(msg.tokens)
        out.append(StoredMessage(new_id, previous, position, msg.role, json.loads(msg.body), state, tokens))
        previous, position = new_id, position + 1
    return out


def _jsonb_order(value: Any) -> Any:
    """Objects with their keys in the order jsonb keeps them: by length in bytes, then bytewise."""
    if isinstance(value, dict):
        return {k: _jsonb_order(value[k]) for k in sorted(value, key=lambda k: (len(k.encode()), k.encode()))}
    if isinstance(value, list):
        return [_jsonb_order(v) for v in value]
    return value


_MESSAGE_COLUMNS = "id, parent_id, position, role, body, state, tokens"


async def produced(conn: Conn, rollout_id: str, producer: str) -> list[StoredMessage]:
    """The batch `producer` appended to the rollout's episode, in order ([] when it has appended nothing)."""
    cur = await conn.execute(f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE rollout_id = %s AND producer = %s "
                             "ORDER BY producer_index", (rollout_id, producer))
    return [StoredMessage(*row) for row in await cur.fetchall()]


_START_AND_PRODUCED = f"""
WITH bump AS (INSERT INTO step_starts (rollout_id, producer, starts) VALUES (%(rollout_id)s, %(producer)s, 1)
              ON CONFLICT (rollout_id, producer) DO UPDATE SET starts = step_starts.starts + 1, updated_at = now()
              RETURNING starts)
SELECT b.starts, {", ".join(f"m.{c.strip()}" for c in _MESSAGE_COLUMNS.split(","))}
FROM bump b LEFT JOIN messages m ON m.rollout_id = %(rollout_id)s AND m.producer = %(producer)s
ORDER BY m.producer_index
"""


async def started_and_produced(conn: Conn, rollout_id: str, producer: str) -> tuple[int, list[StoredMessage]]:
    """Count one more start of the step `producer` and read what it stored so far: (starts, its batch)."""
    rows = await (await conn.execute(_START_AND_PRODUCED, {"producer": producer, "rollout_id": rollout_id})).fetchall()
    return rows[0][0], [StoredMessage(*row[1:]) for row in rows if row[1] is not None]


_CHAIN = f"""
WITH RECURSIVE chain AS (
    SELECT {_MESSAGE_COLUMNS} FROM messages WHERE id = %(head)s
  UNION ALL
    SELECT m.id, m.parent_id, m.position, m.role, m.body, m.state, m.tokens
    FROM messages m JOIN chain c ON m.id = c.parent_id
)
SELECT {_MESSAGE_COLUMNS} FROM chain ORDER BY position
"""


async def read_chain(conn: Conn, head_id: int) -> list[StoredMessage]:
    """The episode up to and including `head_id`, first message first."""
    rows = await (await conn.execute(_CHAIN, {"head": head_id})).fetchall()
    if not rows:
        raise LookupError(f"message {head_id} does not exist")
    return [StoredMessage(*row) for row in rows]


_CHAIN_AFTER = f"""
WITH RECURSIVE chain AS (
    SELECT {_MESSAGE_COLUMNS} FROM messages WHERE id = %(head)s AND id <> %(known)s
  UNION ALL
    SELECT m.id, m.parent_id, m.position, m.role, m.body, m.state, m.tokens
    FROM messages m JOIN chain c ON m.id = c.parent_id WHERE m.id <> %(known)s
)
SELECT {_MESSAGE_COLUMNS} FROM chain ORDER BY position
"""


async def read_chain_after(conn: Conn, head_id: int, known: Sequence[StoredMessage]) -> list[StoredMessage]:
    """`read_chain(head_id)` for a reader that already holds the chain `known`: only the messages appended after
    `known`'s last are read when it is an ancestor of `head_id` (a turn reads what the last turn added, not the
    whole episode again); otherwise (another branch: a reset run) the whole chain is read."""
    if not known:
        return await read_chain(conn, head_id)
    last = known[-1].id
    if head_id == last:
        return list(known)
    cur = await conn.execute(_CHAIN_AFTER, {"head": head_id, "known": last})
    rows = [StoredMessage(*row) for row in await cur.fetchall()]
    if not rows:
        raise LookupError(f"message {head_id} does not exist")
    if rows[0].parent_id == last:
        return [*known, *rows]
    return rows if rows[0].parent_id is None else await read_chain(conn, head_id)


def latest_state(chain: Sequence[StoredMessage]) -> dict[str, Any]:
    """The episode state after the chain: the newest message that recorded one ({} when none did)."""
    for message in reversed(chain):
        if message.state is not None:
            return message.state
    return {}

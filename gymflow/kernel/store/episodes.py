"""Episode data by reference (docs/design-episode-data.md): tasks once per run, messages as an append-only chain.

A workflow holds only a head message id; `read_chain(head)` is exactly the prefix that head extends. Writers
append a batch under a producer key (`<workflow run id>/<activity id>`): the same producer appending again
(a retry, or a zombie attempt racing the new one) gets the batch that was written first, never a second
copy. Rows reachable from no accepted head (a zombie's, a reset run's) are simply not part of any episode.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from gymflow.kernel.store.models import Generation, MessageRow, TaskRow
from gymflow.kernel.store.repo import rollout_upsert, storable
from gymflow.kernel.wire import RolloutRecord, Task, ToolSpec


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


async def load_task(session: AsyncSession, run_id: str, task_id: str) -> Task | None:
    body = await session.scalar(sa.select(TaskRow.body).where(TaskRow.run_id == run_id, TaskRow.task_id == task_id))
    return None if body is None else Task.model_validate(body)


async def save_task_tools(session: AsyncSession, run_id: str, task_id: str, tools: Sequence[ToolSpec]) -> None:
    """Record the tool schemas the task's environment offers (written once; the first writer wins)."""
    await session.execute(sa.update(TaskRow.__table__).where(
        TaskRow.run_id == run_id, TaskRow.task_id == task_id, TaskRow.tools.is_(None)
    ).values(tools=storable([t.model_dump(mode="json") for t in tools])))


async def load_task_tools(session: AsyncSession, run_id: str, task_id: str) -> tuple[ToolSpec, ...] | None:
    """The stored tool schemas, or None when `begin` has not recorded them (a task stored by an older worker)."""
    tools = await session.scalar(sa.select(TaskRow.tools).where(TaskRow.run_id == run_id, TaskRow.task_id == task_id))
    return None if tools is None else tuple(ToolSpec.model_validate(t) for t in tools)


async def append_messages(session: AsyncSession, *, rollout_id: str, parent_id: int | None, producer: str,
                          messages: Sequence[NewMessage]) -> list[int]:
    """Append `messages` after `parent_id` (None: the episode's first) and return their ids, in order.

    Idempotent per (rollout, producer): when the producer already wrote its batch, that batch's ids come back
    and nothing is written. Run it in its own transaction so a conflict is seen, not half-applied. One round trip
    per message: each insert takes its position from its parent's row, which must belong to the rollout."""
    ids, earlier = await append_batch(session, rollout_id=rollout_id, parent_id=parent_id, producer=producer,
                                      messages=messages)
    return ids if earlier is None else [m.id for m in earlier]


async def append_batch(session: AsyncSession, *, rollout_id: str, parent_id: int | None, producer: str,
                       messages: Sequence[NewMessage]) -> tuple[list[int], list[StoredMessage] | None]:
    """`append_messages`: the new ids and None when `messages` were written; ([], the batch) when the producer had
    already written one, whose contents may differ from `messages`."""
    if not messages:
        raise ValueError("append_messages: nothing to append")
    ids: list[int] = []
    previous = parent_id
    for index, msg in enumerate(messages):
        values = {"rollout_id": rollout_id, "parent_id": previous, "producer": producer, "producer_index": index,
                  "role": msg.role, "body": storable(msg.body), "state": storable(msg.state), "tokens": msg.tokens}
        new_id = await session.scalar(_APPEND_FIRST if previous is None else _APPEND_AFTER, values)
        if new_id is None:
            existing = await produced(session, rollout_id, producer)
            if existing:  # this producer already wrote (a retry, or a concurrent attempt that won): its batch
                return [], existing
            raise LookupError(f"message {previous} is not part of rollout {rollout_id!r}")
        ids.append(new_id)
        previous = new_id
    return ids, None


# Plain SQL (one statement each, compiled once): the hot path of every turn. The position comes from the parent
# row, which must belong to the rollout; a producer's second write of the same index does nothing.
_APPEND_COLUMNS = "rollout_id, parent_id, producer, producer_index, role, body, state, tokens, position"
_APPEND_VALUES = ":rollout_id, :parent_id, :producer, :producer_index, :role, :body, :state, :tokens"
_APPEND_TYPES = [sa.bindparam(c, type_=MessageRow.__table__.c[c].type) for c in ("body", "state", "tokens")]
_APPEND_FIRST = sa.text(f"""
INSERT INTO messages ({_APPEND_COLUMNS}) VALUES ({_APPEND_VALUES}, 0)
ON CONFLICT ON CONSTRAINT messages_producer_key DO NOTHING RETURNING id
""").bindparams(*_APPEND_TYPES)
_APPEND_AFTER = sa.text(f"""
INSERT INTO messages ({_APPEND_COLUMNS})
SELECT {_APPEND_VALUES}, p.position + 1 FROM messages p WHERE p.id = :parent_id AND p.rollout_id = :rollout_id
ON CONFLICT ON CONSTRAINT messages_producer_key DO NOTHING RETURNING id
""").bindparams(*_APPEND_TYPES)


def as_stored(ids: Sequence[int], parent: StoredMessage | None, messages: Sequence[NewMessage]
              ) -> list[StoredMessage]:
    """The rows `append_batch` just wrote for `messages` after `parent`, as `read_chain` would return them: values
    as JSON stores them (NULs replaced, tuples as lists) and the state's keys in jsonb's order (shorter first),
    which tools that iterate over the state see. Lets a writer keep its chain without reading it back."""
    out: list[StoredMessage] = []
    position = parent.position + 1 if parent is not None else 0
    previous = parent.id if parent is not None else None
    for new_id, msg in zip(ids, messages, strict=True):
        state = None if msg.state is None else _jsonb_order(json.loads(json.dumps(storable(msg.state))))
        tokens = None if msg.tokens is None else json.loads(json.dumps(msg.tokens))
        out.append(StoredMessage(new_id, previous, position, msg.role, json.loads(json.dumps(storable(msg.body))),
                                 state, tokens))
        previous, position = new_id, position + 1
    return out


def _jsonb_order(value: Any) -> Any:
    """Objects with their keys in the order jsonb keeps them: by length in bytes, then bytewise."""
    if isinstance(value, dict):
        return {k: _jsonb_order(value[k]) for k in sorted(value, key=lambda k: (len(k.encode()), k.encode()))}
    if isinstance(value, list):
        return [_jsonb_order(v) for v in value]
    return value


async def produced(session: AsyncSession, rollout_id: str, producer: str) -> list[StoredMessage]:
    """The batch `producer` appended to the rollout's episode, in order ([] when it has appended nothing)."""
    rows = await session.scalars(sa.select(MessageRow).where(
        MessageRow.rollout_id == rollout_id, MessageRow.producer == producer).order_by(MessageRow.producer_index))
    return [StoredMessage(r.id, r.parent_id, r.position, r.role, r.body, r.state, r.tokens) for r in rows]


_CHAIN = sa.text("""
WITH RECURSIVE chain AS (
    SELECT id, parent_id, position, role, body, state, tokens FROM messages WHERE id = :head
  UNION ALL
    SELECT m.id, m.parent_id, m.position, m.role, m.body, m.state, m.tokens
    FROM messages m JOIN chain c ON m.id = c.parent_id
)
SELECT id, parent_id, position, role, body, state, tokens FROM chain ORDER BY position
""")


async def read_chain(session: AsyncSession, head_id: int) -> list[StoredMessage]:
    """The episode up to and including `head_id`, first message first."""
    rows = (await session.execute(_CHAIN, {"head": head_id})).all()
    if not rows:
        raise LookupError(f"message {head_id} does not exist")
    return [StoredMessage(*row) for row in rows]


_CHAIN_AFTER = sa.text("""
WITH RECURSIVE chain AS (
    SELECT id, parent_id, position, role, body, state, tokens FROM messages WHERE id = :head AND id <> :known
  UNION ALL
    SELECT m.id, m.parent_id, m.position, m.role, m.body, m.state, m.tokens
    FROM messages m JOIN chain c ON m.id = c.parent_id WHERE m.id <> :known
)
SELECT id, parent_id, position, role, body, state, tokens FROM chain ORDER BY position
""")


async def read_chain_after(session: AsyncSession, head_id: int, known: Sequence[StoredMessage]) -> list[StoredMessage]:
    """`read_chain(head_id)` for a reader that already holds the chain `known`: only the messages appended after
    `known`'s last are read when it is an ancestor of `head_id` (a turn reads what the last turn added, not the
    whole episode again); otherwise (another branch: a reset run) the whole chain is read."""
    if not known:
        return await read_chain(session, head_id)
    last = known[-1].id
    if head_id == last:
        return list(known)
    rows = [StoredMessage(*row) for row in (await session.execute(_CHAIN_AFTER, {"head": head_id, "known": last}))]
    if not rows:
        raise LookupError(f"message {head_id} does not exist")
    if rows[0].parent_id == last:
        return [*known, *rows]
    return rows if rows[0].parent_id is None else await read_chain(session, head_id)


def latest_state(chain: Sequence[StoredMessage]) -> dict[str, Any]:
    """The episode state after the chain: the newest message that recorded one ({} when none did)."""
    for message in reversed(chain):
        if message.state is not None:
            return message.state
    return {}


def generation_rows(rollout_id: str, chain: Sequence[StoredMessage]) -> list[dict[str, Any]]:
    """The `generations` rows of the chain's assistant turns, numbered from 0."""
    rows = []
    for m in chain:
        if m.role != "assistant" or m.tokens is None:
            continue
        meta = m.tokens
        usage = meta.get("usage") or {}
        rows.append(dict(
            rollout_id=rollout_id, turn=len(rows), attempt=int(meta.get("attempt") or 1),
            model=str(meta.get("model", "")), finish_reason=meta.get("finish_reason"),
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
            latency_s=meta.get("latency_s"), message=m.body, prompt_token_ids=meta.get("prompt_token_ids"),
            generation_token_ids=meta.get("generation_token_ids"),
            generation_log_probs=meta.get("generation_log_probs"), policy_version=meta.get("policy_version")))
    return rows


async def save_episode(session: AsyncSession, record: RolloutRecord, chain: Sequence[StoredMessage]) -> None:
    """The rollout's row and exactly the accepted chain's `generations` as ONE statement: atomic without a
    transaction, one round trip (a transaction of upsert, delete and insert took five). The chain's turns replace
    earlier runs' rows turn by turn; a stale run's turns past the chain's last go."""
    table = Generation.__table__
    rollout_id = record.summary.rollout_id
    rows = generation_rows(rollout_id, chain)
    stmt = rollout_upsert(record).add_cte(
        sa.delete(table).where(table.c.rollout_id == rollout_id, table.c.turn >= len(rows)).cte("stale"))
    if rows:
        new = insert(table).values(rows)
        kept = ("rollout_id", "turn")
        stmt = stmt.add_cte(new.on_conflict_do_update(
            index_elements=[table.c.rollout_id, table.c.turn],
            set_={c.name: new.excluded[c.name] for c in table.c if c.name not in kept} | {"created_at": sa.func.now()},
        ).cte("turns"))
    await session.execute(stmt)

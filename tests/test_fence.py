"""Fenced persistence (gymflow/kernel/store/fence.py): a stale execution of a rollout never overwrites what a newer
execution wrote, whatever the order or timing of their writes. Against the real Postgres of the test stack."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import psycopg

from gymflow.kernel.store.db import migrate
from gymflow.kernel.store.episodes import NewMessage, append_messages
from gymflow.kernel.store.repo import mark_rollout_started, write_rollout
from gymflow.kernel.wire import RolloutRecord, RolloutSummary

T0 = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


@dataclass(frozen=True)
class _Write:
    """One execution's finish: its row and the one-message chain it produced ('old', 'new', ...)."""

    rid: str
    run: str | None
    started: datetime | None
    reward: float
    text: str


_record = _Write


async def _save(url: str, write: _Write) -> None:
    summary = RolloutSummary(rollout_id=write.rid, run_id=write.rid.split("/")[0], task_id="t", sample_index=0,
                             status="completed", reward=write.reward, turns=1)
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        [head] = await append_messages(conn, rollout_id=write.rid, parent_id=None, producer=f"{write.run}/finish",
                                       messages=[NewMessage("assistant", {"role": "assistant", "content": write.text},
                                                            tokens={"model": "policy", "attempt": 1})])
        await write_rollout(conn, RolloutRecord(summary=summary, env="single_tool", model="policy", head_id=head,
                                                execution_id=write.run, execution_started_at=write.started))


def _row(sql, rid: str) -> tuple:
    return sql("SELECT reward, transcript->0->>'content', execution_id, superseded_executions, "
               "(SELECT message->>'content' FROM generations WHERE rollout_id = %s AND turn = 0) "
               "FROM rollouts WHERE id = %s", rid, rid)[0]


async def test_a_stale_execution_never_overwrites_a_newer_one(stack, sql, run_id):
    migrate(stack.database_url)
    rid = f"{run_id}/t/0"
    old, new = _record(rid, "run-old", T0, 0.0, "old"), _record(rid, "run-new", T0 + timedelta(minutes=5), 1.0, "new")
    await _save(stack.database_url, old)
    await _save(stack.database_url, new)  # the newer execution takes the row
    await _save(stack.database_url, old)  # the old one's late write (a zombie attempt) is refused
    assert _row(sql, rid) == (1.0, "new", "run-new", ["run-old"], "new")
    # Its late "started" mark is refused too: the row stays finished, and the new execution's.
    async with await psycopg.AsyncConnection.connect(stack.database_url, autocommit=True) as conn:
        await mark_rollout_started(conn, rollout_id=rid, run_id=run_id, task_id="t", sample_index=0,
                                   env="single_tool", model="policy", execution_id="run-old", execution_started_at=T0)
    assert sql("SELECT status, execution_id FROM rollouts WHERE id = %s", rid) == [("completed", "run-new")]


async def test_a_reset_run_with_its_originals_start_time_fences_the_original_out(stack, sql, run_id):
    # A reset run may keep the start time of the run it replaces: the superseded list, not the clock, decides.
    migrate(stack.database_url)
    rid = f"{run_id}/t/0"
    await _save(stack.database_url, _record(rid, "run-a", T0, 0.0, "a"))
    await _save(stack.database_url, _record(rid, "run-reset", T0, 1.0, "reset"))
    await _save(stack.database_url, _record(rid, "run-a", T0, 0.5, "a again"))
    assert _row(sql, rid)[:3] == (1.0, "reset", "run-reset")


async def test_a_write_without_execution_never_replaces_an_executions_row(stack, sql, run_id):
    migrate(stack.database_url)
    rid = f"{run_id}/t/0"
    await _save(stack.database_url, _record(rid, "run-a", T0, 1.0, "a"))
    await _save(stack.database_url, _record(rid, None, None, 0.0, "nobody"))
    assert _row(sql, rid)[:3] == (1.0, "a", "run-a")


async def test_two_executions_racing_on_one_rollout_id_leave_the_newer_ones_row(stack, sql, run_id):
    # Many rounds of both writing at once, in both start orders: the row and its generations are always the
    # newer execution's, never a mix.
    migrate(stack.database_url)
    for i in range(40):
        rid = f"{run_id}/race{i}/0"
        old = _record(rid, f"old-{i}", T0, 0.0, "old")
        new = _record(rid, f"new-{i}", T0 + timedelta(seconds=1), 1.0, "new")
        first, second = (old, new) if i % 2 else (new, old)
        await asyncio.gather(_save(stack.database_url, first), _save(stack.database_url, second))
        await _save(stack.database_url, old)  # and the stale one once more, after both
        reward, content, execution, _, generation = _row(sql, rid)
        assert (reward, content, execution, generation) == (1.0, "new", f"new-{i}", "new"), i


async def test_finish_time_comes_from_the_database(stack, sql, run_id):
    migrate(stack.database_url)
    rid = f"{run_id}/t/0"
    await _save(stack.database_url, _record(rid, "run-a", T0, 1.0, "a"))
    ((skew,),) = sql("SELECT abs(extract(epoch FROM finished_at - now())) FROM rollouts WHERE id = %s", rid)
    assert skew < 60

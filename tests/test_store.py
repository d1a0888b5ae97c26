"""Persisting is idempotent: a retried or replayed write never duplicates a row or undoes a finish."""

from __future__ import annotations

from gymflow.kernel.store.db import make_engine, make_sessionmaker
from gymflow.kernel.store.repo import driver, mark_rollout_started, save_rollout
from gymflow.kernel.wire import RolloutRecord, RolloutSummary
from tests.helpers import store_chain  # noqa: E402


async def test_writes_are_idempotent(stack, gf, sql, run_id):
    engine = make_engine(stack.database_url, pool_size=1)
    sessions = make_sessionmaker(engine)
    rid = f"{run_id}/t/0"
    start = dict(rollout_id=rid, run_id=run_id, task_id="t", sample_index=0, env="single_tool", model="policy")
    summary = RolloutSummary(rollout_id=rid, run_id=run_id, task_id="t", sample_index=0, status="completed",
                             reward=1.0, turns=1)
    try:
        for _ in range(2):  # a retried activity runs its write again
            async with sessions.begin() as s:
                await mark_rollout_started(await driver(s), **start)
            async with sessions.begin() as s:  # the same producer again: its first batch, not a second
                head = await store_chain(s, rid, [{"role": "user", "content": "hi"},
                                                  {"role": "assistant", "content": "hello"}], [{}])
            async with sessions.begin() as s:
                await save_rollout(s, RolloutRecord(summary=summary, env="single_tool", model="policy", head_id=head))
        async with sessions.begin() as s:  # a late, replayed setup must not turn a finished rollout back
            await mark_rollout_started(await driver(s), **start)
    finally:
        await engine.dispose()
    assert sql("SELECT status, reward FROM rollouts WHERE run_id = %s", run_id) == [("completed", 1.0)]
    assert sql("SELECT count(*) FROM generations WHERE rollout_id = %s", rid) == [(1,)]
    assert sql("SELECT count(*) FROM messages WHERE rollout_id = %s", rid) == [(2,)]
    assert sql("SELECT transcript->1->>'content' FROM rollouts WHERE id = %s", rid) == [("hello",)]

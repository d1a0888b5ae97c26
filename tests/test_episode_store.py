"""The episode store (gymflow/kernel/store/episodes.py) on real Postgres: chains, lineage, idempotent producers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from sqlalchemy.ext.asyncio import async_sessionmaker

from gymflow.kernel.store.db import make_engine, make_sessionmaker, migrate
from gymflow.kernel.store.episodes import NewMessage, append_messages, latest_state, load_task, read_chain, save_tasks
from gymflow.kernel.store.repo import driver
from tests.helpers import user_task


@pytest_asyncio.fixture(loop_scope="session")
async def sessions(stack) -> AsyncIterator[async_sessionmaker]:
    await asyncio.to_thread(migrate, stack.database_url)
    engine = make_engine(stack.database_url, pool_size=4)
    yield make_sessionmaker(engine)
    await engine.dispose()


def _msg(role: str, text: str, **kw) -> NewMessage:
    return NewMessage(role=role, body={"role": role, "content": text}, **kw)


async def _append(sessions, rid: str, parent: int | None, producer: str, *msgs: NewMessage) -> list[int]:
    async with sessions.begin() as s:
        return await append_messages(await driver(s), rollout_id=rid, parent_id=parent, producer=producer,
                                     messages=msgs)


async def _chain(sessions, head: int) -> list[str]:
    async with sessions() as s:
        return [m.body["content"] for m in await read_chain(await driver(s), head)]


async def test_a_head_names_exactly_its_prefix(sessions, run_id):
    rid = f"{run_id}/t/0"
    system, user = await _append(sessions, rid, None, "run1/1", _msg("system", "sys"), _msg("user", "q"))
    (a1,) = await _append(sessions, rid, user, "run1/2", _msg("assistant", "call"))
    (t1,) = await _append(sessions, rid, a1, "run1/3", _msg("tool", "out", state={"n": 1}))
    (a2,) = await _append(sessions, rid, t1, "run1/4", _msg("assistant", "done"))
    assert await _chain(sessions, a2) == ["sys", "q", "call", "out", "done"]
    assert await _chain(sessions, a1) == ["sys", "q", "call"]
    async with sessions() as s:
        chain = await read_chain(await driver(s), a2)
    assert [m.position for m in chain] == [0, 1, 2, 3, 4]
    assert latest_state(chain) == {"n": 1}
    assert latest_state(chain[:2]) == {}


async def test_a_retried_producer_gets_its_first_batch_not_a_second(sessions, run_id):
    rid = f"{run_id}/t/0"
    (root,) = await _append(sessions, rid, None, "run1/1", _msg("user", "q"))
    first = await _append(sessions, rid, root, "run1/2", _msg("assistant", "first answer"))
    again = await _append(sessions, rid, root, "run1/2", _msg("assistant", "a retry's different answer"))
    assert again == first
    assert await _chain(sessions, first[0]) == ["q", "first answer"]


async def test_racing_attempts_of_one_producer_agree(sessions, run_id):
    # A zombie attempt and its replacement write at once: exactly one batch survives and both see it.
    rid = f"{run_id}/t/0"
    (root,) = await _append(sessions, rid, None, "run1/1", _msg("user", "q"))
    results = await asyncio.gather(*(
        _append(sessions, rid, root, "run1/2", _msg("assistant", f"attempt {i}"), _msg("tool", f"t{i}"))
        for i in range(6)))
    assert all(r == results[0] for r in results)
    assert len(results[0]) == 2


async def test_lineage_cannot_mix_runs(sessions, run_id):
    # A reset or --retry-failed run writes under its own producer keys: its chain never includes the old turns.
    rid = f"{run_id}/t/0"
    (root,) = await _append(sessions, rid, None, "run1/1", _msg("user", "q"))
    (stale,) = await _append(sessions, rid, root, "run1/2", _msg("assistant", "stale turn of the failed run"))
    (fresh,) = await _append(sessions, rid, root, "run2/2", _msg("assistant", "the accepted turn"))
    assert await _chain(sessions, fresh) == ["q", "the accepted turn"]
    assert await _chain(sessions, stale) == ["q", "stale turn of the failed run"]


async def test_a_parent_from_another_rollout_is_refused(sessions, run_id):
    (other,) = await _append(sessions, f"{run_id}/a/0", None, "p/1", _msg("user", "q"))
    with pytest.raises(LookupError, match="not part of rollout"):
        await _append(sessions, f"{run_id}/b/0", other, "p/2", _msg("assistant", "x"))


async def test_nul_bytes_are_stored_and_long_chains_read_back(sessions, run_id):
    rid = f"{run_id}/t/0"
    (head,) = await _append(sessions, rid, None, "p/0", _msg("user", "nul\x00here"))
    for turn in range(1, 200):
        (head,) = await _append(sessions, rid, head, f"p/{turn}", _msg("assistant", f"turn {turn}"))
    chain = await _chain(sessions, head)
    assert len(chain) == 200 and chain[0] == "nul\ufffdhere" and chain[-1] == "turn 199"


async def test_tasks_are_stored_once_per_run(sessions, run_id):
    task = user_task("what is 2+2?", task_id="t1")
    async with sessions.begin() as s:
        await save_tasks(s, run_id, [task])
    async with sessions.begin() as s:  # collecting the run again changes nothing
        await save_tasks(s, run_id, [task.model_copy(update={"env": "other"})])
    async with sessions() as s:
        assert await load_task(await driver(s), run_id, "t1") == task
        assert await load_task(await driver(s), run_id, "missing") is None

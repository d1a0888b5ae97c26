"""Each message is stored once (migration 0008): a rollout's transcript and `generations` are read from its
accepted chain; rows stored before 0008 keep what they had; a downgrade materialises the views back into tables.
Against a fresh database of the test stack's real Postgres."""

from __future__ import annotations

import json
from collections.abc import Iterator

import psycopg
import pytest
import sqlalchemy as sa
from alembic import command
from alembic.config import Config

from gymflow.kernel.store.db import MIGRATIONS, sqlalchemy_url
from gymflow.kernel.store.episodes import NewMessage, append_messages
from gymflow.kernel.store.repo import write_rollout
from gymflow.kernel.wire import RolloutRecord, RolloutSummary


@pytest.fixture
def fresh_db(stack, run_id) -> Iterator[str]:
    name = "mig_" + run_id.replace("-", "_")[:40].lower()
    with psycopg.connect(stack.database_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = sa.engine.make_url(stack.database_url).set(database=name).render_as_string(hide_password=False)
    yield url
    with psycopg.connect(stack.database_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def _alembic(url: str, target: str, down: bool = False) -> None:
    engine = sa.create_engine(sqlalchemy_url(url), poolclass=sa.pool.NullPool)
    try:
        with engine.begin() as conn:
            cfg = Config()
            cfg.set_main_option("script_location", str(MIGRATIONS))
            cfg.attributes["connection"] = conn
            (command.downgrade if down else command.upgrade)(cfg, target)
    finally:
        engine.dispose()


def _sql(url: str, query: str, *params: object) -> list[tuple]:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(query, params)
        return cur.fetchall() if cur.description else []


LEGACY_TRANSCRIPT = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]


async def test_the_chain_is_the_only_copy_and_old_rows_keep_theirs(fresh_db):
    url = fresh_db
    _alembic(url, "0007")
    _sql(url, "INSERT INTO rollouts (id, run_id, task_id, sample_index, env, model, status, reward, turns, "
              "transcript) VALUES ('old/t/0', 'old', 't', 0, 'math', 'policy', 'completed', 1.0, 1, %s::jsonb)",
         json.dumps(LEGACY_TRANSCRIPT))
    _sql(url, "INSERT INTO generations (rollout_id, turn, attempt, model, message, generation_token_ids) "
              "VALUES ('old/t/0', 0, 1, 'policy', %s::jsonb, '[4]'::jsonb)", json.dumps(LEGACY_TRANSCRIPT[1]))
    _alembic(url, "head")

    # Before 0008: read as stored.
    assert _sql(url, "SELECT transcript FROM rollouts WHERE id = 'old/t/0'") == [(LEGACY_TRANSCRIPT,)]
    assert _sql(url, "SELECT turn, generation_token_ids FROM generations WHERE rollout_id = 'old/t/0'") == [(0, [4])]

    # From 0008: the episode's messages once, in `messages`; the rollout row names the head.
    rid = "new/t/0"
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        first = await append_messages(conn, rollout_id=rid, parent_id=None, producer="run/begin", messages=[
            NewMessage("user", {"role": "user", "content": "3+3?"})])
        turn0 = await append_messages(conn, rollout_id=rid, parent_id=first[-1], producer="run/gen0", messages=[
            NewMessage("assistant", {"role": "assistant", "content": "5"},
                       tokens={"attempt": 2, "model": "policy", "generation_token_ids": [5],
                               "usage": {"prompt_tokens": 3, "completion_tokens": 1}, "policy_version": "v1"})])
        # A zombie attempt's branch off the same parent: stored, but part of no accepted chain.
        await append_messages(conn, rollout_id=rid, parent_id=first[-1], producer="zombie/gen0", messages=[
            NewMessage("assistant", {"role": "assistant", "content": "zombie"}, tokens={"model": "policy"})])
        tool = await append_messages(conn, rollout_id=rid, parent_id=turn0[-1], producer="run/tools", messages=[
            NewMessage("tool", {"role": "tool", "content": "no", "tool_call_id": "c"})])
        turn1 = await append_messages(conn, rollout_id=rid, parent_id=tool[-1], producer="run/gen1", messages=[
            NewMessage("assistant", {"role": "assistant", "content": "6"},
                       tokens={"model": "policy", "generation_token_ids": [6, 7], "generation_log_probs": [-1, -2]})])
        summary = RolloutSummary(rollout_id=rid, run_id="new", task_id="t", sample_index=0, status="completed",
                                 reward=1.0, turns=2)
        await write_rollout(conn, RolloutRecord(summary=summary, env="math", model="policy", head_id=turn1[-1]))

    assert _sql(url, "SELECT transcript FROM rollouts WHERE id = %s", rid) == [([
        {"role": "user", "content": "3+3?"}, {"role": "assistant", "content": "5"},
        {"role": "tool", "content": "no", "tool_call_id": "c"}, {"role": "assistant", "content": "6"}],)]
    assert _sql(url, "SELECT turn, attempt, prompt_tokens, completion_tokens, generation_token_ids, "
                     "generation_log_probs, policy_version, message->>'content' FROM generations "
                     "WHERE rollout_id = %s ORDER BY turn", rid) == [
        (0, 2, 3, 1, [5], None, "v1", "5"), (1, 1, 0, 0, [6, 7], [-1, -2], None, "6")]
    # Stored once: the assistant text is in `messages` and nowhere else.
    assert _sql(url, "SELECT count(*) FROM rollout_rows WHERE transcript_before_0008 IS NOT NULL") == [(1,)]
    assert _sql(url, "SELECT count(*) FROM generations_before_0008") == [(1,)]

    # A rollout row written again from 0008 on drops what it stored before (its chain is the transcript now).
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        summary = RolloutSummary(rollout_id="old/t/0", run_id="old", task_id="t", sample_index=0, status="failed",
                                 failure_type="model_unavailable", turns=0)
        await write_rollout(conn, RolloutRecord(summary=summary, env="math", model="policy"))
    assert _sql(url, "SELECT transcript FROM rollouts WHERE id = 'old/t/0'") == [([],)]
    assert _sql(url, "SELECT count(*) FROM generations WHERE rollout_id = 'old/t/0'") == [(0,)]

    # Downgrading puts tables back with what the views showed.
    _alembic(url, "0007", down=True)
    assert _sql(url, "SELECT jsonb_array_length(transcript) FROM rollouts WHERE id = %s", rid) == [(4,)]
    assert _sql(url, "SELECT turn, generation_token_ids FROM generations WHERE rollout_id = %s ORDER BY turn",
                rid) == [(0, [5]), (1, [6, 7])]


def test_reading_one_rollouts_turns_walks_only_its_chain(fresh_db):
    """The `generations` view is filtered by rollout before any chain is walked (no scan of every episode)."""
    _alembic(fresh_db, "head")
    plan = "\n".join(r[0] for r in _sql(fresh_db, "EXPLAIN SELECT * FROM generations WHERE rollout_id = 'x'"))
    assert "Index Scan using rollouts_pkey on rollout_rows" in plan, plan
    assert "Seq Scan on rollout_rows" not in plan, plan

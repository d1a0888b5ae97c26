"""The store never costs a model call or a reward: writes ride out a database blip inside the activity, NUL bytes
are stored, and env activities heartbeat so a dead env worker is noticed quickly."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy.exc as sa_exc
from temporalio.testing import ActivityEnvironment

from gymflow.kernel.store.db import make_engine, make_sessionmaker, migrate
from gymflow.kernel.store.repo import REPLACEMENT, driver, mark_rollout_started
from gymflow.kernel.wire import (
    ChatMessage,
    GenerateRequest,
    RolloutLimits,
)
from gymflow.testing.scripted_openai import text, tool_call
from tests.faulty_env import faulty_env, faulty_task  # noqa: F401 - faulty_env is a fixture
from tests.helpers import user_task

RUN_ID = "store-" + uuid.uuid4().hex[:8]


class FlakySessions:
    """A sessionmaker whose first `failures` transactions fail as a lost connection does."""

    def __init__(self, real: Any, failures: int) -> None:
        self.real, self.failures, self.calls = real, failures, 0

    def __call__(self) -> Any:  # reads (the policy version before the call) are not what these tests break
        return self.real()

    @asynccontextmanager
    async def begin(self):  # noqa: ANN201
        self.calls += 1
        if self.calls <= self.failures:
            raise sa_exc.OperationalError("INSERT INTO generations ...", {}, OSError(
                "connection to server at \"127.0.0.1\" failed: Connection refused\n\tIs the server running?"))
        async with self.real.begin() as session:
            yield session


@pytest.fixture
async def real_sessions(stack):  # noqa: ANN201
    await asyncio.to_thread(migrate, stack.database_url)
    engine = make_engine(stack.database_url, pool_size=2)
    yield make_sessionmaker(engine)
    await engine.dispose()


def _activity_env(heartbeats: list) -> ActivityEnvironment:
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, heartbeat_timeout=timedelta(seconds=1),
                                   start_to_close_timeout=timedelta(seconds=30), started_time=datetime.now(UTC))
    env.on_heartbeat = lambda *details: heartbeats.append(details)
    return env


def _gen_request(task_id: str) -> GenerateRequest:
    return GenerateRequest(rollout_id=f"{RUN_ID}/{task_id}/0", task_id=task_id, turn=0, model="policy",
                           messages=(ChatMessage(role="user", content="hi"),))


async def test_nul_in_a_model_answer_is_stored(gf, scripted, sql):
    scripted.script(text("before\x00after"))
    inp = gf.make_input(RUN_ID, user_task("hi", task_id="nul-answer"), 0, "policy")
    summary = await gf.run_rollout(inp)
    assert summary.status == "completed"
    ((transcript, status),) = sql("SELECT transcript, status FROM rollouts WHERE id = %s", inp.rollout_id)
    assert status == "completed"
    assert transcript[-1]["content"] == f"before{REPLACEMENT}after"
    assert sql("SELECT message->>'content' FROM generations WHERE rollout_id = %s", inp.rollout_id) == [
        (f"before{REPLACEMENT}after",)]


async def test_nul_in_tool_output_and_arguments_is_stored(gf, scripted, sql, faulty_env):  # noqa: F811
    scripted.script(tool_call("echo", {"text": "out\x00put"}), text("done"))
    inp = gf.make_input(RUN_ID, faulty_task("nul-tool"), 0, "policy")
    summary = await gf.run_rollout(inp)
    assert summary.status == "completed" and summary.reward == 1.0
    # Postgres text holds no NUL: the row holds the replacement character, and (by reference) the model was
    # sent the episode as stored, so what it saw and what the trainer reads are the same.
    ((transcript,),) = sql("SELECT transcript FROM rollouts WHERE id = %s", inp.rollout_id)
    assert transcript[-2]["content"] == f"out{REPLACEMENT}put"
    assert scripted.requests[1].body["messages"][-1]["content"] == transcript[-2]["content"]


async def test_nul_in_ids_is_stored(real_sessions, sql):
    rid = f"{RUN_ID}/nul\x00id/0"
    async with real_sessions.begin() as session:
        await mark_rollout_started(await driver(session), rollout_id=rid, run_id=RUN_ID, task_id="nul\x00id",
                                   sample_index=0, env="single_tool", model="po\x00licy")
    assert sql("SELECT task_id, model FROM rollouts WHERE id = %s", rid.replace("\x00", REPLACEMENT)) == [
        (f"nul{REPLACEMENT}id", f"po{REPLACEMENT}licy")]


# -- env heartbeats ----------------------------------------------------------------------------------------

def test_env_activities_have_a_heartbeat_timeout_by_default():
    hb = RolloutLimits().env.heartbeat_s
    assert hb is not None and hb <= 30


async def test_slow_tool_and_verify_heartbeat(gf, scripted, sql, faulty_env):  # noqa: F811
    # A 1 s heartbeat timeout and 1.6 s of tool and verify: without heartbeats both time out on every attempt.
    scripted.script(tool_call("sleep", {}), text("done"))
    inp = gf.make_input(RUN_ID, faulty_task("slow-env", slow_s=1.6), 0, "policy")
    env_limits = inp.limits.env.model_copy(update={"heartbeat_s": 1, "max_attempts": 1})
    inp = inp.model_copy(update={"limits": inp.limits.model_copy(update={"env": env_limits})})
    summary = await gf.run_rollout(inp)
    assert summary.status == "completed", (summary.failure_type, summary.failure_message)
    assert sql("SELECT status FROM rollouts WHERE id = %s", inp.rollout_id) == [("completed",)]
    # The latency counts the slow verification too (the tool's 1.6 s and the verifier's 1.6 s).
    ((latency,),) = sql("SELECT latency_s FROM rollouts WHERE id = %s", inp.rollout_id)
    assert summary.latency_s >= 3.2 and latency >= 3.2, (summary.latency_s, latency)

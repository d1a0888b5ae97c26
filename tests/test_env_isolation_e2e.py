"""Through the real stack (Temporal, Postgres, the test's workflow and env pools, which share this process's event
loop): a tool call that blocks forever (sync code in an async tool) costs its rollout one typed tool error, and a
rollout running beside it completes meanwhile. Before the supervised processes, that call held the workers' event
loop, and every rollout on it stopped (tests/test_env_isolation.py tests the processes themselves)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from gymflow.kernel.config import Settings
from gymflow.testing.scripted_openai import text, tool_call
from tests.helpers import weather_task
from tests.hostile_env import NAME, hostile_env, hostile_task  # noqa: F401 - hostile_env: a fixture

LIMIT_S = 8  # the rollout beside it runs the full stack on a loaded 2-core CI box: seconds


@pytest.fixture
def short_tool_limit(settings: Settings, hostile_env: str) -> Iterator[None]:  # noqa: F811
    # The workers read these options per call (the same dict the session's settings hold).
    settings.environments[NAME] = {"tool_timeout_s": LIMIT_S}
    yield
    settings.environments.pop(NAME, None)


async def test_a_blocking_tool_fails_its_call_typed_and_stops_no_other_rollout(gf, scripted, sql, run_id,
                                                                              short_tool_limit):
    # The hostile rollout takes the first reply (a blocking sleep, as careless sync tool code does: it would hold
    # an event loop; it does not eat a core, so the test stays fair on a loaded box); the weather rollout the next
    # two; then "done".
    scripted.script(tool_call("sleep", {}), tool_call("get_weather", {"city": "SF"}), text("cold"), text("done"))
    hostile = gf.make_input(run_id, hostile_task("spinner"), 0, "policy")
    started = time.monotonic()
    spinning = asyncio.ensure_future(gf.run_rollout(hostile))
    while not scripted.requests:  # the hostile rollout has asked the model: its spin is next
        await asyncio.sleep(0.02)
    weather = gf.make_input(run_id, weather_task(), 0, "policy")
    beside = await gf.run_rollout(weather)
    beside_s = time.monotonic() - started
    assert beside.status == "completed" and beside.reward == 1.0
    assert not spinning.done() and beside_s < LIMIT_S, "the other rollout did not finish while the tool blocked"

    summary = await spinning
    assert summary.status == "completed" and summary.failure_type is None, summary
    (transcript,) = sql("SELECT transcript FROM rollouts WHERE id = %s", hostile.rollout_id)[0]
    told = [m["content"] for m in transcript if m["role"] == "tool"]
    assert told == [f"Error: tool call exceeded its {LIMIT_S} s limit"]
    assert transcript[-1]["role"] == "assistant" and transcript[-1]["content"] == "done"

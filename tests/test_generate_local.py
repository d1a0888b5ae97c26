"""Generation placed "local" (models.<name>.placement, the default): the workflow pool calls the model itself, as
a local activity, so a whole episode can be one workflow task.

Through the real stack (Temporal dev server, Postgres, the scripted OpenAI-compatible server): the episode is
the same as with the generate pool, its history holds markers instead of activity tasks, the latency is measured
by the clock, failures are typed, and a generate re-run after its workflow task was lost (the worker died before
recording the result) answers from Postgres instead of calling the model again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest_asyncio
from gymflow.activities.episode import EpisodeActivities
from gymflow.activities.model_client import ModelClients
from temporalio.api.enums.v1 import EventType
from temporalio.testing import ActivityEnvironment

from gymflow.client import GymflowClient
from gymflow.kernel import names
from gymflow.kernel.config import Settings
from gymflow.kernel.episode_wire import BeginRequest, TurnRequest
from gymflow.kernel.wire import SamplingParams
from gymflow.testing.scripted_openai import context_length_error, http_error, text, tool_call
from tests.faulty_env import faulty_env, faulty_task  # noqa: F401 - faulty_env is a fixture
from tests.helpers import record_episode_histories, weather_task


@pytest_asyncio.fixture(loop_scope="session")
async def local_gen(gf: GymflowClient, settings: Settings) -> AsyncIterator[GymflowClient]:
    """The client: its episodes generate in the workflow pool (model `policy` keeps the default placement)."""
    assert settings.models["policy"].placement == "local"
    yield gf


async def _event_types(client: GymflowClient, rollout_id: str) -> list[int]:
    history = await client.temporal.get_workflow_handle(rollout_id).fetch_history()
    return [e.event_type for e in history.events]


async def _local_activities(client: GymflowClient, rollout_id: str) -> list[str]:
    """The activity types of the rollout's local activity markers, in order."""
    history = await client.temporal.get_workflow_handle(rollout_id).fetch_history()
    return [json.loads(e.marker_recorded_event_attributes.details["data"].payloads[0].data)["activity_type"]
            for e in history.events if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
            and e.marker_recorded_event_attributes.marker_name == "core_local_activity"]


async def test_a_local_episode_is_one_workflow_task_with_the_same_data(local_gen, scripted, sql, run_id):
    scripted.script(tool_call("get_weather", {"city": "SF"}, logprobs=True, delay_s=0.3),
                    text("cold", logprobs=True, delay_s=0.3))
    inp = local_gen.make_input(run_id, weather_task(), 0, "policy")
    summary = await local_gen.run_rollout(inp)
    assert summary.status == "completed" and summary.reward == 1.0
    assert (summary.turns, summary.tool_calls) == (2, 1)
    # workflow time stands still within a workflow task: the latency must come from the clock
    assert summary.latency_s >= 0.6
    (latency,) = sql("SELECT latency_s FROM rollouts WHERE id = %s", inp.rollout_id)[0]
    assert latency >= 0.6

    events = await _event_types(local_gen, inp.rollout_id)
    assert EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED not in events  # no queue hop
    assert events.count(EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED) == 1
    # the environment is local too: each turn (generate, then the tools it called) is one local activity; the
    # first also begins the episode and the last verifies and persists it
    assert await _local_activities(local_gen, inp.rollout_id) == [names.EPISODE_TURN, names.EPISODE_TURN]

    (transcript,) = sql("SELECT transcript FROM rollouts WHERE id = %s", inp.rollout_id)[0]
    assert [m["role"] for m in transcript] == ["system", "user", "assistant", "tool", "assistant"]
    assert [m["role"] for m in scripted.requests[-1].body["messages"]] == ["system", "user", "assistant", "tool"]
    assert sql("SELECT turn, jsonb_array_length(generation_log_probs) FROM generations WHERE rollout_id = %s "
               "ORDER BY turn", inp.rollout_id) == [(0, 1), (1, 1)]
    # the API key reached the model (the workflow pool holds the model clients now) and no history
    headers = {k.lower(): v for k, v in scripted.requests[-1].headers.items()}
    assert headers.get("authorization", "").startswith("Bearer ")
    assert headers.get("x-gymflow-rollout") == inp.rollout_id  # create()'s extra_headers, sent by client.post


async def test_local_generation_retries_bounded_and_fails_typed(local_gen, scripted, sql, run_id):
    scripted.script(http_error(500, "boom"), tool_call("get_weather", {"city": "SF"}), text("cold"))
    inp = local_gen.make_input(run_id, weather_task(), 0, "policy")
    summary = await local_gen.run_rollout(inp)
    assert summary.status == "completed" and summary.attempts == 3
    assert sql("SELECT turn, attempt FROM generations WHERE rollout_id = %s ORDER BY turn", inp.rollout_id) == [
        (0, 2), (1, 1)]

    scripted.script(tool_call("get_weather", {"city": "SF"}), context_length_error())
    inp = local_gen.make_input(run_id, weather_task("w1"), 0, "policy")
    failed = await local_gen.run_rollout(inp)
    assert failed.status == "failed" and failed.failure_type == "context_length_exceeded"
    assert failed.reward is None
    (transcript,) = sql("SELECT transcript FROM rollouts WHERE id = %s", inp.rollout_id)[0]
    assert [m["role"] for m in transcript] == ["system", "user", "assistant", "tool"]


async def _cancel_during_second_call(client: GymflowClient, scripted, inp):  # noqa: ANN001, ANN202
    """Start the rollout and cancel it once its second model call is in flight."""
    handle, _ = await client.start_rollout(inp)
    for _ in range(200):
        if len(scripted.requests) >= 2:
            break
        await asyncio.sleep(0.05)
    assert len(scripted.requests) == 2
    await handle.cancel()
    return handle


async def test_a_cancel_in_the_last_workflow_task_keeps_the_completed_record(local_gen, scripted, sql, run_id):
    # All local, the episode is one workflow task: the cancel is seen only when it completes, after the last turn
    # persisted the episode. Temporal refuses that completion (a new event arrived) and the replay knows no turns;
    # the completed, verified record must survive it, not be replaced by a transcript-less cancellation.
    scripted.script(tool_call("get_weather", {"city": "SF"}), text("cold", delay_s=3))
    inp = local_gen.make_input(run_id, weather_task(), 0, "policy")
    handle = await _cancel_during_second_call(local_gen, scripted, inp)
    summary = await local_gen.result(handle, inp)
    assert (summary.status, summary.reward, summary.turns, summary.tool_calls) == ("completed", 1.0, 2, 1)
    (status, reward, transcript), = sql("SELECT status, reward, transcript FROM rollouts WHERE id = %s",
                                        inp.rollout_id)
    assert (status, reward) == ("completed", 1.0)
    assert [m["role"] for m in transcript] == ["system", "user", "assistant", "tool", "assistant"]
    assert (await handle.describe()).status.name == "CANCELED"  # Temporal's own record of the request


async def test_a_local_episode_cancelled_mid_episode_keeps_its_transcript(local_gen, scripted, sql, run_id,
                                                                        monkeypatch):
    # The cancel reaches a workflow whose turns run as local activities at its workflow task's heartbeat (80% of
    # the task timeout: 10 s by default, 3 s here); the running turn is then cancelled, and the turns before it
    # are recorded.
    start_workflow = local_gen.temporal.start_workflow

    def with_short_task_timeout(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202 - a pass-through
        return start_workflow(*args, **kwargs, task_timeout=timedelta(seconds=3))

    monkeypatch.setattr(local_gen.temporal, "start_workflow", with_short_task_timeout)
    scripted.script(tool_call("get_weather", {"city": "SF"}), text("too late", delay_s=15))
    inp = local_gen.make_input(run_id, weather_task(), 0, "policy")
    handle = await _cancel_during_second_call(local_gen, scripted, inp)
    summary = await asyncio.wait_for(local_gen.result(handle, inp), timeout=8)  # long before the slow reply
    assert summary.status == "failed" and summary.failure_type == "workflow_cancelled"
    assert (summary.turns, summary.tool_calls) == (1, 1)
    (status, failure_type, transcript), = sql(
        "SELECT status, failure_type, transcript FROM rollouts WHERE id = %s", inp.rollout_id)
    assert (status, failure_type) == ("failed", "workflow_cancelled")
    assert [m["role"] for m in transcript] == ["system", "user", "assistant", "tool"]


async def test_a_tool_failing_inside_a_turn_keeps_the_reply(settings, scripted, sql, run_id, faulty_env):  # noqa: F811
    envs = {**settings.environments, faulty_env: {"placement": "local"}}
    client = await GymflowClient.connect(settings.model_copy(update={"environments": envs}))
    try:
        scripted.script(tool_call("echo", {"text": "hi"}), tool_call("boom", {}))
        inp = client.make_input(run_id, faulty_task("boom-in-turn"), 0, "policy")
        failed = await client.run_rollout(inp)
    finally:
        await client.close()
    assert failed.status == "failed" and failed.failure_type == "environment_error"
    assert (failed.turns, failed.tool_calls) == (2, 1)  # the second turn's reply counts; its call did not run
    (transcript,) = sql("SELECT transcript FROM rollouts WHERE id = %s", inp.rollout_id)[0]
    assert [m["role"] for m in transcript] == ["user", "assistant", "tool", "assistant"]
    assert transcript[-1]["tool_calls"][0]["function"]["name"] == "boom"
    assert len(scripted.requests) == 2  # the retried turn found its reply stored: no second call for it


def _local(env: ActivityEnvironment, activity_id: str, activity_type: str) -> ActivityEnvironment:
    """The activity context of local activity `activity_id` of one workflow run (attempt 1, as after a lost
    workflow task: a local activity then starts over at attempt 1)."""
    env.info = dataclasses.replace(env.info, is_local=True, attempt=1, workflow_run_id="run-a",
                                   activity_id=activity_id, activity_type=activity_type)
    return env


async def test_a_local_generate_rerun_answers_from_postgres(gf, scripted, settings, stack, run_id):
    task = weather_task()
    await gf.store_tasks(run_id, [task])
    models = ModelClients(settings.models)
    made: list[EpisodeActivities] = []

    def worker() -> EpisodeActivities:
        made.append(EpisodeActivities(stack.database_url, models, settings.environments))
        return made[-1]

    try:
        first = worker()
        rid = f"{run_id}/{task.id}/0"
        head = await _local(ActivityEnvironment(), "1", names.EPISODE_BEGIN).run(
            first.begin, BeginRequest(rollout_id=rid, run_id=run_id, task_id=task.id, sample_index=0,
                                      model="policy"))
        turn = TurnRequest(rollout_id=rid, run_id=run_id, task_id=task.id, model="policy", turn=0, head_id=head,
                           sampling=SamplingParams())
        scripted.script(tool_call("get_weather", {"city": "SF"}), text("a second, different answer"),
                        text("a third"))
        generated = await _local(ActivityEnvironment(), "2", names.EPISODE_GENERATE).run(first.generate, turn)
        assert generated.tool_calls == 1 and len(scripted.requests) == 1

        # The worker died before its workflow task recorded the result; the task is retried on another worker
        # (no cache) and on this one (its cache is past the head): neither calls the model again.
        for other in (worker(), first):
            again = await _local(ActivityEnvironment(), "2", names.EPISODE_GENERATE).run(other.generate, turn)
            assert (again.head_id, again.tool_calls) == (generated.head_id, 1)
        assert len(scripted.requests) == 1

        # A worker that holds the episode exactly up to the head calls the model (it cannot know another worker
        # ran this generate), but the reply stored first is the episode's: same head, same tool call.
        stale = worker()
        await stale._chain(rid, head)  # noqa: SLF001 - prime its cache at the head
        raced = await _local(ActivityEnvironment(), "2", names.EPISODE_GENERATE).run(stale.generate, turn)
        assert len(scripted.requests) == 2
        assert (raced.head_id, raced.tool_calls) == (generated.head_id, 1)
    finally:
        for made_here in made:
            await made_here.close()
        await models.close()


async def test_local_episode_histories_replay(local_gen, scripted, run_id):
    """Episodes with every step local (begin and finish folded into the turns): each history replays through
    the SDK's strict sandbox."""
    scripted.script(tool_call("get_weather", {"city": "SF"}), text("cold"),  # single tool
                    tool_call("get_weather", {"city": "SF"}), context_length_error(),  # fails in turn 2
                    tool_call("get_weather", {"city": "A"}), tool_call("get_weather", {"city": "B"}), text("ok"))
    await record_episode_histories(local_gen, run_id, {
        "folded_turns_single_tool": {}, "folded_turns_context_length_failure": {},
        "folded_turns_continue_as_new": {"turns_per_run": 1}})


async def test_a_step_whose_worker_keeps_dying_ends_typed(gf, scripted, settings, stack, run_id):
    # A local step re-run again and again on workers that never ran it (each time its workflow task was lost: the
    # worker died) ends as worker_lost after MAX_STEP_STARTS, instead of moving on to the next worker forever.
    from gymflow.activities.episode_store import MAX_STEP_STARTS
    from temporalio.exceptions import ApplicationError

    task = weather_task()
    await gf.store_tasks(run_id, [task])
    models = ModelClients(settings.models)
    rid = f"{run_id}/{task.id}/0"
    made: list[EpisodeActivities] = []
    try:
        first = EpisodeActivities(stack.database_url, models, settings.environments)
        made.append(first)
        head = await _local(ActivityEnvironment(), "1", names.EPISODE_BEGIN).run(
            first.begin, BeginRequest(rollout_id=rid, run_id=run_id, task_id=task.id, sample_index=0, model="policy"))
        turn = TurnRequest(rollout_id=rid, run_id=run_id, task_id=task.id, model="policy", turn=0, head_id=head,
                           sampling=SamplingParams())
        scripted.script(text("the answer"))
        for _ in range(MAX_STEP_STARTS):  # a fresh worker each time: no cache, so each start is counted
            made.append(EpisodeActivities(stack.database_url, models, settings.environments))
            await _local(ActivityEnvironment(), "2", names.EPISODE_GENERATE).run(made[-1].generate, turn)
        assert len(scripted.requests) == 1  # the first start called the model; the re-runs answered from Postgres
        made.append(EpisodeActivities(stack.database_url, models, settings.environments))
        try:
            await _local(ActivityEnvironment(), "2", names.EPISODE_GENERATE).run(made[-1].generate, turn)
        except ApplicationError as err:
            assert err.type == "worker_lost" and err.non_retryable, err
        else:
            raise AssertionError("the step was started once too often without failing")
    finally:
        for made_here in made:
            await made_here.close()
        await models.close()

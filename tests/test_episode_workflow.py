"""EpisodeWorkflow (rollout.workflow: episode): the episode lives in Postgres, history carries ids.

Through the real stack: the transcript and token data stored are exactly the accepted chain, payloads in
history stay bounded whatever the tools return, and failures, retries, reruns and continue-as-new keep that.
"""

from __future__ import annotations

import asyncio
import base64
import json

import pytest

from gymflow.client import GymflowClient
from gymflow.testing.scripted_openai import context_length_error, http_error, text, tool_call
from tests.faulty_env import ZOMBIES_RETURNED, faulty_env, faulty_task  # noqa: F401 - faulty_env is a fixture
from tests.helpers import record_episode_histories, weather_task


async def _payload_sizes(client: GymflowClient, rollout_id: str) -> list[int]:
    """The size of every payload in the rollout's history (all runs of the id)."""
    sizes: list[int] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if "metadata" in node and isinstance(node.get("data"), str):
                sizes.append(len(base64.b64decode(node["data"])))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    async for wf in client.temporal.list_workflows(f"WorkflowId = '{rollout_id}'"):
        history = await client.temporal.get_workflow_handle(rollout_id, run_id=wf.run_id).fetch_history()
        walk(json.loads(history.to_json()))
    return sizes


async def test_single_tool_episode_stores_exactly_its_chain(ep, scripted, sql, run_id):
    scripted.script(tool_call("get_weather", {"city": "SF"}, logprobs=True), text("cold", logprobs=True))
    inp = ep.make_input(run_id, weather_task(), 0, "policy")
    summary = await ep.run_rollout(inp)
    assert summary.status == "completed" and summary.reward == 1.0
    assert (summary.turns, summary.tool_calls) == (2, 1)
    desc = await ep.temporal.get_workflow_handle(inp.rollout_id).describe()
    assert desc.workflow_type == "EpisodeWorkflow"
    (transcript,) = sql("SELECT transcript FROM rollouts WHERE id = %s", inp.rollout_id)[0]
    assert [m["role"] for m in transcript] == ["system", "user", "assistant", "tool", "assistant"]
    assert transcript[-1]["content"] == "cold"
    # the model saw that prefix: the second request carried the tool result
    assert [m["role"] for m in scripted.requests[-1].body["messages"]] == ["system", "user", "assistant", "tool"]
    assert sql("SELECT turn, jsonb_array_length(generation_log_probs) FROM generations WHERE rollout_id = %s "
               "ORDER BY turn", inp.rollout_id) == [(0, 1), (1, 1)]


async def test_history_payloads_stay_small_whatever_the_tools_return(ep, scripted, sql, run_id):
    # 20 KB arguments echoed back by the tool, six turns: the classic workflow carries all of it in every
    # payload; here no payload grows with it.
    city = "x" * 20_000
    scripted.script(*[tool_call("get_weather", {"city": city})] * 6, text("done"))
    inp = ep.make_input(run_id, weather_task(), 0, "policy", max_turns=8)
    summary = await ep.run_rollout(inp)
    assert summary.status == "completed" and summary.turns == 7
    sizes = await _payload_sizes(ep, inp.rollout_id)
    assert max(sizes) < 4_000, max(sizes)
    (size,) = sql("SELECT length(transcript::text) FROM rollouts WHERE id = %s", inp.rollout_id)[0]
    assert size > 12 * 20_000  # the data is all in Postgres: six calls and six tool outputs


async def test_a_retried_turn_leaves_one_message(ep, scripted, sql, run_id):
    scripted.script(http_error(500, "boom"), tool_call("get_weather", {"city": "SF"}), text("cold"))
    inp = ep.make_input(run_id, weather_task(), 0, "policy")
    summary = await ep.run_rollout(inp)
    assert summary.status == "completed" and summary.attempts == 3
    assert sql("SELECT turn, attempt FROM generations WHERE rollout_id = %s ORDER BY turn", inp.rollout_id) == [
        (0, 2), (1, 1)]


async def test_a_failed_episode_records_its_chain_and_a_rerun_replaces_it(ep, scripted, sql, run_id):
    scripted.script(tool_call("get_weather", {"city": "SF"}), context_length_error())
    inp = ep.make_input(run_id, weather_task(), 0, "policy")
    failed = await ep.run_rollout(inp)
    assert failed.status == "failed" and failed.failure_type == "context_length_exceeded"
    assert failed.reward is None
    (transcript,) = sql("SELECT transcript FROM rollouts WHERE id = %s", inp.rollout_id)[0]
    assert [m["role"] for m in transcript] == ["system", "user", "assistant", "tool"]
    assert sql("SELECT count(*) FROM generations WHERE rollout_id = %s", inp.rollout_id) == [(1,)]

    # --retry-failed: the rerun answers at once; the failed run's turn must not linger beside it.
    scripted.script(text("no tool this time"))
    handle, outcome = await ep.start_rollout(inp, retry_failed=True)
    assert outcome == "started"
    rerun = await ep.result(handle, inp)
    assert rerun.status == "completed" and rerun.turns == 1
    assert sql("SELECT turn, message->>'content' FROM generations WHERE rollout_id = %s", inp.rollout_id) == [
        (0, "no tool this time")]
    (transcript,) = sql("SELECT transcript FROM rollouts WHERE id = %s", inp.rollout_id)[0]
    assert [m["role"] for m in transcript] == ["system", "user", "assistant"]


async def test_continue_as_new_carries_only_the_head(ep, scripted, sql, run_id):
    scripted.script(*[tool_call("get_weather", {"city": c}) for c in ("SF", "NYC", "LA")], text("cold everywhere"))
    inp = ep.make_input(run_id, weather_task(), 0, "policy").model_copy(update={"turns_per_run": 1})
    summary = await ep.run_rollout(inp)
    assert summary.status == "completed" and (summary.turns, summary.tool_calls) == (4, 3)
    assert [m["role"] for m in scripted.requests[-1].body["messages"]].count("tool") == 3
    runs = [w async for w in ep.temporal.list_workflows(f"WorkflowId = '{inp.rollout_id}'")]
    assert sum(w.status.name == "CONTINUED_AS_NEW" for w in runs) == 3
    assert sql("SELECT jsonb_array_length(transcript) FROM rollouts WHERE id = %s", inp.rollout_id) == [(2 + 4 + 3,)]
    assert max(await _payload_sizes(ep, inp.rollout_id)) < 4_000


async def test_a_collection_stores_each_task_once(ep, scripted, sql, run_id):
    tasks = [weather_task("a"), weather_task("b")]
    results = [r async for r in ep.collect(run_id, tasks, n=2, model="policy")]
    assert len(results) == 4 and all(r.summary.status == "completed" for r in results)
    assert sql("SELECT task_id FROM tasks WHERE run_id = %s ORDER BY task_id", run_id) == [("a",), ("b",)]


async def _history_bytes(ep: GymflowClient, scripted, run_id: str, name: str, turns: int, output_bytes: int,
                         task_bytes: int) -> tuple[int, int]:
    """(history bytes, largest payload) of one episode of `turns` turns whose tool outputs are ~output_bytes."""
    task = weather_task(name)
    task = task.model_copy(update={"messages": (
        task.messages[0].model_copy(update={"content": "p" * task_bytes}), *task.messages[1:])})
    scripted.script(*[tool_call("get_weather", {"city": f"{i}" + "y" * output_bytes}) for i in range(turns - 1)],
                    text("done"))
    inp = ep.make_input(run_id, task, 0, "policy", max_turns=turns)
    handle, _ = await ep.start_rollout(inp)
    summary = await ep.result(handle, inp)
    assert summary.status == "completed" and summary.turns == turns
    history = await handle.fetch_history()
    return len(history.to_json()), max(await _payload_sizes(ep, inp.rollout_id))


async def test_history_grows_by_a_constant_per_turn_whatever_the_sizes(ep, scripted, run_id):
    # 40 turns of 50 KB tool calls echoed back as 50 KB tool outputs, on a 100 KB task, against 10 small
    # turns: the same bytes per turn. (The classic workflow carries the transcript in every payload: it ends
    # the large episode as transcript_too_large by turn 15.)
    small, small_max = await _history_bytes(ep, scripted, run_id, "small", 10, 10, 10)
    large, large_max = await _history_bytes(ep, scripted, run_id, "large", 40, 50_000, 100_000)
    assert max(small_max, large_max) < 4_000
    per_small, per_large = small / 10, large / 40
    assert abs(per_large - per_small) / per_small < 0.25, (per_small, per_large)


async def test_record_episode_histories_for_replay(ep, scripted, run_id):
    """Episodes with generation on the generate pool: each history replays through the strict sandbox."""
    scripted.script(tool_call("get_weather", {"city": "SF"}), text("cold"),  # single tool
                    tool_call("get_weather", {"city": "SF"}), context_length_error(),  # fails in turn 2
                    tool_call("get_weather", {"city": "A"}), tool_call("get_weather", {"city": "B"}), text("ok"))
    await record_episode_histories(ep, run_id, {"episode_single_tool": {}, "episode_context_length_failure": {},
                                                "episode_continue_as_new": {"turns_per_run": 1}}, model="pooled")


async def test_the_generate_pool_reads_the_tools_begin_stored(ep, scripted, sql, run_id):
    # Tool schemas come from the env pool's `begin`, stored with the task: a generate pool needs no environment.
    scripted.script(tool_call("get_weather", {"city": "SF"}), text("cold"))
    inp = ep.make_input(run_id, weather_task(), 0, "policy")
    summary = await ep.run_rollout(inp)
    assert summary.status == "completed"
    (tools,) = sql("SELECT tools FROM tasks WHERE run_id = %s", run_id)[0]
    assert [t["name"] for t in tools] == ["get_weather"]
    offered = [t["function"]["name"] for t in scripted.requests[0].body["tools"]]
    assert offered == ["get_weather"]


async def _transitions_and_events(client: GymflowClient, rollout_id: str) -> tuple[int, list[str]]:
    handle = client.temporal.get_workflow_handle(rollout_id)
    desc = await handle.describe()
    history = await handle.fetch_history()
    return (desc.raw_description.workflow_execution_info.state_transition_count,
            [e.WhichOneof("attributes") for e in history.events])


async def test_the_default_single_tool_episode_is_two_local_activities(ep, scripted, sql, run_id):
    # Every step local (the default): one local activity per turn, the first also begins the episode and the
    # last finishes it: no activity task at all, 3 state transitions.
    scripted.script(tool_call("get_weather", {"city": "SF"}), text("cold"))
    inp = ep.make_input(run_id, weather_task(), 0, "policy")
    assert (await ep.run_rollout(inp)).reward == 1.0
    transitions, events = await _transitions_and_events(ep, inp.rollout_id)
    assert events.count("activity_task_scheduled_event_attributes") == 0
    assert events.count("marker_recorded_event_attributes") == 2  # turn 1 (begin + generate + tools), turn 2
    assert transitions <= 4, transitions
    assert sql("SELECT status, reward FROM rollouts WHERE id = %s", inp.rollout_id) == [("completed", 1.0)]


async def test_a_local_environment_with_a_pooled_model(ep, scripted, sql, run_id):
    # single_tool is placed "local", the model on the generate pool: begin, run_tools and finish are local
    # activities (markers); the two generations are activity tasks.
    scripted.script(tool_call("get_weather", {"city": "SF"}), text("cold"))
    inp = ep.make_input(run_id, weather_task(), 0, "pooled")
    assert (await ep.run_rollout(inp)).reward == 1.0
    transitions, events = await _transitions_and_events(ep, inp.rollout_id)
    assert events.count("activity_task_scheduled_event_attributes") == 2  # the two generations only
    assert events.count("marker_recorded_event_attributes") == 3  # begin, run_tools, finish
    assert transitions <= 12, transitions
    assert sql("SELECT status, reward FROM rollouts WHERE id = %s", inp.rollout_id) == [("completed", 1.0)]


async def test_placement_pool_sends_the_steps_to_the_env_pool(ep, scripted, run_id):
    ep.settings.environments["single_tool"] = {"placement": "pool"}
    ep._placements.clear()  # noqa: SLF001 (the client caches placements per environment)
    try:
        scripted.script(tool_call("get_weather", {"city": "SF"}), text("cold"))
        inp = ep.make_input(run_id, weather_task(), 0, "policy")
        assert (await ep.run_rollout(inp)).reward == 1.0
        _, events = await _transitions_and_events(ep, inp.rollout_id)
        # begin, run_tools and finish on the env pool; the two generations local (markers)
        assert events.count("activity_task_scheduled_event_attributes") == 3
        assert events.count("marker_recorded_event_attributes") == 2
    finally:
        ep.settings.environments.pop("single_tool", None)
        ep._placements.clear()  # noqa: SLF001


@pytest.mark.usefixtures("faulty_env")
async def test_a_zombie_attempt_s_late_write_never_replaces_the_accepted_one(ep, scripted, sql, run_id,
                                                                            monkeypatch):
    # run_tools' first attempt outlives its 1 s start-to-close; attempt 2 answers and is accepted; then the
    # zombie finishes and tries to append its own tool message under the same producer key.
    import gymflow.activities.episode_store as episode_activities

    import tests.faulty_env

    monkeypatch.setattr(tests.faulty_env, "ZOMBIE_S", 2.0)  # past the 1 s start-to-close, by a margin
    appends: list[tuple[str, bool]] = []  # (rollout id, whether the producer had already written its batch)
    real_append = episode_activities.append_batch

    async def recording_append(conn, **kwargs):  # noqa: ANN001, ANN202 - a pass-through spy
        result = await real_append(conn, **kwargs)
        appends.append((kwargs["rollout_id"], result[1] is not None))
        return result

    monkeypatch.setattr(episode_activities, "append_batch", recording_append)
    zombies_before = len(ZOMBIES_RETURNED)
    scripted.script(tool_call("zombie", {"text": "z"}), text("done"))
    inp = ep.make_input(run_id, faulty_task("zombie"), 0, "policy")
    env_limits = inp.limits.env.model_copy(update={"start_to_close_s": 1, "heartbeat_s": None,
                                                   "initial_backoff_s": 0.1})
    inp = inp.model_copy(update={"limits": inp.limits.model_copy(update={"env": env_limits})})
    summary = await ep.run_rollout(inp)
    assert summary.status == "completed", summary
    deadline = asyncio.get_running_loop().time() + 20
    # Until the zombie has returned and its write has been made and found the accepted batch in place.
    while not (len(ZOMBIES_RETURNED) > zombies_before and (inp.rollout_id, True) in appends):
        assert asyncio.get_running_loop().time() < deadline, (len(ZOMBIES_RETURNED) - zombies_before, appends)
        await asyncio.sleep(0.05)
    tool_rows = sql("SELECT body->>'content' FROM messages WHERE rollout_id = %s AND role = 'tool'", inp.rollout_id)
    assert tool_rows == [("answered by attempt 2",)], tool_rows
    (transcript,) = sql("SELECT transcript FROM rollouts WHERE id = %s", inp.rollout_id)[0]
    assert [m["content"] for m in transcript if m["role"] == "tool"] == ["answered by attempt 2"]
    # what the model saw next is that same accepted answer
    assert scripted.requests[-1].body["messages"][-1]["content"] == "answered by attempt 2"


async def test_an_exception_in_workflow_code_fails_the_rollout_typed(ep, scripted, sql, run_id, monkeypatch):
    # A bug in workflow code (here: the counters' update raises after turn 1) fails the rollout at once, typed and
    # recorded, instead of retrying its workflow task until the 24 h execution timeout.
    import gymflow.workflows.episode as episode_workflow

    def poisoned(*args: object, **kwargs: object) -> None:
        raise ZeroDivisionError("poisoned workflow code")

    monkeypatch.setattr(episode_workflow, "advanced", poisoned)
    scripted.script(tool_call("get_weather", {"city": "SF"}), text("cold"))
    inp = ep.make_input(run_id, weather_task(), 0, "policy")
    summary = await asyncio.wait_for(ep.run_rollout(inp), timeout=30)
    assert (summary.status, summary.failure_type) == ("failed", "internal_error"), summary
    assert "ZeroDivisionError" in (summary.failure_message or "")
    desc = await ep.temporal.get_workflow_handle(inp.rollout_id).describe()
    assert desc.status.name == "FAILED"
    assert sql("SELECT status, failure_type FROM rollouts WHERE id = %s", inp.rollout_id) == [
        ("failed", "internal_error")]

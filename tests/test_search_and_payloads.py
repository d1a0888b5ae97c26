"""What the Temporal UI filters on, and what stays out of workflow history."""

from __future__ import annotations

from gymflow.kernel import names
from gymflow.testing.scripted_openai import text, tool_call
from tests.helpers import user_task, weather_task


async def test_rollouts_are_searchable_by_run_env_model_reward_status(gf, scripted, run_id):
    scripted.script(tool_call("get_weather", {"city": "SF"}), text("cold"), text("no tool"))
    await gf.run_rollout(gf.make_input(run_id, weather_task("a"), 0, "policy"))
    await gf.run_rollout(gf.make_input(run_id, weather_task("b"), 0, "policy"))
    query = (f"GymflowRun = '{run_id}' AND GymflowEnv = 'single_tool' AND GymflowModel = 'policy' "
             "AND GymflowStatus = 'completed' AND GymflowReward >= 1")
    found = [w async for w in gf.temporal.list_workflows(query)]
    assert [w.id for w in found] == [f"{run_id}/a/0"]
    attrs = found[0].typed_search_attributes
    assert attrs.get(names.SA_REWARD) == 1.0 and attrs.get(names.SA_STATUS) == "completed"
    zero = await gf.temporal.count_workflows(f"GymflowRun = '{run_id}' AND GymflowReward = 0")
    assert zero.count == 1


async def test_32k_token_generation_with_logprobs_stays_out_of_history(gf, scripted, sql, run_id):
    big = " ".join(["tok"] * 32_768)
    scripted.script(tool_call("get_weather", {"city": "SF"}, logprobs=True, completion_tokens=32_768),
                    text(big, logprobs=True), )
    inp = gf.make_input(run_id, weather_task(), 0, "policy")
    summary = await gf.run_rollout(inp)
    assert summary.status == "completed" and summary.usage.completion_tokens == 2 * 32_768
    lengths = sql("SELECT turn, jsonb_array_length(generation_log_probs) FROM generations WHERE rollout_id = %s "
                  "ORDER BY turn", inp.rollout_id)
    assert lengths == [(0, 32_768), (1, 32_768)]
    history = (await gf.temporal.get_workflow_handle(inp.rollout_id).fetch_history()).to_json()
    assert "logprob" not in history
    assert len(history) < 2_000_000


async def test_unknown_environment_fails_typed(gf, scripted, sql, run_id):
    task = user_task("hi").model_copy(update={"env": "no_such_env"})
    summary = await gf.run_rollout(gf.make_input(run_id, task, 0, "policy"))
    assert summary.status == "failed" and summary.failure_type == "unknown_environment"
    assert len(scripted.requests) == 0
    assert sql("SELECT status, failure_type FROM rollouts WHERE run_id = %s", run_id) == [
        ("failed", "unknown_environment")]


async def test_long_episode_continues_as_new_and_finishes(gf, scripted, sql, run_id):
    # Three tool turns and an answer, one turn per workflow run: four runs chained by continue-as-new.
    calls = [tool_call("get_weather", {"city": c}) for c in ("SF", "NYC", "LA")]
    scripted.script(*calls, text("cold everywhere"))
    inp = gf.make_input(run_id, weather_task(), 0, "policy").model_copy(update={"turns_per_run": 1})
    handle, _ = await gf.start_rollout(inp)
    summary = await gf.result(handle, inp)
    assert summary.status == "completed" and summary.reward == 1.0
    assert (summary.turns, summary.tool_calls, summary.attempts) == (4, 3, 4)
    # every turn saw the whole episode so far: the last request carries all three tool results
    assert [m["role"] for m in scripted.requests[-1].body["messages"]].count("tool") == 3
    runs = [w async for w in gf.temporal.list_workflows(f"WorkflowId = '{inp.rollout_id}'")]
    assert len(runs) == 4
    assert sum(w.status.name == "CONTINUED_AS_NEW" for w in runs) == 3
    assert sql("SELECT turns, tool_calls, jsonb_array_length(transcript) FROM rollouts WHERE id = %s",
               inp.rollout_id) == [(4, 3, 2 + 4 + 3)]

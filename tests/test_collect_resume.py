"""Collecting the same run twice starts nothing new and duplicates no row."""

from __future__ import annotations

from gymflow.data.datasets import load_jsonl
from tests.helpers import WEATHER_DATASET


async def _collect(gf, run_id, tasks):
    return [r async for r in gf.collect(run_id, tasks, n=2, model="policy")]


async def test_same_collection_twice_is_resumed(gf, scripted, sql, run_id):
    tasks, _ = load_jsonl(WEATHER_DATASET, env="single_tool")
    first = await _collect(gf, run_id, tasks)
    assert len(first) == 10 and {r.outcome for r in first} == {"started"}
    requests_after_first = len(scripted.requests)

    second = await _collect(gf, run_id, tasks)
    assert len(second) == 10 and {r.outcome for r in second} == {"finished"}
    assert len(scripted.requests) == requests_after_first, "no rollout ran again"
    assert {r.summary.rollout_id for r in first} == {r.summary.rollout_id for r in second}

    count = await gf.temporal.count_workflows(f"GymflowRun = '{run_id}'")
    assert count.count == 10
    assert sql("SELECT count(*), count(DISTINCT id) FROM rollouts WHERE run_id = %s", run_id) == [(10, 10)]
    assert sql("SELECT count(*) FROM generations WHERE rollout_id LIKE %s", run_id + "/%") == [(10,)]


async def test_running_rollout_is_attached_not_restarted(gf, scripted, sql, run_id):
    from gymflow.testing.scripted_openai import text

    scripted.script(text("slow", delay_s=2.0))
    tasks, _ = load_jsonl(WEATHER_DATASET, env="single_tool")
    inp = gf.make_input(run_id, tasks[0], 0, "policy")
    _, first = await gf.start_rollout(inp)
    handle, second = await gf.start_rollout(inp)
    assert (first, second) == ("started", "attached")
    await gf.result(handle, inp)
    assert len(scripted.requests) == 1
    assert sql("SELECT count(*) FROM rollouts WHERE run_id = %s", run_id) == [(1,)]

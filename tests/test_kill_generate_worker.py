"""SIGKILL the generate pool mid-generation: the rollout still completes, exactly once in Postgres."""

from __future__ import annotations

import asyncio
import signal

from gymflow.testing.scripted_openai import text, tool_call
from tests.helpers import weather_task


async def test_generate_worker_sigkill_mid_generation(gf, scripted, sql, run_id, generate_pool):
    # The first call hangs long enough to kill its worker; heartbeats (2 s timeout) expose the death.
    scripted.script(tool_call("get_weather", {"city": "SF"}, delay_s=30), tool_call("get_weather", {"city": "SF"}),
                    text("cold"))
    inp = gf.make_input(run_id, weather_task(), 0, "pooled")
    handle, _ = await gf.start_rollout(inp)
    assert await asyncio.to_thread(scripted.request_seen.wait, 30), "generation never reached the model"
    victim = generate_pool.proc
    victim.send_signal(signal.SIGKILL)
    assert victim.wait(timeout=10) == -signal.SIGKILL
    generate_pool.start()

    summary = await asyncio.wait_for(gf.result(handle, inp), timeout=90)
    assert summary.status == "completed" and summary.reward == 1.0
    assert sql("SELECT count(*), min(status), min(attempts) FROM rollouts WHERE run_id = %s", run_id) == [
        (1, "completed", 3)]
    assert sql("SELECT turn, attempt FROM generations WHERE rollout_id = %s ORDER BY turn", inp.rollout_id) == [
        (0, 2), (1, 1)]


async def test_sigterm_lets_in_flight_generation_finish(gf, scripted, sql, run_id, generate_pool):
    scripted.script(text("slow but fine", delay_s=3))
    inp = gf.make_input(run_id, weather_task(), 0, "pooled")
    handle, _ = await gf.start_rollout(inp)
    assert await asyncio.to_thread(scripted.request_seen.wait, 30)
    worker = generate_pool.proc
    worker.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(worker.wait, 40) == 0, "graceful shutdown exits cleanly"
    generate_pool.start()
    summary = await asyncio.wait_for(gf.result(handle, inp), timeout=60)
    assert summary.status == "completed"
    assert len(scripted.requests) == 1, "the in-flight call finished; nothing was retried"
    assert sql("SELECT attempt FROM generations WHERE rollout_id = %s", inp.rollout_id) == [(1,)]

"""`gymflow show ROLLOUT` on rollouts run through the real stack: transcript, tool calls and outputs, per-turn
generations (tokens, finish reason, token ids and logprobs), score details, the failure, at 80 columns."""

from __future__ import annotations

import asyncio
import re
import threading
import time

import pytest

from gymflow.testing.scripted_openai import context_length_error, text, tool_call
from tests.faulty_env import FaultyEnvironment, faulty_env, faulty_task  # noqa: F401 - faulty_env is a fixture
from tests.helpers import weather_task
from tests.test_reports import UI, gymflow


async def _one(gf, scripted, run_id: str, task_id: str, *replies, model: str = "policy") -> str:
    scripted.script(*replies)
    summary = await gf.run_rollout(gf.make_input(run_id, weather_task(task_id), 0, model))
    return summary.rollout_id


async def test_show_transcript_tokens_and_details(gf, scripted, run_id, config_file):
    rid = await _one(gf, scripted, run_id, "w", tool_call("get_weather", {"city": "SF"}, prompt_tokens=31),
                     text("It is cold in SF.", prompt_tokens=57))
    proc = await asyncio.to_thread(gymflow, config_file, "show", rid, "--ui-url", UI)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "…" not in out, out
    assert f"Rollout {rid}" in out and "completed, reward 1" in out
    assert f"Temporal UI  {UI}/namespaces/default/workflows/{rid.replace('/', '%2F')}" in out
    # roles in order, the tool call with its arguments, the tool's output, the final answer
    roles = re.findall(r"^\[\d+\] (\w+)", out, re.M)
    assert roles[-4:] == ["user", "assistant", "tool", "assistant"], roles
    assert re.search(r'-> tool call get_weather \(call \S+\)\s+\{"city": "SF"\}', out)
    assert "The weather in SF is cold." in out and "It is cold in SF." in out
    # one generation per turn with the endpoint's token counts and finish reasons
    rows = re.findall(r"^\s+(\d+)\s+(\d+)\s+(\w+)\s+(\d+)\s+(\d+)\s+[\d.]+\s+(\S+)\s+(\S+)\s*$", out, re.M)
    assert [(r[0], r[2], r[3]) for r in rows] == [("0", "tool_calls", "31"), ("1", "stop", "57")], rows
    assert all(r[5] == "no" and r[6] == "no" for r in rows)  # no token ids or logprobs were returned
    assert '"called_get_weather": true' in out


async def test_show_token_ids_logprobs_and_abbreviation(gf, scripted, run_id, config_file):
    long = " ".join(f"w{i}" for i in range(400))
    rid = await _one(gf, scripted, run_id, "v", text(long, logprobs=True, prompt_tokens=12), model="vllm")
    short = await asyncio.to_thread(gymflow, config_file, "show", rid)
    assert short.returncode == 0, short.stderr
    assert "more characters; --full shows all" in short.stdout and "w399" not in short.stdout
    assert re.search(r"^\s+0\s+\d+\s+stop\s+12\s+400\s+[\d.]+\s+12\+400\s+400\s*$", short.stdout, re.M), short.stdout
    assert "http" not in short.stdout  # no UI known: no link
    full = await asyncio.to_thread(gymflow, config_file, "show", rid, "--full")
    assert "more characters" not in full.stdout and "w399" in full.stdout


async def test_show_failure_and_unknown(gf, scripted, run_id, config_file):
    rid = await _one(gf, scripted, run_id, "f", context_length_error())
    proc = await asyncio.to_thread(gymflow, config_file, "show", rid)
    assert proc.returncode == 0, proc.stderr
    assert "Failure context_length_exceeded: policy: Error code: 400 - This model's maximum context length" in \
        " ".join(proc.stdout.split())
    assert "status        failed" in proc.stdout or "failed, reward -" in proc.stdout

    missing = await asyncio.to_thread(gymflow, config_file, "show", f"{run_id}/nope/0")
    assert missing.returncode == 1 and "Traceback" not in missing.stderr
    assert f"no rollout '{run_id}/nope/0'" in missing.stderr and rid in missing.stderr  # names ids that exist
    nothing = await asyncio.to_thread(gymflow, config_file, "show", "no-such-run/x/0")
    assert nothing.returncode == 1 and "ids look like RUN/TASK/SAMPLE" in nothing.stderr


@pytest.mark.usefixtures("faulty_env")
async def test_show_a_running_episode_from_its_stored_messages(gf, scripted, sql, run_id, config_file,
                                                                monkeypatch):
    # The tool holds until `show` has run, so the rollout is mid-episode: `rollouts` has no transcript yet,
    # the messages do.
    released, entered = threading.Event(), threading.Event()
    real_call_tool = FaultyEnvironment.call_tool

    async def held_call_tool(self, data, state, name, args):  # noqa: ANN001, ANN202 - wraps the env's own
        if name == "sleep":
            entered.set()
            deadline = time.monotonic() + 60
            while not released.is_set() and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        return await real_call_tool(self, data, state, name, args)

    monkeypatch.setattr(FaultyEnvironment, "call_tool", held_call_tool)
    scripted.script(tool_call("sleep", {"text": "zz"}), text("woke up"))
    inp = gf.make_input(run_id, faulty_task("slow"), 0, "policy")
    handle, _ = await gf.start_rollout(inp)
    try:
        deadline = time.monotonic() + 30
        while not (entered.is_set() and sql("SELECT count(*) FROM messages WHERE rollout_id = %s AND role = "
                                            "'assistant'", inp.rollout_id)[0][0]):
            assert time.monotonic() < deadline, "the tool call never started"
            await asyncio.sleep(0.05)
        proc = await asyncio.to_thread(gymflow, config_file, "show", inp.rollout_id)
    finally:
        released.set()
    assert proc.returncode == 0, proc.stderr
    assert "running" in proc.stdout and "the episode is running" in proc.stdout, proc.stdout
    assert re.search(r"-> tool call sleep", proc.stdout), proc.stdout
    summary = await gf.result(handle, inp)
    assert summary.status == "completed"

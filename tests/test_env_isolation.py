"""Environment code runs in supervised processes (activities/env_processes.py): hostile tool calls and verifiers
end typed within their limits, their process is replaced, and the calls beside them go on undelayed. Against the
real processes, through the functions the activities call (activities/env_activities.py)."""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import time
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from gymflow.activities.env_activities import run_tool_call, setup_episode, verify_episode
from gymflow.activities.env_calls import MAX_ARGUMENT_DEPTH
from gymflow.activities.env_processes import EnvProcesses, EnvProcessesClosed, Limits
from gymflow.environments.base import VerifyContext
from gymflow.environments.registry import get_environment

from gymflow.kernel.errors import GymflowError, VerifierError
from gymflow.kernel.failures import ENVIRONMENT_ERROR, VERIFIER_CRASHED, VERIFIER_TIMEOUT
from gymflow.kernel.wire import ChatMessage, FunctionCall, Task, ToolCall
from tests.faulty_env import TRACEBACK_TEXT
from tests.helpers import weather_task
from tests.hostile_env import CATASTROPHIC, NAME, hostile_env, hostile_task  # noqa: F401 - hostile_env: a fixture

LIMIT_S = 2.0
OPTIONS = {"tool_timeout_s": LIMIT_S, "verify_timeout_s": LIMIT_S, "setup_timeout_s": LIMIT_S, "memory_mb": 1024}
MARGIN_S = 1.5  # a kill, and a loaded 2-core box
HOLD_S = 8.0  # how long the holders of every process hold them
HELD_S_WAIT = 0.6  # past the pool's HELD_S: every process counts as held


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def procs(hostile_env) -> AsyncIterator[EnvProcesses]:  # noqa: F811
    pool = EnvProcesses(3)
    pool.start()
    yield pool
    await pool.close()


def _call(tool: str, **args: object) -> ToolCall:
    return ToolCall(id="c1", function=FunctionCall(name=tool, arguments=json.dumps(args)))


def _raw_call(name: str, raw: str) -> ToolCall:
    return ToolCall(id="c1", function=FunctionCall(name=name, arguments=raw))


async def _tool(procs: EnvProcesses, call: ToolCall, task: Task | None = None, state: dict | None = None):
    task = task or hostile_task()
    env = get_environment(task.env)
    return await run_tool_call(env, task, None, state if state is not None else {"echoed": ["kept"]}, call, procs,
                               OPTIONS)


def _pids(procs: EnvProcesses) -> set[int]:
    return {p.process.pid for p in procs._procs}  # noqa: SLF001


async def _full(procs: EnvProcesses) -> set[int]:
    """The pids once every process is up again (a replacement starts in the background)."""
    for _ in range(200):
        if len(procs._idle) == procs.size:  # noqa: SLF001
            return _pids(procs)
        await asyncio.sleep(0.05)
    raise AssertionError("the pool did not get back to full size")


async def _ready(procs: EnvProcesses) -> set[int]:
    """`_full`, with the hostile environment imported in every process: loading it is untimed by a call's limit
    (LOAD_TIMEOUT_S), and on a loaded 2-core box an import in a fresh process alone takes seconds."""
    pids = await _full(procs)
    task = hostile_task()
    for proc in list(procs._procs):  # noqa: SLF001 - nothing else calls meanwhile
        assert await procs._load(proc, task, OPTIONS["memory_mb"]) is None  # noqa: SLF001
    return pids


async def _gone(pid: int) -> bool:
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        await asyncio.sleep(0.02)
    return False


# ---- hostile tools --------------------------------------------------------------------------------------

async def test_a_catastrophic_regex_in_a_workplace_tool_returns_at_once(procs):
    env = get_environment("workplace_assistant")
    task = Task(id="wa", env="workplace_assistant", messages=(ChatMessage(role="user", content="find"),),
                data={"ground_truth": []})
    started = time.monotonic()
    res = await run_tool_call(env, task, None, {"calls": []}, _call("company_directory_find_email_address",
                                                                    name=CATASTROPHIC), procs, OPTIONS)
    assert time.monotonic() - started < 1.0, "RE2 matches in linear time"
    assert not res.is_error and json.loads(res.message.content) == {"output": []}
    # A pattern RE2 cannot run (a backreference) is the model's to fix.
    bad = await run_tool_call(env, task, None, {"calls": []}, _call("company_directory_find_email_address",
                                                                    name=r"(a)\1"), procs, OPTIONS)
    assert bad.is_error and "invalid search pattern" in bad.message.content
    # Ordinary patterns behave as before.
    ok = await run_tool_call(env, task, None, {"calls": []}, _call("company_directory_find_email_address",
                                                                   name="^[a-z]+\\.?[a-z]*@"), procs, OPTIONS)
    assert not ok.is_error and len(json.loads(ok.message.content)["output"]) > 10


@pytest.mark.parametrize(("tool", "args", "expected"), [
    ("regex", {"pattern": CATASTROPHIC}, f"tool call exceeded its {LIMIT_S:g} s limit"),  # Python's own `re`
    ("spin", {}, f"tool call exceeded its {LIMIT_S:g} s limit"),
    ("sleep", {"seconds": 3600}, f"tool call exceeded its {LIMIT_S:g} s limit"),
    ("print", {}, f"tool call exceeded its {LIMIT_S:g} s limit"),
    ("alloc", {}, "tool call exceeded its 1024 MB memory limit"),
    ("exit", {}, "tool call ended its process (exit code 7)"),
])
async def test_a_hostile_tool_ends_typed_within_its_limit_and_its_process_is_replaced(procs, tool, args,
                                                                                      expected):
    before = await _ready(procs)
    started = time.monotonic()
    res = await _tool(procs, _call(tool, **args))
    elapsed = time.monotonic() - started
    assert res.is_error and res.message.content == f"Error: {expected}", res.message.content
    assert res.state == {"echoed": ["kept"]}, "a failed call leaves the state as it was"
    assert elapsed < LIMIT_S + MARGIN_S, elapsed
    after = await _full(procs)
    assert len(before - after) == 1 and len(after) == procs.size, "exactly the hostile call's process was replaced"
    assert await _gone((before - after).pop()), "reaped, not left behind"
    assert not (await _tool(procs, _call("echo", text="next"))).is_error


async def test_a_replacement_process_loads_the_environments_in_use_before_its_first_call(procs):
    await _ready(procs)
    before = _pids(procs)
    assert (await _tool(procs, _call("exit"))).is_error
    after = await _full(procs)
    (new,) = [p for p in procs._procs if p.process.pid in after - before]  # noqa: SLF001
    assert NAME in new.loaded, "its first call would pay the environment's import inside its activity's timeout"


async def test_normal_calls_beside_a_hostile_one_are_not_delayed(procs):
    async def timed() -> float:
        started = time.monotonic()
        res = await _tool(procs, _call("echo", text="hi"))
        assert not res.is_error
        return time.monotonic() - started

    await _full(procs)
    alone = [await timed() for _ in range(50)]
    spinner = asyncio.ensure_future(_tool(procs, _call("spin")))
    await asyncio.sleep(0.2)  # the spinner holds its process (and a core) from here on
    beside = list(await asyncio.gather(*(timed() for _ in range(50))))
    assert not spinner.done(), "the measured calls all ran while the hostile one was spinning"
    assert (await spinner).is_error
    p95 = statistics.quantiles(beside, n=20)[-1]
    # 50 calls queued at once on the 2 free processes: a few ms each, never the spinner's 2 s.
    assert p95 < max(statistics.quantiles(alone, n=20)[-1] * 50, 0.5), (p95, alone)


async def test_queueing_for_a_process_does_not_count_against_the_call(hostile_env):  # noqa: F811
    one = EnvProcesses(1, overflow=1)  # no extra process: the second call really queues
    one.start()
    try:
        # Each sleeps 1.2 s of its 2 s limit; the second waits ~1.2 s for the only process and must still pass.
        first, second = await asyncio.gather(_tool(one, _call("sleep", seconds=1.2)),
                                             _tool(one, _call("sleep", seconds=1.2)))
        assert not first.is_error and not second.is_error, (first.message.content, second.message.content)
    finally:
        await one.close()


async def test_calls_held_to_their_limit_get_extra_processes_for_the_others(hostile_env):  # noqa: F811
    # Both processes held by blocking calls (to an 8 s limit): the calls that come after get extra processes
    # instead of queueing behind them, and the extras retire once nobody waits. The holders sleep rather than
    # spin so that a loaded CI box (two test processes on two cores) still starts the extras well inside 8 s.
    two = EnvProcesses(2)
    two.start()
    held = {**OPTIONS, "tool_timeout_s": HOLD_S}
    try:
        await asyncio.gather(*(_tool(two, _call("echo", text="warm")) for _ in range(2)))  # both up, env loaded
        await _full(two)
        task, env = hostile_task(), get_environment(NAME)
        holders = [asyncio.ensure_future(run_tool_call(env, task, None, {}, _call("sleep"), two, held))
                   for _ in range(2)]
        await asyncio.sleep(0.1)
        started = time.monotonic()
        normal = await asyncio.gather(*(_tool(two, _call("echo", text="hi")) for _ in range(10)))
        took = time.monotonic() - started
        assert all(not r.is_error for r in normal)
        assert not any(h.done() for h in holders), "the holders ended before the normal calls"
        assert took < HOLD_S / 2, took  # HELD_S plus a process start, never the holders' limit
        assert all(r.is_error for r in await asyncio.gather(*holders))
        for _ in range(100):
            if len(two._procs) == two.size:  # noqa: SLF001
                break
            await asyncio.sleep(0.05)
        assert len(two._procs) == two.size  # noqa: SLF001
    finally:
        await two.close()


async def test_one_environment_holding_every_process_leaves_one_for_another(hostile_env):  # noqa: F811
    # Ten hostile calls of one environment, each held to an 8 s limit, against a pool of 2 (8 at most): the
    # hostile environment gets at most its fair share, so a call of another environment that arrives after
    # them still finds a process at once instead of waiting out their limit.
    two = EnvProcesses(2)
    two.start()
    held = {**OPTIONS, "tool_timeout_s": HOLD_S}
    try:
        await _full(two)
        task, env = hostile_task(), get_environment(NAME)
        holders = [asyncio.ensure_future(run_tool_call(env, task, None, {}, _call("sleep"), two, held))
                   for _ in range(10)]
        most = min(two.share, two.max_size)
        for _ in range(120):  # the pool grows for them, up to their fair share
            if sum(1 for p in two._procs if p.share == NAME) >= most:  # noqa: SLF001
                break
            await asyncio.sleep(0.05)
        assert sum(1 for p in two._procs if p.share == NAME) == most < two.max_size  # noqa: SLF001
        await asyncio.sleep(HELD_S_WAIT)  # and would take the next free process, without a share
        weather = weather_task()
        started = time.monotonic()
        res = await run_tool_call(get_environment(weather.env), weather, None, {},
                                  _call("get_weather", city="SF"), two, OPTIONS)
        took = time.monotonic() - started
        assert not res.is_error, res.message.content
        assert not any(h.done() for h in holders), "the hostile calls ended before the other environment's"
        assert took < HOLD_S / 2, took  # a process start and a load, never the holders' limit
        for h in holders:
            h.cancel()
        await asyncio.gather(*holders, return_exceptions=True)
    finally:
        await two.close()


# ---- arguments --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("use_pool", [True, False])
async def test_arguments_nested_100k_deep_are_a_tool_error(procs, use_pool):
    env = get_environment(NAME)
    for raw in ('{"text": ' + "[" * 100_000 + "]" * 100_000 + "}", '{"text": ' + "[" * (MAX_ARGUMENT_DEPTH + 1)
                + "]" * (MAX_ARGUMENT_DEPTH + 1) + "}"):
        res = await run_tool_call(env, hostile_task(), None, {}, _raw_call("echo", raw), procs if use_pool else None,
                                  OPTIONS)
        assert res.is_error and "nested too deep" in res.message.content, res.message.content[:200]
    fine = await run_tool_call(env, hostile_task(), None, {}, _raw_call("echo", '{"text": [[["ok"]]]}'),
                               procs if use_pool else None, OPTIONS)
    assert not fine.is_error


async def test_oversized_arguments_are_a_tool_error(procs):
    res = await _tool(procs, _call("echo", text="x" * 1_000_001))
    assert res.is_error and "over the limit" in res.message.content


async def test_nul_bytes_in_arguments_travel_intact(procs):
    text = "a\x00b\x00" + "\u0000" * 3
    res = await _tool(procs, _call("echo", text=text), state={})
    assert not res.is_error and res.message.content == text and res.state == {"echoed": [text]}


# ---- verify and setup -------------------------------------------------------------------------------------

def _ctx() -> VerifyContext:
    return VerifyContext(policy_model="p", options=dict(OPTIONS))


@pytest.mark.parametrize(("how", "failure_type", "says"), [
    ("hang", VERIFIER_TIMEOUT, f"verify exceeded its {LIMIT_S:g} s limit"),
    ("spin", VERIFIER_TIMEOUT, f"verify exceeded its {LIMIT_S:g} s limit"),
    ("alloc", VERIFIER_CRASHED, "verify exceeded its 1024 MB memory limit"),
    ("exit", VERIFIER_CRASHED, "verify ended its process (exit code 7)"),
])
async def test_a_verifier_past_its_limits_masks_the_rollout(procs, how, failure_type, says):
    task = hostile_task(verify=how)
    await _ready(procs)  # the replacement of an earlier test's process is up and loaded: only this call is timed
    started = time.monotonic()
    score = await verify_episode(get_environment(NAME), None, [], {}, _ctx(), task, procs)
    assert time.monotonic() - started < LIMIT_S + MARGIN_S
    assert score.masked and score.reward is None and score.failure_type == failure_type
    assert score.details["error"] == says


async def test_a_verifier_runs_in_a_supervised_process_and_scores(procs):
    messages = [ChatMessage(role="assistant", tool_calls=(_call("echo", text="x"),))]
    score = await verify_episode(get_environment(NAME), None, messages, {}, _ctx(), hostile_task(), procs)
    assert score.reward == 1.0 and score.details["pid"] in _pids(procs) and score.details["pid"] != os.getpid()


async def test_an_environment_exception_is_raised_again_as_itself(procs):
    """So the activity boundary records it as it did in-process: environment_error, class name and first line."""
    with pytest.raises(RuntimeError) as err:
        await verify_episode(get_environment(NAME), None, [], {}, _ctx(), hostile_task(verify="raise"), procs)
    assert str(err.value) == TRACEBACK_TEXT and "misbehave" in str(err.value.__cause__)
    with pytest.raises(RuntimeError):
        await _tool(procs, _call("raise"))
    with pytest.raises(RuntimeError):
        await setup_episode(get_environment(NAME), hostile_task(setup="raise"), procs, OPTIONS)


@pytest.mark.parametrize("how", ["hang", "exit"])
async def test_setup_past_its_limits_is_an_environment_error(procs, how):
    with pytest.raises(GymflowError) as err:
        await setup_episode(get_environment(NAME), hostile_task(setup=how), procs, OPTIONS)
    assert err.value.failure_type == ENVIRONMENT_ERROR and "setup" in str(err.value)


async def test_setup_returns_the_episode_start(procs):
    messages, state, tools = await setup_episode(get_environment(NAME), hostile_task(text="hello"), procs, OPTIONS)
    assert [m.content for m in messages] == ["hello"] and state == {"echoed": []} and len(tools) == 8


async def test_a_check_run_from_the_loop_is_bounded_and_typed(procs):
    """`VerifyContext.run_isolated`, as a judged verifier's CPU-bound check (math-verify) uses it."""
    limits = Limits(verify_s=0.5)
    assert await procs.run(pow, (2, 10), limits) == 1024
    with pytest.raises(VerifierError) as err:
        await procs.run(time.sleep, (30,), limits)
    assert err.value.failure_type == VERIFIER_TIMEOUT


# ---- lifecycle --------------------------------------------------------------------------------------------

async def test_close_is_bounded_and_ends_calls_in_flight(hostile_env):  # noqa: F811
    pool = EnvProcesses(2)
    pool.start()
    assert not (await _tool(pool, _call("echo", text="up"))).is_error
    pids = _pids(pool)
    spinning = asyncio.ensure_future(_tool(pool, _call("spin")))
    await asyncio.sleep(0.3)
    started = time.monotonic()
    await pool.close()
    assert time.monotonic() - started < 3.0
    with pytest.raises(EnvProcessesClosed):
        await spinning
    for pid in pids:
        assert await _gone(pid)
    with pytest.raises(EnvProcessesClosed):
        await _tool(pool, _call("echo", text="late"))

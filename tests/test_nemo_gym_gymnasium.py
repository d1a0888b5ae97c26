"""nemo_gym over NeMo Gym's gymnasium agent protocol (/reset, /step: environments/nemo_gym_gymnasium.py).

The protocol mapping, unit-level; then NeMo Gym 0.7.0's own example_multi_turn_gymnasium server (a scripted user),
started as NeMo Gym starts it: its recorded rollouts' model turns replayed through the adapter get the recorded
follow-ups as the next user messages and the recorded reward, and a changed final answer scores as the server,
driven the way NeMo Gym's gymnasium agent drives it, scores it.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from gymflow.environments import nemo_gym_gymnasium as gym
from gymflow.environments.base import VerifyContext
from gymflow.environments.nemo_gym import NemoGymEnvironment, gymnasium
from gymflow.environments.nemo_gym_catalogue import Agent, ServerInfo, agent
from gymflow.environments.nemo_gym_http import Reply, url_env_var
from gymflow.workers.local_stack import free_port

from gymflow.data.datasets import row_to_task
from gymflow.kernel.errors import GymflowError
from gymflow.kernel.responses_format import input_to_messages
from gymflow.kernel.wire import ChatMessage
from tests.faulty_env import conversing_envs  # noqa: F401 - a fixture

PYTHON = os.environ.get("GYMFLOW_NEMO_GYM_PYTHON") or str(Path(__file__).resolve().parents[1] / ".nemo313/bin/python")
SERVER = "example_multi_turn_gymnasium"
WRONG = "I am not sure."


def _folder() -> Path | None:
    if not Path(PYTHON).exists():
        return None
    done = subprocess.run([PYTHON, "-c", "import pathlib, resources_servers as r; print(list(r.__path__)[0])"],
                          capture_output=True, text=True, timeout=120)
    return Path(done.stdout.strip()) if done.returncode == 0 else None


SERVERS_DIR = _folder()
if SERVERS_DIR is None and os.environ.get("GYMFLOW_REQUIRE_NEMO_GYM") == "1":
    raise RuntimeError(f"GYMFLOW_REQUIRE_NEMO_GYM=1 but no NeMo Gym python at {PYTHON}")
needs_nemo = pytest.mark.skipif(SERVERS_DIR is None, reason=f"no NeMo Gym python at {PYTHON}")


# The mapping, without a server.

def test_a_config_naming_the_gymnasium_agent_is_driven_by_its_protocol(tmp_path: Path) -> None:
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "game.yaml").write_text(
        "game:\n  resources_servers:\n    game: {entrypoint: app.py}\n"
        "game_agent:\n  responses_api_agents:\n    gymnasium_agent:\n"
        "      resources_server: {type: resources_servers, name: game}\n      max_steps: 7\n")
    (tmp_path / "configs" / "plain.yaml").write_text(
        "game:\n  resources_servers:\n    game: {entrypoint: app.py}\n"
        "game_agent:\n  responses_api_agents:\n    simple_agent:\n"
        "      resources_server: {type: resources_servers, name: game}\n")
    info = ServerInfo("game", tmp_path, ["game.yaml", "plain.yaml"])
    assert agent(info) == Agent("gymnasium_agent", 7)
    assert agent(info, "plain.yaml") == Agent("simple_agent", None)


def test_steps_sum_rewards_and_end_as_the_gymnasium_agent_ends() -> None:
    state = gym.state_after_reset({"s": "1"}, "inst", {"supports_step_idempotency": True})
    state = gym.after_step(state, 0.25, False, False, max_steps=3)
    assert gym.ENDED_KEY not in state and state[gym.STEPS_KEY] == 1
    state = gym.after_step(state, 0.5, False, False, max_steps=3)
    assert gym.reward_of(state) == 0.75
    assert gym.after_step(state, 0.0, False, False, max_steps=3)[gym.ENDED_KEY] == "truncated"  # max_steps
    assert gym.after_step(state, 0.0, True, False, max_steps=9)[gym.ENDED_KEY] == "terminated"
    # A retried step (the same state) carries the same idempotency id; the next step another.
    first = gym.step_body({"row": 1}, state, [], "m")["_ng_step_request_id"]
    assert first == gym.step_body({"row": 1}, state, [], "m")["_ng_step_request_id"]
    assert first != gym.step_body({"row": 1}, gym.after_step(state, 0, False, False, 9), [], "m")["_ng_step_request_id"]


def test_a_step_that_is_no_step_fails_the_episode_never_scores_it() -> None:
    for reply in (Reply(422, "bad"), Reply(200, "[]"), Reply(200, '{"reward": "x"}')):
        with pytest.raises(GymflowError) as err:
            gym.parse_step("srv", reply)
        assert err.value.failure_type == "environment_error"
    assert gym.parse_step("srv", Reply(200, '{"observation": "next", "reward": 1, "terminated": true}')) == \
        ("next", 1.0, True, False, {})


def test_a_tool_turn_shows_the_tool_output_then_the_observation() -> None:
    info = {"tool_outputs": [{"call_id": gym.CALL_ID, "output": "GY___"}]}
    out = gym.tool_turn({}, "guess", {"word": "crane"}, "4 guesses left", info, done=False)
    assert out.content == "GY___\n\n4 guesses left" and not out.done
    assert gym.tool_turn({}, "guess", {}, "won", info, done=True).content == "GY___"


# The real server.

@pytest.fixture(scope="module")
def server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    assert SERVERS_DIR is not None
    port = free_port()
    config = {"head_server": {"host": "127.0.0.1", "port": free_port()}, "dry_run": False,
              SERVER: {"resources_servers": {SERVER: {"entrypoint": "app.py", "host": "127.0.0.1", "port": port,
                                                      "domain": "knowledge"}}}}
    env = {**os.environ, "NEMO_GYM_CONFIG_DICT": json.dumps(config), "NEMO_GYM_CONFIG_PATH": SERVER}
    log = tmp_path_factory.mktemp("gymnasium") / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([PYTHON, "app.py"], cwd=SERVERS_DIR / SERVER, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.post(url + "/aggregate_metrics", json={}, timeout=2, trust_env=False).status_code < 500:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"{SERVER} did not start:\n{log.read_text(errors='replace')[-2000:]}")
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def _cases() -> list[Any]:
    if SERVERS_DIR is None:
        return []
    data = SERVERS_DIR / SERVER / "data"
    tasks = [json.loads(line) for line in (data / "example.jsonl").read_text().splitlines() if line.strip()]
    rollouts = [json.loads(line) for line in (data / "example_rollouts.jsonl").read_text().splitlines() if line]
    return [pytest.param(tasks[r["_ng_task_index"]], r, id=f"row{r['_ng_task_index']}") for r in rollouts]


def _turns(rollout: dict[str, Any]) -> list[ChatMessage]:
    return [m for m in input_to_messages(rollout["response"]["output"]) if m.role == "assistant"]


async def _nemo_gym(url: str, task: dict[str, Any], turns: list[ChatMessage], max_steps: int) -> float:
    """The server driven as NeMo Gym's gymnasium agent drives it: /reset, then each turn's output to /step, the
    rewards summed, until terminated, truncated or max_steps."""
    from gymflow.environments.nemo_gym_responses import items
    total = 0.0
    async with httpx.AsyncClient(base_url=url, timeout=60, trust_env=False) as client:
        reset = await client.post("/reset", json=task)
        reset.raise_for_status()
        client.cookies = reset.cookies
        for i, turn in enumerate(turns[:max_steps]):
            step = await client.post("/step", json={**task, "response": gym.response("m", items([turn], i))})
            step.raise_for_status()
            body = step.json()
            total += body["reward"]
            if body["terminated"] or body["truncated"]:
                break
    return total


async def _through_adapter(task: dict[str, Any], turns: list[ChatMessage]) -> tuple[float, list[str], JSONish]:
    env = NemoGymEnvironment()
    t = row_to_task({**task, "resources_server": SERVER}, env="nemo_gym", default_id="gymnasium")
    data = env.parse_task(t)
    assert gymnasium(data) and env.responds(t, data)
    opening, state = await env.open_episode(data, env.setup(t, data))
    transcript, observations = [*t.messages, *opening], []
    for turn in turns:
        transcript.append(turn)
        out = await env.respond(data, state, transcript)
        state = out.state
        if out.done:
            break
        observations.append(out.content)
        transcript.append(ChatMessage(role="user", content=out.content))
    score = await env.verify(data, transcript, state, VerifyContext("recorded"))
    assert score.reward is not None
    return score.reward, observations, score.details


JSONish = dict[str, Any]


@needs_nemo
@pytest.mark.parametrize("task, rollout", _cases())
async def test_recorded_rollouts_replay_as_nemo_gym_ran_them(server_url: str, task: dict[str, Any],
                                                            rollout: dict[str, Any],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(url_env_var(SERVER), server_url)
    turns = _turns(rollout)
    reward, observations, details = await _through_adapter(task, turns)
    recorded_follow_ups = [m.text for m in input_to_messages(rollout["response"]["output"]) if m.role == "user"]
    assert observations == recorded_follow_ups == task["follow_ups"]
    assert reward == float(rollout["reward"]) == await _nemo_gym(server_url, task, turns, max_steps=5)
    assert details["ended"] == "terminated" and details["steps"] == len(turns)


@needs_nemo
@pytest.mark.parametrize("task, rollout", _cases()[:2])
async def test_a_changed_final_answer_scores_as_nemo_gym_scores_it(server_url: str, task: dict[str, Any],
                                                                  rollout: dict[str, Any],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(url_env_var(SERVER), server_url)
    turns = _turns(rollout)
    changed = [*turns[:-1], ChatMessage(role="assistant", content=WRONG)]
    reward, _, _ = await _through_adapter(task, changed)
    assert reward == await _nemo_gym(server_url, task, changed, max_steps=5) == 0.0


@needs_nemo
@pytest.mark.integration
async def test_a_durable_rollout_converses_with_the_scripted_user(gf: Any, scripted: Any, sql: Any,
                                                                  run_id: str) -> None:
    """Temporal, the env pool and Postgres, on a server the env worker starts: each text turn goes to /step, its
    follow-up is the next user message, the terminal step ends the episode and its reward is the rollout's."""
    from gymflow.environments import nemo_gym_server as managed
    from gymflow.workflows.episode import EpisodeWorkflow
    from temporalio.contrib.pydantic import pydantic_data_converter
    from temporalio.worker import Replayer

    from gymflow.testing.scripted_openai import text

    assert SERVERS_DIR is not None
    task = json.loads((SERVERS_DIR / SERVER / "data" / "example.jsonl").read_text().splitlines()[0])  # France
    os.environ.pop(url_env_var(SERVER), None)  # gymflow runs it
    try:
        scripted.script(text("Paris."), text("About 2 million."), text("The Eiffel Tower."), text("never asked"))
        t = row_to_task({**task, "resources_server": SERVER}, env="nemo_gym", default_id="g0")
        summary = await gf.run_rollout(gf.make_input(run_id, t, 0, "policy", max_turns=8))
        assert summary.status == "completed" and summary.reward == 1.0, summary
        assert (summary.turns, summary.tool_calls) == (3, 0) and len(scripted.requests) == 3
        (transcript,) = sql("SELECT transcript FROM rollouts WHERE id = %s", summary.rollout_id)[0]
        assert [(m["role"], m.get("content")) for m in transcript[1:]] == [
            ("assistant", "Paris."), ("user", task["follow_ups"][0]), ("assistant", "About 2 million."),
            ("user", task["follow_ups"][1]), ("assistant", "The Eiffel Tower."), ("user", "")]
        history = await gf.temporal.get_workflow_handle(summary.rollout_id).fetch_history()
        replayed = await Replayer(workflows=[EpisodeWorkflow], data_converter=pydantic_data_converter
                                  ).replay_workflow(history, raise_on_replay_failure=False)
        assert replayed.replay_failure is None, replayed.replay_failure
    finally:
        managed.stop_all()


@pytest.mark.integration
@pytest.mark.parametrize("placement", ["pool", "local"])
async def test_an_environment_answers_text_turns_in_both_workflow_shapes(gf: Any, scripted: Any, sql: Any,
                                                                        run_id: str,
                                                                        conversing_envs: list[str],  # noqa: F811
                                                                        placement: str,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel's side of the protocol, without NeMo Gym: open_episode's message joins the prompt, each text
    turn gets respond's user message, respond's `done` ends the episode; with the env pool (run_tools) and with
    every step local (one activity a turn, the episode begun and finished in them)."""
    from gymflow.environments import registry

    from gymflow.kernel.wire import Task
    from gymflow.testing.scripted_openai import text
    from tests.faulty_env import CONVERSING_ENTRY_POINTS, CONVERSING_LOCAL_NAME, CONVERSING_NAME

    real = registry._entry_points
    monkeypatch.setattr(registry, "_entry_points", lambda: {**real(), **CONVERSING_ENTRY_POINTS})  # placement
    env = CONVERSING_LOCAL_NAME if placement == "local" else CONVERSING_NAME
    scripted.script(text("one"), text("two"), text("three"), text("never asked"))
    t = Task(id="c0", env=env, messages=(ChatMessage(role="user", content="talk"),))
    summary = await gf.run_rollout(gf.make_input(run_id, t, 0, "policy", max_turns=8))
    assert summary.status == "completed" and summary.reward == 1.0, summary
    assert (summary.turns, summary.tool_calls) == (3, 0) and len(scripted.requests) == 3
    transcript, details = sql("SELECT transcript, score_details FROM rollouts WHERE id = %s", summary.rollout_id)[0]
    assert [(m["role"], m.get("content")) for m in transcript] == [
        ("user", "talk"), ("user", "opening"), ("assistant", "one"), ("user", "reply 1"), ("assistant", "two"),
        ("user", "reply 2"), ("assistant", "three"), ("user", "")]
    assert details["heard"] == "three"
    history = await gf.temporal.get_workflow_handle(summary.rollout_id).fetch_history()
    scheduled = [e for e in history.events if e.HasField("activity_task_scheduled_event_attributes")]
    assert (not scheduled) == (placement == "local")  # every step local: local activities only
    # The model saw the opening and each reply.
    assert [m["content"] for m in scripted.requests[-1].body["messages"] if m["role"] == "user"] == [
        "talk", "opening", "reply 1", "reply 2"]


async def test_a_server_that_asked_for_close_gets_it_and_a_failed_close_changes_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from gymflow.environments import nemo_gym
    from gymflow.environments import nemo_gym_http as http

    posted: list[tuple[str, dict[str, str]]] = []

    async def post(url: str, path: str, body: bytes, cookies: dict[str, str], timeout: float, **_: Any) -> Reply:
        posted.append((path, cookies))
        raise http.ServerUnavailable("down")

    monkeypatch.setattr(http, "post", post)
    asked = gym.state_after_reset({"s": "1"}, "", {"supports_explicit_close": True})
    await nemo_gym._close("http://x", asked)  # the failure is swallowed
    await nemo_gym._close("http://x", gym.state_after_reset({"s": "1"}, "", {}))  # not asked: not sent
    assert posted == [("/close", {"s": "1"})]

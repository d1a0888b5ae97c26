"""nemo_gym with servers gymflow runs itself: NeMo Gym 0.7.0's real xlam_fc server (tool calls with no route, as
NeMo Gym's simple agent shows them), started from NeMo Gym's Python, restarted when it dies, stopped with us; rows
for servers that cannot run here refused before anything starts; and the catalogue in the CLI.

Needs NeMo Gym's Python (.nemo313, or $GYMFLOW_NEMO_GYM_PYTHON); skipped without one unless
GYMFLOW_REQUIRE_NEMO_GYM=1 (CI), where it fails.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner
from gymflow.activities.env_activities import run_tool_call, verify_episode
from gymflow.environments import nemo_gym_catalogue as catalogue
from gymflow.environments import nemo_gym_server as managed
from gymflow.environments.base import VerifyContext
from gymflow.environments.nemo_gym import INSTANCE_KEY, NemoGymEnvironment

from gymflow.data.datasets import row_to_task
from gymflow.kernel.errors import ConfigError, GymflowError, TaskError
from gymflow.kernel.responses_format import input_to_messages
from gymflow.kernel.wire import ChatMessage, FunctionCall, Task, ToolCall

try:
    XLAM = catalogue.server("xlam_fc")
    WHY = ""
except ConfigError as e:
    XLAM, WHY = None, str(e)
if XLAM is None and os.environ.get("GYMFLOW_REQUIRE_NEMO_GYM") == "1":
    raise RuntimeError(f"GYMFLOW_REQUIRE_NEMO_GYM=1 but {WHY}")
# One test process runs the whole module (`--dist loadgroup`): its server starts once, not once per process.
pytestmark = [pytest.mark.skipif(XLAM is None, reason=WHY), pytest.mark.xdist_group("nemo_gym_managed")]

ENV = NemoGymEnvironment()


@pytest.fixture(autouse=True, scope="module")
def _servers_stop_with_the_module() -> Iterator[None]:
    os.environ.pop("GYMFLOW_NEMO_GYM_XLAM_FC_URL", None)  # gymflow runs it, not the user
    yield
    managed.stop_all()


def _jsonl(name: str) -> list[dict[str, Any]]:
    assert XLAM is not None
    return [json.loads(line) for line in (XLAM.folder / "data" / name).read_text().splitlines() if line.strip()]


def _task(row: dict[str, Any], **extra: Any) -> Task:
    return row_to_task({**row, "resources_server": "xlam_fc", **extra}, env="nemo_gym", default_id="t")


def _call(name: str, args: dict[str, Any], cid: str = "c1") -> ToolCall:
    return ToolCall(id=cid, function=FunctionCall(name=name, arguments=json.dumps(args)))


def _pid(spec: managed.Spec) -> int:
    proc = managed.managed(spec).proc
    assert proc is not None
    return proc.pid


async def test_recorded_rollouts_score_as_recorded_and_tool_errors_reach_the_model_as_recorded() -> None:
    """xlam_fc has no tool routes: NeMo Gym's agent showed each call's 404 body and went on; so does the adapter."""
    tasks = {t["responses_create_params"]["input"][-1]["content"]: t for t in _jsonl("example.jsonl")}
    rollouts = _jsonl("example_rollouts.jsonl")
    rewards = []
    for rollout in rollouts:
        t = _task(tasks[rollout["responses_create_params"]["input"][-1]["content"]])
        data = ENV.parse_task(t)
        state, transcript, outputs = ENV.setup(t, data), list(t.messages), []
        for msg in input_to_messages(rollout["response"]["output"]):
            if msg.role == "tool":
                continue  # the server's own replies stand in for the recorded ones
            transcript.append(msg)
            for call in msg.tool_calls or ():
                result = await run_tool_call(ENV, t, data, state, call)
                state = result.state
                transcript.append(result.message)
                outputs.append(json.loads(result.message.content or ""))
        score = await verify_episode(ENV, data, transcript, state, VerifyContext("recorded"))
        assert not score.masked, score.details
        assert score.reward == rollout["reward"]
        rewards.append(score.reward)
        recorded = [json.loads(o["output"]) for o in rollout["response"]["output"]
                    if o["type"] == "function_call_output"]
        assert outputs == recorded and outputs  # {"detail": "Not Found"}, as NeMo Gym's agent saw it
        assert state[INSTANCE_KEY]
    assert sorted(set(rewards)) == [0.0, 1.0]  # both verdicts are exercised


async def test_a_server_that_dies_fails_or_masks_the_episodes_it_served_and_is_restarted() -> None:
    row = _jsonl("example.jsonl")[0]
    t = _task(row)
    data = ENV.parse_task(t)
    first = await run_tool_call(ENV, t, data, {}, _call("live_giveaways_by_type", {"type": "beta"}))
    spec = managed.Spec.of("xlam_fc", None, None)
    old_pid, old_instance = _pid(spec), first.state[INSTANCE_KEY]
    os.killpg(old_pid, signal.SIGKILL)
    managed.managed(spec).proc.wait(timeout=10)  # type: ignore[union-attr]
    with pytest.raises(GymflowError, match="xlam_fc was restarted.*session is lost") as lost:
        await ENV.call_tool(data, first.state, "live_giveaways_by_type", {"type": "game"})
    assert lost.value.failure_type == "environment_error"
    answer = [*t.messages, ChatMessage(role="assistant", tool_calls=(_call("live_giveaways_by_type",
                                                                           {"type": "beta"}),)), first.message]
    score = await verify_episode(ENV, data, answer, first.state, VerifyContext("p"))
    assert score.masked and score.reward is None and score.failure_type == "verifier_crashed"
    assert "session is lost" in score.details["error"]
    # A new episode runs on the restarted server.
    fresh = await run_tool_call(ENV, t, data, {}, _call("live_giveaways_by_type", {"type": "beta"}))
    assert fresh.state[INSTANCE_KEY] not in ("", old_instance) and _pid(spec) != old_pid
    assert json.loads(fresh.message.content or "") == {"detail": "Not Found"}


def test_rows_for_servers_that_cannot_run_here_are_refused_before_anything_starts() -> None:
    before = dict(managed._SERVERS)
    row = _jsonl("example.jsonl")[0]
    with pytest.raises(TaskError, match="resources_server: .*'no_such_server' is not installed"):
        ENV.parse_task(_task(row, resources_server="no_such_server"))
    sandboxed = next(i for i in catalogue.catalogue(catalogue.python()).values()
                     if i.refusal and "sandbox" in i.refusal)
    with pytest.raises(TaskError, match=f"{sandboxed.name} cannot run here: needs a sandbox provider"):
        ENV.parse_task(_task(row, resources_server=sandboxed.name))
    with pytest.raises(TaskError, match="resources_server_config: 'other.yaml' is not one of xlam_fc's configs"):
        ENV.parse_task(_task(row, resources_server_config="other.yaml"))
    assert managed._SERVERS == before


async def test_a_server_that_cannot_start_is_typed_with_the_fix_and_masks_verify() -> None:
    row = _jsonl("example.jsonl")[0]
    t = _task(row, resources_server_overrides={"extra_value": "${nobody_set_this}"})
    data = ENV.parse_task(t)
    with pytest.raises(ConfigError, match=r"xlam_fc did not start \(it exited with code 3\); fix: fix the config "
                                          r"value.*nobody_set_this"):
        await ENV.call_tool(data, {}, "live_giveaways_by_type", {"type": "beta"})
    score = await verify_episode(ENV, data, list(t.messages), {}, VerifyContext("p"))
    assert score.masked and score.reward is None and "did not start" in score.details["error"]
    missing = next((i for i in catalogue.catalogue(catalogue.python()).values()
                    if i.refusal and "not installed" in i.refusal), None)
    if missing is not None:  # a missing package: refused with the pip command, nothing spawned
        with pytest.raises(ConfigError, match=r"cannot run here: .*packages not installed"
                                              r".*gymflow env nemo-gym-install"):
            await managed.managed(managed.Spec.of(missing.name, None, None)).ensure()


async def test_stopping_leaves_no_server_behind() -> None:
    url, _ = await managed.managed(managed.Spec.of("xlam_fc", None, None)).ensure()
    pid = _pid(managed.Spec.of("xlam_fc", None, None))
    managed.stop_all()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert url.startswith("http://127.0.0.1:")


def test_the_cli_lists_the_catalogue_and_checks_a_servers_example_rows() -> None:
    from gymflow.cli.env_cmd import env

    runner = CliRunner()
    listed = runner.invoke(env, ["list", "--nemo-gym"])
    assert listed.exit_code == 0, listed.output
    lines = {line.split("│")[1].strip(): line for line in listed.output.splitlines() if line.count("│") >= 4}
    assert "yes" in lines["xlam_fc"]
    sandboxed = next(n for n, i in catalogue.catalogue(catalogue.python()).items() if i.refusal
                     and "sandbox" in i.refusal)
    assert "no" in lines[sandboxed] and "sandbox" in lines[sandboxed]
    assert "can run here" in listed.output
    checked = runner.invoke(env, ["check", "nemo_gym", "--server", "xlam_fc"])
    assert checked.exit_code == 0, checked.output
    assert "5 lines: 5 ok, 0 failed" in checked.output
    refused = runner.invoke(env, ["check", "nemo_gym", "--server", sandboxed])
    assert refused.exit_code == 1 and "needs a sandbox provider" in refused.output


@pytest.mark.integration
async def test_a_durable_rollout_runs_on_a_server_the_env_worker_started(gf: Any, scripted: Any, sql: Any,
                                                                        run_id: str) -> None:
    """Temporal, the env pool and Postgres: the env worker starts xlam_fc; both 404s reach the model; scored 1."""
    from gymflow.testing.scripted_openai import Reply, text

    scripted.script(Reply(content=None, tool_calls=[("live_giveaways_by_type", '{"type": "beta"}'),
                                                    ("live_giveaways_by_type", '{"type": "game"}')]),
                    text("Here are the giveaways."))
    summary = await gf.run_rollout(gf.make_input(run_id, _task(_jsonl("example.jsonl")[0]), 0, "policy",
                                                 max_turns=4))
    assert summary.status == "completed" and summary.reward == 1.0 and summary.tool_calls == 2
    (transcript,) = sql("SELECT transcript FROM rollouts WHERE id = %s", summary.rollout_id)[0]
    assert [json.loads(m["content"]) for m in transcript if m["role"] == "tool"] == [{"detail": "Not Found"}] * 2

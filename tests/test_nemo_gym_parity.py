"""nemo_gym against the real thing: NeMo Gym 0.7.0's weather, string-match, math and circle-count (an image prompt)
resources servers, started as NeMo Gym starts them, score NeMo Gym's recorded rollouts through the adapter (tool
calls included) exactly as recorded and exactly as the same server's /verify scores them when driven directly.

NeMo Gym needs Python >= 3.13. Point GYMFLOW_NEMO_GYM_PYTHON at a python with `nemo-gym==0.7.0` and
`math-verify==0.8.0` installed (default: .nemo313/bin/python in the repository, which .ci/run creates); without
one the module is skipped, unless GYMFLOW_REQUIRE_NEMO_GYM=1 (CI), where it fails.
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
from gymflow.activities.env_activities import run_tool_call, verify_episode
from gymflow.environments.base import VerifyContext
from gymflow.environments.nemo_gym import NemoGymEnvironment
from gymflow.environments.nemo_gym_http import url_env_var
from gymflow.workers.local_stack import free_port

from gymflow.data.datasets import row_to_task
from gymflow.data.prepare import conversation_key
from gymflow.kernel.responses_format import input_to_messages
from tests.conftest import SHARED

PYTHON = os.environ.get("GYMFLOW_NEMO_GYM_PYTHON") or str(Path(__file__).resolve().parents[1] / ".nemo313/bin/python")
# server name -> its config beyond entrypoint/host/port (NeMo Gym's own yaml values; no judge for math)
SERVERS: dict[str, dict[str, Any]] = {
    "example_single_tool_call": {"domain": "agent"},
    "string_match": {"domain": "knowledge"},
    # Row 1's true answer takes 4-9 s of SymPy on a loaded 2-core box: more than the default 10 s is needed.
    "math_with_judge": {"domain": "math", "should_use_judge": False, "judge_responses_create_params": {"input": []},
                        "judge_model_server": {"type": "responses_api_models", "name": "judge"},
                        "library_verifier_timeout_seconds": 60},
    # Image prompts (input_image parts): the adapter must send the row's input back as recorded.
    "circle_count": {"domain": "other"},
}
START_TIMEOUT_S = 120
WRONG = "I am not sure.\nNo answer."  # a replacement final answer no verifier here accepts
# math-verify gives each SymPy comparison 5 s inside the server (not configurable); on a loaded box math row 1's
# true answer can run past it and score 0 there, NeMo Gym's own verdict then. Repeats usually settle it.
SLOW_SYMPY_TRIES = 3


def _probe() -> tuple[Path | None, str]:
    """The installed `resources_servers` folder, or why there is none."""
    if not Path(PYTHON).exists():
        return None, (f"no NeMo Gym python at {PYTHON}: run .ci/run, which creates it, or set GYMFLOW_NEMO_GYM_PYTHON "
                      "to a Python 3.13 with nemo-gym==0.7.0 and math-verify==0.8.0 (README.md, under `.ci/run`)")
    code = ("import importlib, pathlib, resources_servers as r\n"
            f"[importlib.import_module(f'resources_servers.{{n}}.app') for n in {list(SERVERS)!r}]\n"
            "print(pathlib.Path(list(r.__path__)[0]))")
    try:
        done = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"{PYTHON} cannot import NeMo Gym's servers: {e}"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        return None, f"{PYTHON} cannot import NeMo Gym's servers ({last}); pip install nemo-gym==0.7.0 math-verify"
    return Path(done.stdout.strip()), ""


SERVERS_DIR, WHY = _probe()
if SERVERS_DIR is None and os.environ.get("GYMFLOW_REQUIRE_NEMO_GYM") == "1":
    raise RuntimeError(f"GYMFLOW_REQUIRE_NEMO_GYM=1 but {WHY}")
# One test process runs the whole module (`--dist loadgroup`): its servers start once, not once per process.
pytestmark = [pytest.mark.skipif(SERVERS_DIR is None, reason=WHY), pytest.mark.xdist_group("nemo_gym_parity")]


def _start(name: str, log: Path) -> tuple[subprocess.Popen, str]:
    """`python app.py` in the server's folder with the config NeMo Gym's `ng_run` hands its children."""
    assert SERVERS_DIR is not None
    port = free_port()
    config = {"head_server": {"host": "127.0.0.1", "port": free_port()}, "dry_run": False,
              name: {"resources_servers": {name: {"entrypoint": "app.py", "host": "127.0.0.1", "port": port,
                                                  **SERVERS[name]}}}}
    env = {**os.environ, "NEMO_GYM_CONFIG_DICT": json.dumps(config), "NEMO_GYM_CONFIG_PATH": name}
    with log.open("wb") as out:
        proc = subprocess.Popen([PYTHON, "app.py"], cwd=SERVERS_DIR / name, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    return proc, f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    logs = tmp_path_factory.mktemp("nemo_gym_servers")
    started = {name: _start(name, logs / f"{name}.log") for name in SERVERS}
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        for name, (proc, url) in started.items():
            while True:
                try:
                    if httpx.get(url + "/health", timeout=2, trust_env=False).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    tail = (logs / f"{name}.log").read_text(errors="replace")[-2000:]
                    pytest.fail(f"NeMo Gym server {name} did not start:\n{tail}")
                time.sleep(0.5)
        yield {name: url for name, (_, url) in started.items()}
    finally:
        for proc, _ in started.values():
            proc.terminate()
        for proc, _ in started.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _cases(server: str, folder: Path) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(task row, recorded rollout) pairs, matched by conversation (content parts compared with sorted keys)."""
    def key(row: dict[str, Any]) -> str:
        return json.dumps(json.loads(conversation_key(row["responses_create_params"]["input"])), sort_keys=True)

    tasks = {key(t): t for t in _jsonl(folder / "example.jsonl")}
    pairs = [(tasks[key(r)], r) for r in _jsonl(folder / "example_rollouts.jsonl")]
    assert len(pairs) == 5, server
    return pairs


def _all_cases() -> list[Any]:
    folders = {"example_single_tool_call": SHARED / "example_single_tool_call",
               "math_with_judge": SHARED / "math_with_judge"}
    if SERVERS_DIR is not None:
        folders["string_match"] = SERVERS_DIR / "string_match" / "data"  # the server's own examples, from the wheel
        folders["circle_count"] = SERVERS_DIR / "circle_count" / "data"
    return [pytest.param(server, i, task, rollout, id=f"{server}-{i}")
            for server, folder in folders.items() for i, (task, rollout) in enumerate(_cases(server, folder))]


def _with_final_answer(response: dict[str, Any], text: str) -> dict[str, Any]:
    """The recorded response with its last assistant message's text replaced."""
    output = json.loads(json.dumps(response["output"]))
    last = next(o for o in reversed(output) if o.get("type") == "message")
    last["content"] = [{"type": "output_text", "text": text, "annotations": []}]
    return {**response, "output": output}


def _right_answer(task: dict[str, Any]) -> str:
    """A final answer the row's verifier accepts: its expected answer, or for circle_count the circles counted."""
    if "expected_answer" in task:
        return f"\\boxed{{{task['expected_answer']}}}"
    return f"\\boxed{{{sum(c['color'] == task['target_color'] for c in task['circles'])}}}"


async def _direct(url: str, task: dict[str, Any], response: dict[str, Any]) -> float:
    """The server driven as NeMo Gym's simple agent drives it: seed with the row, verify row + response."""
    async with httpx.AsyncClient(base_url=url, timeout=60, trust_env=False) as client:
        seed = await client.post("/seed_session", json=task)
        seed.raise_for_status()
        client.cookies = seed.cookies
        verify = await client.post("/verify", json={**task, "response": response})
        verify.raise_for_status()
        return float(verify.json()["reward"])


async def _through_adapter(server: str, task: dict[str, Any], response: dict[str, Any]) -> tuple[float, list[str]]:
    """The recorded model turns replayed through the adapter: its own tool calls on the server, then verify."""
    env = NemoGymEnvironment()
    t = row_to_task({**task, "resources_server": server}, env="nemo_gym", default_id="parity")
    data = env.parse_task(t)
    state, transcript, outputs = env.setup(t, data), list(t.messages), []
    for msg in input_to_messages(response["output"]):
        if msg.role == "tool":
            continue  # the adapter's tool results stand in for the recorded ones
        transcript.append(msg)
        for call in msg.tool_calls or ():
            result = await run_tool_call(env, t, data, state, call)
            assert not result.is_error, result.message.content
            state = result.state
            transcript.append(result.message)
            outputs.append(result.message.content or "")
    score = await verify_episode(env, data, transcript, state, VerifyContext("recorded"))
    assert not score.masked, score.details
    assert score.reward is not None
    return score.reward, outputs


@pytest.mark.parametrize("server, index, task, rollout", _all_cases())
async def test_recorded_rollouts_score_as_nemo_gym_scored_them(servers: dict[str, str], server: str, index: int,
                                                              task: dict[str, Any], rollout: dict[str, Any],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(url_env_var(server), servers[server])
    recorded = float(rollout["reward"])
    tries = []
    for _ in range(SLOW_SYMPY_TRIES):
        direct = await _direct(servers[server], task, rollout["response"])
        reward, tool_outputs = await _through_adapter(server, task, rollout["response"])
        tries.append((direct, reward))
        if direct == reward == recorded:
            break
    if (direct, reward) != (recorded, recorded) and server == "math_with_judge":
        # math-verify's 5 s SymPy limit can run out on a loaded machine, on either path, in any try: the
        # server then scores 0 where it recorded 1. Only that is excused; any other disagreement fails.
        assert all(score in (recorded, 0.0) for pair in tries for score in pair), tries
        pytest.xfail(f"{server} scored {tries} over {len(tries)} tries, recorded {recorded}: math-verify's 5 s "
                     f"SymPy limit ran out on a loaded machine")
    assert reward == direct  # the adapter agrees with the server driven directly
    assert reward == recorded
    # The tools ran on the server: their outputs equal the recorded ones (as JSON; spacing differs by version).
    expected = [json.loads(o["output"]) for o in rollout["response"]["output"] if o["type"] == "function_call_output"]
    assert [json.loads(o) for o in tool_outputs] == expected


@pytest.mark.parametrize("server, index, task, rollout", [c for c in _all_cases()
                                                         if c.values[0] != "example_single_tool_call"])
async def test_a_changed_answer_scores_as_the_server_scores_it(servers: dict[str, str], server: str, index: int,
                                                               task: dict[str, Any], rollout: dict[str, Any],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(url_env_var(server), servers[server])
    got = []
    for text in (WRONG, _right_answer(task)):
        changed = _with_final_answer(rollout["response"], text)
        for _ in range(SLOW_SYMPY_TRIES):
            direct = await _direct(servers[server], task, changed)
            reward, _ = await _through_adapter(server, task, changed)
            if reward == direct:
                break
        assert reward == direct
        got.append(reward)
    assert got[0] == 0.0

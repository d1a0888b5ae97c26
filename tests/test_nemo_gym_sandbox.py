"""gymflow's sandbox as NeMo Gym's sandbox provider (environments/nemo_gym_sandbox_provider.py and
environments/nemo_gym_sandbox_exec.py).

The exec step alone (each command in bubblewrap, the files restored, limits typed); then NeMo Gym 0.7.0's own
litmus_agent, whose code-exec tool makes a sandbox through NeMo Gym's sandbox API: started by the env worker with
gymflow's sandbox in place of the opensandbox its config names, driven through Temporal, the pools and Postgres.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
from typing import Any

import pytest
from gymflow.environments.nemo_gym_http import url_env_var

from gymflow.data.datasets import row_to_task
from tests.test_nemo_gym_gymnasium import SERVERS_DIR, needs_nemo

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")


def _exec(request: dict[str, Any]) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "gymflow.environments.nemo_gym_sandbox_exec"],
                          input=json.dumps(request).encode(), capture_output=True, timeout=120)
    return json.loads(done.stdout)


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@needs_bwrap
def test_a_command_runs_with_its_files_and_env_and_sees_nothing_of_the_host() -> None:
    got = _exec({"command": "python3 /tmp/cell.py; ls /work /root 2>&1 | wc -l", "env": {"CELL": "6*7"},
                 "files": {"/tmp/cell.py": _b64("import os; print(eval(os.environ['CELL']))")}})
    assert got["stdout"].split() == ["42", "2"] and got["return_code"] == 0 and got["error_type"] is None


@needs_bwrap
def test_a_command_past_its_limits_is_stopped_and_typed_not_left_running() -> None:
    slow = _exec({"command": "sleep 30", "timeout_s": 1})
    assert (slow["return_code"], slow["error_type"]) == (125, "timeout")
    assert "over its time limit (1 s)" in slow["stderr"]
    net = _exec({"command": "python3 -c \"import socket; socket.create_connection(('1.1.1.1', 53), timeout=2)\""})
    assert net["return_code"] != 0 and "Network is unreachable" in net["stderr"] + net["stdout"]


@pytest.mark.parametrize("raw, says", [
    (json.dumps({"command": "true", "files": {"/etc/passwd": ""}}), "not a file path under /tmp or /sandbox"),
    (json.dumps({"command": "true", "files": {"/tmp/../etc/x": ""}}), "not a file path"),
    (json.dumps({"command": "true", "env": {"A=B": "c"}}), "env:"),
    (json.dumps({"command": "a\0b"}), "NUL"),
    ('{"command": "true", "timeout_s": Infinity}', "positive numbers"),  # not JSON: what a hostile caller writes
    (json.dumps({"files": {}}), "`command` string"),
])
def test_a_bad_request_is_refused_by_name_before_anything_runs(raw: str, says: str) -> None:
    done = subprocess.run([sys.executable, "-m", "gymflow.environments.nemo_gym_sandbox_exec"], input=raw.encode(),
                          capture_output=True, timeout=60)
    got = json.loads(done.stdout)
    assert got["return_code"] == 125 and got["error_type"] == "bad_request" and says in got["stderr"]


SERVER = "litmus_agent"
CODE_TOOL = {"type": "function", "name": "stateful_python_code_exec", "description": "Run a Python cell.",
             "strict": False,
             "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}}


@needs_nemo
@needs_bwrap
@pytest.mark.integration
async def test_a_server_that_makes_sandboxes_gets_gymflows_and_scores(gf: Any, scripted: Any, sql: Any,
                                                                    run_id: str) -> None:
    """litmus_agent's config names opensandbox (a cluster service); the managed server gets gymflow's sandbox
    instead: the model's cells run there (state kept as the server keeps it, by replaying cells), the host and
    the network are out of reach, a cell past the server's time limit is stopped, and the episode is scored."""
    from gymflow.environments import nemo_gym_server as managed

    from gymflow.testing.scripted_openai import text, tool_call

    assert SERVERS_DIR is not None
    task = json.loads((SERVERS_DIR / SERVER / "data" / "example.jsonl").read_text().splitlines()[0])
    assert task["expected_answer"] == "3" and "double parentheses" in task["responses_create_params"]["input"][0][
        "content"]
    task["responses_create_params"]["tools"] = [CODE_TOOL]
    os.environ.pop(url_env_var(SERVER), None)  # gymflow runs it
    cells = ["atoms = len('CCO')", "print(atoms)", "print(open('/work/main/README.md').read())",
             "while True: pass"]
    try:
        scripted.script(*(tool_call("stateful_python_code_exec", {"code": c}) for c in cells),
                        text("Ethanol has ((3)) heavy atoms."))
        row = {**task, "resources_server": SERVER, "resources_server_overrides": {"code_exec_timeout_s": 2}}
        t = row_to_task(row, env="nemo_gym", default_id="lit0")
        summary = await gf.run_rollout(gf.make_input(run_id, t, 0, "policy", max_turns=8))
        transcript, details = sql("SELECT transcript, score_details FROM rollouts WHERE id = %s",
                                  summary.rollout_id)[0]
        assert summary.status == "completed" and summary.reward == 1.0, details
        defined, printed, host, spin = (m["content"] for m in transcript if m["role"] == "tool")
        assert (defined, printed.strip()) == ("", "3")
        assert "FileNotFoundError" in host and "README" in host
        assert "gymflow sandbox: stopped: over its time limit (2 s)" in spin
    finally:
        managed.stop_all()


@needs_nemo
async def test_an_image_gymflow_cannot_stand_in_for_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    from gymflow.environments import nemo_gym_server as managed
    from gymflow.environments.nemo_gym import NemoGymEnvironment

    assert SERVERS_DIR is not None
    task = json.loads((SERVERS_DIR / SERVER / "data" / "example.jsonl").read_text().splitlines()[0])
    task["responses_create_params"]["tools"] = [CODE_TOOL]
    monkeypatch.delenv(url_env_var(SERVER), raising=False)
    overrides = {"sandbox_spec": {"image": "docker.io/swerebenchv2/some-repo:1", "workdir": "/tmp"}}
    env = NemoGymEnvironment()
    t = row_to_task({**task, "resources_server": SERVER, "resources_server_overrides": overrides}, env="nemo_gym",
                    default_id="img")
    data = env.parse_task(t)
    try:
        out = await env.call_tool(data, env.setup(t, data), "stateful_python_code_exec", {"code": "1"})
        assert "not container images" in out.content and "docker.io/swerebenchv2/some-repo:1" in out.content
    finally:
        managed.stop_all()

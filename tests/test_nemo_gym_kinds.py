"""CI's guard on the nemo_gym adapter, one NeMo Gym 0.7.0 server of each kind the other parity tests leave out:
a stateful session, a multi-step tool-using agent, an LLM judge (a fake judge with fixed verdicts, the same on both
sides); single-turn verifiers and single tool calls are tests/test_nemo_gym_parity.py's, a server with no tool
routes tests/test_nemo_gym_managed.py's. Each server's own recorded rollouts are scored by NeMo Gym's own server code
driven as its simple agent drives it (bench.nemo_gym_catalogue's `nemo_verdicts`) and through the adapter, which
starts the server itself and replays the recorded model turns (its tool calls run on the server again); both must
give the same reward on every row. The full-stack version of this, over the whole catalogue, is
`python -m bench.nemo_gym_catalogue` (docs/nemo-gym-catalogue.md)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gymflow.activities.env_activities import run_tool_call, verify_episode
from gymflow.environments import nemo_gym_catalogue as catalogue
from gymflow.environments import nemo_gym_server as managed
from gymflow.environments.base import VerifyContext
from gymflow.environments.nemo_gym import NemoGymEnvironment

from gymflow.data.datasets import row_to_task
from gymflow.kernel.errors import ConfigError
from gymflow.kernel.responses_format import input_to_messages

KINDS = {
    "example_session_state_mgmt": "stateful session (seeded state, read back by verify)",
    "example_multi_step": "multi-step tool use",
    "equivalence_llm_judge": "LLM judge (the fake judge)",
}
ROWS = 2  # per server: the suite's time budget (each server starts twice: NeMo Gym's side, then the adapter's)

try:
    catalogue.python()
    WHY = ""
except ConfigError as e:
    WHY = str(e)
if WHY and os.environ.get("GYMFLOW_REQUIRE_NEMO_GYM") == "1":
    raise RuntimeError(f"GYMFLOW_REQUIRE_NEMO_GYM=1 but {WHY}")
pytestmark = pytest.mark.skipif(bool(WHY), reason=WHY)


@pytest.fixture(scope="module")
def judge_url() -> Iterator[str]:
    from bench.catalogue_plan import start_judge

    server, url = start_judge()
    yield url
    server.shutdown()


@pytest.fixture(autouse=True, scope="module")
def _servers_stop_with_the_module() -> Iterator[None]:
    yield
    managed.stop_all()


async def _through_adapter(row: dict[str, Any], response: dict[str, Any]) -> float | None:
    env = NemoGymEnvironment()
    task = row_to_task(row, env="nemo_gym", default_id="kind")
    data = env.parse_task(task)
    state, transcript = env.setup(task, data), list(task.messages)
    for msg in input_to_messages(response.get("output") or []):
        if msg.role == "tool":
            continue  # the server's own replies stand in for the recorded ones
        transcript.append(msg)
        for call in msg.tool_calls or ():
            result = await run_tool_call(env, task, data, state, call)
            state = result.state
            transcript.append(result.message)
    score = await verify_episode(env, data, transcript, state, VerifyContext("recorded"))
    assert not score.masked, score.details
    return score.reward


@pytest.mark.parametrize("server", list(KINDS), ids=[f"{s} ({k})" for s, k in KINDS.items()])
async def test_each_kind_scores_as_nemo_gym_scores_it(server: str, judge_url: str, tmp_path: Path) -> None:
    from bench.catalogue_plan import plan
    from bench.catalogue_verdicts import nemo_verdicts

    p = plan(catalogue.server(server), tmp_path, judge_url, ROWS)
    assert p.not_runnable is None and len(p.rows) == ROWS, p.not_runnable
    nemo = await nemo_verdicts(p)
    assert "start_error" not in nemo, nemo
    expected = [r.get("reward") for r in nemo["rows"]]
    assert None not in expected, nemo["rows"]
    got = [await _through_adapter(row, rec["response"]) for row, rec in zip(p.rows, p.recorded, strict=True)]
    assert got == expected

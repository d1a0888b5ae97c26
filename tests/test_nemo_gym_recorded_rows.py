"""nemo_gym on a replayed NeMo Gym rollout file: a rollout row is the verify reply NeMo Gym recorded, so it carries that
reply's own fields (`reward`, `mask_sample`, and the server's own: `judge_evaluations`, `extracted_answer`). The
adapter never sends them back (NeMo Gym's agent seeds and verifies with the task row, which has none): NeMo Gym
0.7.0's equivalence_llm_judge, whose request model allows extra fields and which builds its reply as
`Reply(**body.model_dump(), reward=r, judge_evaluations=...)`, answered such a row with HTTP 500 ("got multiple values
for keyword argument 'reward'", then '... judge_evaluations'). The server's own fields are read off its OpenAPI
schema (reply fields its request lacks). The real server runs with a fake judge given through `gymflow_model_urls`.

The real-server test needs NeMo Gym's Python (.nemo313, or $GYMFLOW_NEMO_GYM_PYTHON); skipped without one unless
GYMFLOW_REQUIRE_NEMO_GYM=1 (CI).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
from gymflow.activities.env_activities import verify_episode
from gymflow.environments import nemo_gym_catalogue as catalogue
from gymflow.environments import nemo_gym_server as managed
from gymflow.environments.base import VerifyContext
from gymflow.environments.nemo_gym import RECORDED_OUTCOME, NemoGymEnvironment

from bench.catalogue_plan import start_judge
from gymflow.data.datasets import row_to_task
from gymflow.kernel.errors import ConfigError
from gymflow.kernel.responses_format import input_to_messages

ENV = NemoGymEnvironment()
SERVER = "equivalence_llm_judge"


def _rollout_row() -> dict[str, Any]:
    return {"responses_create_params": {"input": [{"role": "user", "content": "2+2?"}], "tool_choice": "auto"},
            "expected_answer": "4", "reward": 1.0, "mask_sample": False, "failure_kind": None,
            "failure_reason": None, "extracted_answer": "4",
            "response": {"output": [{"type": "message", "role": "assistant", "content": [
                {"type": "output_text", "text": "4"}]}]}}


def test_a_rollout_rows_outcome_is_not_part_of_the_row_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GYMFLOW_NEMO_GYM_EQUIVALENCE_LLM_JUDGE_URL", "http://127.0.0.1:9")  # no server is needed
    task = row_to_task({**_rollout_row(), "resources_server": SERVER}, env="nemo_gym", default_id="t")
    row = ENV.parse_task(task).row()
    assert not RECORDED_OUTCOME & set(row)
    assert row["expected_answer"] == "4" and row["extracted_answer"] == "4"  # the task's own fields stay
    assert row["responses_create_params"]["input"][0]["content"] == "2+2?"


try:
    INFO = catalogue.server(SERVER)
    WHY = ""
except ConfigError as e:
    INFO, WHY = None, str(e)
if INFO is None and os.environ.get("GYMFLOW_REQUIRE_NEMO_GYM") == "1":
    raise RuntimeError(f"GYMFLOW_REQUIRE_NEMO_GYM=1 but {WHY}")
needs_nemo_gym = pytest.mark.skipif(INFO is None, reason=WHY)


@pytest.fixture(scope="module")
def judge_url() -> Iterator[str]:
    os.environ.pop("GYMFLOW_NEMO_GYM_EQUIVALENCE_LLM_JUDGE_URL", None)  # gymflow runs the server
    server, url = start_judge()
    yield url
    server.shutdown()
    managed.stop_all()


@needs_nemo_gym
async def test_a_recorded_judge_rollout_verifies_on_the_real_server(judge_url: str) -> None:
    assert INFO is not None
    line = (INFO.folder / "data" / "example_rollouts.jsonl").read_text().splitlines()[0]
    recorded = json.loads(line)
    assert "reward" in recorded  # the rollout row carries its outcome
    row = {**recorded, "resources_server": SERVER,
           "resources_server_overrides": {"gymflow_model_urls": {"policy_model": judge_url}}}
    task = row_to_task(row, env="nemo_gym", default_id="t")
    data = ENV.parse_task(task)
    transcript = [*task.messages, *input_to_messages(recorded["response"]["output"])]
    score = await verify_episode(ENV, data, transcript, ENV.setup(task, data), VerifyContext("recorded"))
    assert not score.masked, score.details
    assert score.reward == 1.0  # the fake judge says [[A=B]] to every comparison

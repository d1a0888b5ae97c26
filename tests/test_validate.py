"""`validate`: every example task's gold answer (or ground-truth calls) scores 1."""

from __future__ import annotations

import pytest
from gymflow.environments.registry import available, get_environment

from gymflow.data.datasets import load_jsonl
from tests.conftest import SHARED

FOLDERS = {"single_tool": "example_single_tool_call", "math_with_judge": "math_with_judge", "calendar": "calendar",
           "workplace_assistant": "workplace_assistant", "code_gen": "code_gen"}


def test_every_seed_environment_is_installed():
    assert set(FOLDERS) | {"reasoning_gym"} <= set(available())


@pytest.mark.parametrize("env_name", sorted(FOLDERS))
async def test_gold_answers_score_one(env_name):
    env = get_environment(env_name)
    tasks, errors = load_jsonl(SHARED / FOLDERS[env_name] / "example.jsonl", env=env_name)
    assert not errors
    scores = [await env.validate(t) for t in tasks]
    if env_name == "code_gen":  # NeMo Gym's code rows carry tests but no reference solution
        assert scores == [None] * 5
    else:
        assert [s.reward for s in scores] == [1.0] * 5, [s.details for s in scores]

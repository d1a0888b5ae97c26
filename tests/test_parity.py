"""Reward parity with NeMo Gym: its recorded rollouts, replayed through our workflow, tools and
verifiers on the real stack, score exactly the recorded reward (25 rows, 5 environments)."""

from __future__ import annotations

import json

import pytest

from gymflow.data.datasets import load_jsonl
from tests.parity import ENVS, recorded_model


@pytest.mark.parametrize("folder", list(ENVS))
async def test_recorded_rollouts_reproduce_nemo_gym_rewards(gf, parity_files, sql, run_id, folder):
    path = parity_files[folder]
    tasks, errors = load_jsonl(path, env=ENVS[folder])
    assert errors == [] and len(tasks) == 5
    expected = {t.id: float(json.loads(line)["reward"]) for t, line in zip(tasks, path.read_text().splitlines(),
                                                                             strict=True)}
    results = [r.summary async for r in gf.collect(run_id, tasks, n=1, model=recorded_model(folder), max_turns=50)]
    got = {s.task_id: s.reward for s in results}
    assert all(s.status == "completed" and not s.masked for s in results), [
        (s.task_id, s.failure_type, s.failure_message) for s in results]
    assert got == expected
    rows = dict(sql("SELECT task_id, reward FROM rollouts WHERE run_id = %s", run_id))
    assert rows == expected

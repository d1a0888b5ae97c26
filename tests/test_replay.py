"""Committed histories replay against today's workflow code: an edit that would break in-flight
rollouts (non-determinism) fails here before it merges. Re-record them only on a deliberate change."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from workflows.episode import EpisodeWorkflow
from workflows.rollout import RolloutWorkflow

HISTORIES = sorted((Path(__file__).parent / "histories").glob("*.json"))


@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
async def test_history_replays_deterministically(path: Path):
    history = WorkflowHistory.from_json(path.stem, path.read_text())
    replayer = Replayer(workflows=[RolloutWorkflow, EpisodeWorkflow], data_converter=pydantic_data_converter)
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, result.replay_failure


def test_histories_are_committed():
    assert len(HISTORIES) >= 2

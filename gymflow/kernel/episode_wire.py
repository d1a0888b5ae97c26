"""Wire types of the by-reference rollout workflow (`EpisodeWorkflow`, docs/design-episode-data.md).

Every payload here is ids, counters and short strings: its size does not depend on the number of turns, the
task's size or what the model and the tools produced. The episode's data lives in Postgres
(gymflow/kernel/store/episodes.py), written once by the activity that produced it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from gymflow.kernel.wire import RolloutInput, RolloutLimits, RolloutSummary, SamplingParams, Usage, Wire, rollout_id


class EpisodeRef(Wire):
    """Where an episode stands: its head message (which names the whole prefix) and the counters."""

    head_id: int
    turn: int = 0
    tool_calls: int = 0
    usage: Usage = Usage()
    attempts: int = 0
    started_at: datetime


class EpisodeInput(Wire):
    """The workflow's input: the task travels as (run, task id); the client stored it before starting."""

    run_id: str
    task_id: str
    env: str
    sample_index: int
    model: str
    sampling: SamplingParams = SamplingParams()
    max_turns: int = 8
    limits: RolloutLimits = RolloutLimits()
    turns_per_run: int | None = None
    episode: EpisodeRef | None = Field(None, description="Set when the workflow continued as new")
    placement: Literal["local", "pool"] = Field(
        "pool", description="Where begin, run_tools and finish run: local activities in the workflow pool, or "
                            "activities on the env pool (environments/base.py `placement`)")
    generate_placement: Literal["local", "pool"] = Field(
        "pool", description="Where generate runs: a local activity in the workflow pool, or an activity on the "
                            "model's generate queue (models.<name>.placement)")

    @property
    def rollout_id(self) -> str:
        return rollout_id(self.run_id, self.task_id, self.sample_index)


class BeginRequest(Wire):
    rollout_id: str
    run_id: str
    task_id: str
    sample_index: int
    model: str


class TurnRequest(Wire):
    """For `generate` (continue the chain at `head_id`) and `run_tools` (run the calls of `head_id`)."""

    rollout_id: str
    run_id: str
    task_id: str
    model: str
    turn: int
    head_id: int
    sampling: SamplingParams = SamplingParams()
    max_episode_bytes: int | None = None  # RolloutLimits.max_episode_bytes; None in histories from before it


class Generated(Wire):
    head_id: int
    tool_calls: int = 0
    finish_reason: str | None = None
    usage: Usage = Usage()
    attempt: int = 1


class ToolsRan(Wire):
    head_id: int
    calls: int  # calls run; calls not run after a terminal one are answered but not counted
    errors: int = 0
    done: bool = Field(False, description="A call ended the episode (a terminal tool, or the environment's "
                                          "own stop rule): verify next")


class Turned(Wire):
    """One turn in one activity: the model's reply, and the tools it called (None when it called none)."""

    generated: Generated
    ran: ToolsRan | None = None


class FinishRequest(Wire):
    """Verify (unless the rollout already failed) and persist, in one activity."""

    summary: RolloutSummary
    env: str
    model: str
    head_id: int | None
    verify: bool
    # The latency is measured here, by the clock: workflow time stands still within one workflow task, and with
    # generation local a whole episode can be one workflow task. None in histories recorded before.
    started_at: datetime | None = None


class Finished(Wire):
    reward: float | None = None
    masked: bool = False
    failure_type: str | None = None
    latency_s: float | None = None  # when the request had started_at


def episode_input(inp: RolloutInput, placement: Literal["local", "pool"] = "pool",
                  generate_placement: Literal["local", "pool"] = "pool") -> EpisodeInput:
    """The by-reference input for a rollout the client describes with its task (which it stores first). The
    run's sampling settings override the row's, as in the classic workflow."""
    sampling = inp.task.sampling.model_copy(update=inp.sampling.model_dump(exclude_none=True))
    return EpisodeInput(run_id=inp.run_id, task_id=inp.task.id, env=inp.task.env, sample_index=inp.sample_index,
                        model=inp.model, sampling=sampling, max_turns=inp.max_turns, limits=inp.limits,
                        turns_per_run=inp.turns_per_run, placement=placement,
                        generate_placement=generate_placement)

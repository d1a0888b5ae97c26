"""Wire types of the episode workflow (`EpisodeWorkflow`, docs/design-episode-data.md).

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
    # The placement rule (docs/architecture.md): every step is a local activity in the workflow pool unless the
    # environment declares the env pool (sandboxed, judged, remote) or the model the generate pool. With both
    # local, each turn is one local activity, the first also begins the episode and the last also finishes it.
    placement: Literal["local", "pool"] = Field(
        "local", description="Where begin, run_tools and finish run: local activities in the workflow pool (the "
                             "environment's code in its supervised processes), or activities on the env pool")
    generate_placement: Literal["local", "pool"] = Field(
        "local", description="Where generate runs: a local activity in the workflow pool, or an activity on the "
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
    # The run's start on Temporal's clock (workflow.info().workflow_start_time): with the run id, the fence of the
    # rollout's row (gymflow/kernel/store/fence.py).
    execution_started_at: datetime | None = None


class FinishPlan(Wire):
    """What a `turn` activity needs to finish the episode itself when it ends in that turn (no tool call, a
    call that ended it, or max_turns reached): one local activity less per episode."""

    episode: EpisodeRef  # the counters before this turn
    env: str
    sample_index: int
    max_turns: int
    # The run's start on Temporal's clock (workflow.info().workflow_start_time): with the run id, the fence of the
    # rollout's row (gymflow/kernel/store/fence.py).
    execution_started_at: datetime | None = None


class TurnRequest(Wire):
    """For `generate` (continue the chain at `head_id`) and `run_tools` (run the calls of `head_id`); for `turn`,
    optionally begin the episode first (`begin`: then `head_id` is unused) and finish it after (`finish`)."""

    rollout_id: str
    run_id: str
    task_id: str
    model: str
    turn: int
    head_id: int
    sampling: SamplingParams = SamplingParams()
    max_episode_bytes: int | None = None  # RolloutLimits.max_episode_bytes
    max_reply_chars: int | None = None  # RolloutLimits.max_reply_chars
    max_tool_calls_per_turn: int | None = None  # RolloutLimits.max_tool_calls_per_turn
    begin: BeginRequest | None = None
    finish: FinishPlan | None = None


class Generated(Wire):
    head_id: int
    tool_calls: int = 0
    finish_reason: str | None = None
    usage: Usage = Usage()
    attempt: int = 1
    responds: bool = False  # a turn without tool calls that the environment answers (Environment.respond)


class ToolsRan(Wire):
    head_id: int
    calls: int  # calls run; calls not run after a terminal one are answered but not counted
    errors: int = 0
    done: bool = Field(False, description="A call ended the episode (a terminal tool, or the environment's "
                                          "own stop rule): verify next")


class Turned(Wire):
    """One turn in one activity: the model's reply, and the tools it called (None when it called none); and when
    the request asked to finish and the episode ended in this turn, the finish's result."""

    generated: Generated
    ran: ToolsRan | None = None
    finished: Finished | None = None


def advanced(ep: EpisodeRef, gen: Generated, ran: ToolsRan | None) -> EpisodeRef:
    """The episode after one turn: the reply, then its tool messages (when it called tools)."""
    ep = ep.model_copy(update={"head_id": gen.head_id, "turn": ep.turn + 1, "usage": ep.usage + gen.usage,
                               "attempts": ep.attempts + gen.attempt})
    return ep if ran is None else with_tools(ep, ran)


def with_tools(ep: EpisodeRef, ran: ToolsRan) -> EpisodeRef:
    """The episode after the tool messages of its head's calls."""
    return ep.model_copy(update={"head_id": ran.head_id, "tool_calls": ep.tool_calls + ran.calls})


def ends_after(ep: EpisodeRef, gen: Generated, ran: ToolsRan | None, max_turns: int) -> bool:
    """Whether the episode ends after this turn (`ep` is the episode after it): the workflow's loop condition."""
    return (not gen.tool_calls and not gen.responds) or (ran is not None and ran.done) or ep.turn >= max_turns


def episode_summary(*, rollout_id: str, run_id: str, task_id: str, sample_index: int, ep: EpisodeRef | None,
                    failure: tuple[str, str] | None, latency_s: float) -> RolloutSummary:
    """The rollout's summary from the episode's counters, before verification."""
    return RolloutSummary(
        rollout_id=rollout_id, run_id=run_id, task_id=task_id, sample_index=sample_index,
        status="failed" if failure else "completed", failure_type=failure[0] if failure else None,
        failure_message=failure[1] if failure else None, turns=ep.turn if ep else 0,
        tool_calls=ep.tool_calls if ep else 0, usage=ep.usage if ep else Usage(),
        attempts=ep.attempts if ep else 0, latency_s=latency_s)


class FinishRequest(Wire):
    """Verify (unless the rollout already failed) and persist, in one activity."""

    summary: RolloutSummary
    env: str
    model: str
    head_id: int | None
    verify: bool
    # The latency is measured here, by the clock: workflow time stands still within one workflow task, and with
    # generation local a whole episode can be one workflow task.
    started_at: datetime | None = None
    # The run's start on Temporal's clock (workflow.info().workflow_start_time): with the run id, the fence of the
    # rollout's row (gymflow/kernel/store/fence.py).
    execution_started_at: datetime | None = None


class Finished(Wire):
    reward: float | None = None
    masked: bool = False
    failure_type: str | None = None
    latency_s: float | None = None  # when the request had started_at


def episode_input(inp: RolloutInput, placement: Literal["local", "pool"] = "local",
                  generate_placement: Literal["local", "pool"] = "local") -> EpisodeInput:
    """The workflow's input for a rollout the client describes with its task (which it stores first). The run's
    sampling settings override the row's."""
    sampling = inp.task.sampling.model_copy(update=inp.sampling.model_dump(exclude_none=True))
    return EpisodeInput(run_id=inp.run_id, task_id=inp.task.id, env=inp.task.env, sample_index=inp.sample_index,
                        model=inp.model, sampling=sampling, max_turns=inp.max_turns, limits=inp.limits,
                        turns_per_run=inp.turns_per_run, placement=placement,
                        generate_placement=generate_placement)

"""RolloutWorkflow: one episode = setup, (generate, tool calls)* until no tool calls, max turns or a tool call
that ends the episode (environments/base.py), verify, persist. Activities are named, not imported: this module
pulls in nothing but wire types.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError, TimeoutError

with workflow.unsafe.imports_passed_through():
    from gymflow.kernel import names
    from gymflow.kernel.failures import (
        ACTIVITY_TIMEOUT,
        FAILURE_TYPES,
        INTERNAL_ERROR,
        TRANSCRIPT_TOO_LARGE,
        WORKFLOW_CANCELLED,
        known,
        short_message,
    )
    from gymflow.kernel.wire import (
        ActivityLimits,
        ChatMessage,
        EpisodeCheckpoint,
        EpisodeStart,
        GenerateRequest,
        GenerateResult,
        RolloutInput,
        RolloutRecord,
        RolloutSummary,
        Score,
        SetupRequest,
        ToolRequest,
        ToolResult,
        VerifyRequest,
        not_run_message,
    )


def activity_options(limits: ActivityLimits, queue: str) -> dict[str, Any]:
    """Every activity gets both timeouts and a bounded retry policy: the default retries forever."""
    return {
        "task_queue": queue,
        "start_to_close_timeout": timedelta(seconds=limits.start_to_close_s),
        "schedule_to_close_timeout": timedelta(seconds=limits.schedule_to_close_s),
        "heartbeat_timeout": timedelta(seconds=limits.heartbeat_s) if limits.heartbeat_s else None,
        "retry_policy": RetryPolicy(
            initial_interval=timedelta(seconds=limits.initial_backoff_s), backoff_coefficient=2.0,
            maximum_interval=timedelta(seconds=limits.max_backoff_s), maximum_attempts=limits.max_attempts,
        ),
    }


def local_activity_options(limits: ActivityLimits) -> dict[str, Any]:
    """The same bounds for a local activity (it has no queue and no heartbeat: it runs inside the workflow
    task, which Temporal keeps alive while it runs)."""
    opts = activity_options(limits, "")
    del opts["task_queue"], opts["heartbeat_timeout"]
    return opts


def failure_of(err: ActivityError) -> tuple[str, str]:
    """(failure_type, message) from an activity that failed for good: always a type of the closed set
    (gymflow/kernel/failures.py) and one short line. The activity boundary classifies; this is the net
    for what escaped it (an SDK error whose type is a Python class name, a cancellation)."""
    cause = err.cause
    if isinstance(cause, ApplicationError):
        if cause.type in FAILURE_TYPES:
            return cause.type, short_message(cause.message)
        detail = f"{cause.type}: {cause.message}" if cause.type else cause.message
        return INTERNAL_ERROR, short_message(f"{err.activity_type}: {detail}")
    if isinstance(cause, CancelledError):  # the workflow was cancelled while this activity ran
        return WORKFLOW_CANCELLED, f"{err.activity_type}: cancelled"
    if isinstance(cause, TimeoutError):
        return ACTIVITY_TIMEOUT, f"{err.activity_type}: {cause.type.name if cause.type else 'timeout'} timeout"
    return INTERNAL_ERROR, short_message(f"{err.activity_type}: {cause or err}")


def should_continue_as_new(turns_per_run: int | None, turns_here: int) -> bool:
    """After `turns_per_run` turns in this run, or whenever Temporal suggests it (history getting long)."""
    if turns_per_run is not None and turns_here >= turns_per_run:
        return True
    return workflow.info().is_continue_as_new_suggested()


class TranscriptTooLarge(Exception):
    """The episode outgrew what one Temporal payload can carry."""


def _size(message: ChatMessage) -> int:
    """A message's serialised size: what it adds to every later payload that carries the transcript."""
    return len(message.model_dump_json(exclude_none=True))


def _check_size(size: int, limit: int) -> None:
    if size > limit:
        raise TranscriptTooLarge(f"task and transcript are {size} bytes, over limits.max_transcript_bytes={limit}; "
                                 "shorten tool outputs or max_turns")


def _trim(ep: EpisodeCheckpoint, limit: int) -> EpisodeCheckpoint:
    """Drop the newest messages until the transcript fits, so the failure itself can still be recorded."""
    messages = list(ep.messages)
    size = sum(map(_size, messages))
    while messages and size > limit:
        size -= _size(messages.pop())
    return ep.model_copy(update={"messages": tuple(messages)})


@workflow.defn(name=names.ROLLOUT_WORKFLOW)
class RolloutWorkflow:
    def __init__(self) -> None:
        self._stage = "starting"
        self._turn = 0
        self._progress: EpisodeCheckpoint | None = None  # the episode so far, kept for failure records

    @workflow.query
    def stage(self) -> str:
        return f"{self._stage} (turn {self._turn})"

    def _enter(self, stage: str) -> None:
        self._stage = stage
        workflow.set_current_details(f"{stage}, turn {self._turn}")

    @workflow.run
    async def run(self, inp: RolloutInput) -> RolloutSummary:
        ep = inp.checkpoint
        started = ep.started_at if ep else workflow.now()
        score: Score | None = None
        failure: tuple[str, str] | None = None
        try:
            if ep is None:
                ep = await self._setup(inp, started)
            ep = await self._turns(inp, ep)
            self._enter("verify")
            score = await workflow.execute_activity(
                names.VERIFY, VerifyRequest(rollout_id=inp.rollout_id, task=inp.task, model=inp.model,
                                            messages=ep.messages, state=ep.state),
                result_type=Score, **activity_options(inp.limits.env, names.ENV_QUEUE))
        except ActivityError as err:
            failure = failure_of(err)
            ep = ep or EpisodeCheckpoint(messages=(), tools=(), started_at=started)
        except TranscriptTooLarge as err:
            failure = (TRANSCRIPT_TOO_LARGE, short_message(err))
            self._progress = _trim(self._progress or ep, inp.limits.max_transcript_bytes)
        return await self._finish(inp, self._progress or ep, score, failure)

    async def _setup(self, inp: RolloutInput, started: datetime) -> EpisodeCheckpoint:
        self._enter("setup")
        start = await workflow.execute_activity(
            names.SETUP_EPISODE, SetupRequest(rollout_id=inp.rollout_id, run_id=inp.run_id, task=inp.task,
                                              sample_index=inp.sample_index, model=inp.model),
            result_type=EpisodeStart, **activity_options(inp.limits.env, names.ENV_QUEUE))
        return EpisodeCheckpoint(messages=start.messages, tools=start.tools, state=start.state, started_at=started)

    async def _turns(self, inp: RolloutInput, ep: EpisodeCheckpoint) -> EpisodeCheckpoint:
        """Generate and run tools until the model stops calling tools, max turns, or the environment ends the
        episode; `_progress` tracks the episode so a failure mid-way still records the transcript so far."""
        self._turn, self._progress = ep.turn, ep
        # The run's sampling settings override the dataset row's.
        sampling = inp.task.sampling.model_copy(update=inp.sampling.model_dump(exclude_none=True))
        gen_opts = activity_options(inp.limits.generate, names.generate_queue(inp.model))
        env_opts = activity_options(inp.limits.env, names.ENV_QUEUE)
        turns_here = 0
        # What the largest payload carries: verify's input holds the task and the whole transcript. Kept as
        # messages are added, not re-measured every turn.
        size = len(inp.task.model_dump_json(exclude_none=True)) + sum(map(_size, ep.messages))
        while self._turn < inp.max_turns:
            if turns_here and should_continue_as_new(inp.turns_per_run, turns_here):
                # History grows with every turn's transcript; carry the episode into a fresh run.
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(inp.model_copy(update={"checkpoint": self._progress}))
            _check_size(size, inp.limits.max_transcript_bytes)
            self._enter("generate")
            gen = await workflow.execute_activity(
                names.GENERATE,
                GenerateRequest(rollout_id=inp.rollout_id, task_id=inp.task.id, turn=self._turn, model=inp.model,
                                messages=ep.messages, tools=ep.tools, sampling=sampling),
                result_type=GenerateResult, **gen_opts)
            self._turn, turns_here = self._turn + 1, turns_here + 1
            ep = self._progress = ep.model_copy(update={
                "messages": (*ep.messages, gen.message), "turn": self._turn, "usage": ep.usage + gen.usage,
                "attempts": ep.attempts + gen.attempt})
            size += _size(gen.message)
            if not gen.message.tool_calls:
                break
            self._enter("tools")
            ended_by: str | None = None
            for call in gen.message.tool_calls:
                if ended_by is not None:
                    # The environment ended the episode: later calls of the turn are answered, never run.
                    skipped = not_run_message(call, ended_by)
                    ep = self._progress = ep.model_copy(update={"messages": (*ep.messages, skipped)})
                    size += _size(skipped)
                    continue
                res = await workflow.execute_activity(
                    names.CALL_TOOL, ToolRequest(rollout_id=inp.rollout_id, task=inp.task, state=ep.state, call=call),
                    result_type=ToolResult, **env_opts)
                ep = self._progress = ep.model_copy(update={
                    "messages": (*ep.messages, res.message), "state": res.state, "tool_calls": ep.tool_calls + 1})
                size += _size(res.message)
                # Only a `done` result takes this branch: histories recorded before `done` existed replay as before.
                if res.done:
                    ended_by = call.function.name
            if ended_by is not None:
                break
        _check_size(size, inp.limits.max_transcript_bytes)  # the last answer too: verify carries it
        return ep

    async def _finish(self, inp: RolloutInput, ep: EpisodeCheckpoint, score: Score | None,
                      failure: tuple[str, str] | None) -> RolloutSummary:
        masked_type = known(score.failure_type) if score and score.failure_type else None
        summary = RolloutSummary(
            rollout_id=inp.rollout_id, run_id=inp.run_id, task_id=inp.task.id, sample_index=inp.sample_index,
            status="failed" if failure else "completed", reward=score.reward if score else None,
            masked=bool(score and score.masked), failure_type=failure[0] if failure else masked_type,
            failure_message=failure[1] if failure else None, turns=ep.turn, tool_calls=ep.tool_calls,
            usage=ep.usage, attempts=ep.attempts, latency_s=(workflow.now() - ep.started_at).total_seconds(),
        )
        self._enter("persist")
        try:
            await workflow.execute_activity(
                names.PERSIST_ROLLOUT,
                RolloutRecord(summary=summary, env=inp.task.env, model=inp.model, transcript=ep.messages,
                              score_details=score.details if score else {}),
                **activity_options(inp.limits.persist, names.ENV_QUEUE))
        except ActivityError as err:
            # Not recorded: fail typed (store_unavailable, short), so the client can record it once the
            # store is back; no summary in the details, which would tell the client it had been recorded.
            kind, message = failure_of(err)
            raise ApplicationError(message, type=kind, non_retryable=True) from None
        # "masked" is its own status in the UI, so unscorable episodes are one filter away.
        updates = [names.SA_STATUS.value_set("masked" if summary.masked else summary.status)]
        if summary.reward is not None:
            updates.append(names.SA_REWARD.value_set(summary.reward))
        workflow.upsert_search_attributes(updates)
        self._enter(summary.status)
        if failure:
            # Recorded above; now fail the execution so the UI and ALLOW_DUPLICATE_FAILED_ONLY see it.
            raise ApplicationError(failure[1], summary.model_dump(mode="json"), type=failure[0],
                                   non_retryable=True)
        return summary

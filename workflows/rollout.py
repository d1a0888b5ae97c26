"""RolloutWorkflow: one episode = setup, (generate, tool calls)* until no tool calls or max turns,
verify, persist. Activities are named, not imported: this module pulls in nothing but wire types.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, TimeoutError

with workflow.unsafe.imports_passed_through():
    from gymflow.kernel import names
    from gymflow.kernel.errors import ACTIVITY_TIMEOUT
    from gymflow.kernel.wire import (
        ActivityLimits,
        ChatMessage,
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
        Usage,
        VerifyRequest,
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


def failure_of(err: ActivityError) -> tuple[str, str]:
    """(failure_type, message) from an activity that failed for good."""
    cause = err.cause
    if isinstance(cause, ApplicationError):
        return cause.type or "activity_failed", cause.message
    if isinstance(cause, TimeoutError):
        return ACTIVITY_TIMEOUT, f"{err.activity_type}: {cause.type.name if cause.type else 'timeout'} timeout"
    return "activity_failed", f"{err.activity_type}: {cause or err}"


@workflow.defn(name=names.ROLLOUT_WORKFLOW)
class RolloutWorkflow:
    def __init__(self) -> None:
        self._stage = "starting"
        self._turn = 0

    @workflow.query
    def stage(self) -> str:
        return f"{self._stage} (turn {self._turn})"

    def _enter(self, stage: str) -> None:
        self._stage = stage
        workflow.set_current_details(f"{stage}, turn {self._turn}")

    @workflow.run
    async def run(self, inp: RolloutInput) -> RolloutSummary:
        started = workflow.now()
        rid = inp.rollout_id
        env_opts = activity_options(inp.limits.env, names.ENV_QUEUE)
        messages: list[ChatMessage] = []
        usage, attempts, tool_calls = Usage(), 0, 0
        score: Score | None = None
        failure: tuple[str, str] | None = None
        try:
            self._enter("setup")
            ep = await workflow.execute_activity(
                names.SETUP_EPISODE, SetupRequest(rollout_id=rid, run_id=inp.run_id, task=inp.task,
                                                  sample_index=inp.sample_index, model=inp.model),
                result_type=EpisodeStart, **env_opts)
            messages, state = list(ep.messages), ep.state
            # The run's sampling settings override the dataset row's.
            sampling = inp.task.sampling.model_copy(update=inp.sampling.model_dump(exclude_none=True))
            while self._turn < inp.max_turns:
                self._enter("generate")
                gen = await workflow.execute_activity(
                    names.GENERATE,
                    GenerateRequest(rollout_id=rid, task_id=inp.task.id, turn=self._turn, model=inp.model,
                                    messages=tuple(messages), tools=ep.tools, sampling=sampling),
                    result_type=GenerateResult, **activity_options(inp.limits.generate, names.GENERATE_QUEUE))
                self._turn += 1
                messages.append(gen.message)
                usage, attempts = usage + gen.usage, attempts + gen.attempt
                if not gen.message.tool_calls:
                    break
                self._enter("tools")
                for call in gen.message.tool_calls:
                    res = await workflow.execute_activity(
                        names.CALL_TOOL, ToolRequest(rollout_id=rid, task=inp.task, state=state, call=call),
                        result_type=ToolResult, **env_opts)
                    messages.append(res.message)
                    state, tool_calls = res.state, tool_calls + 1
            self._enter("verify")
            score = await workflow.execute_activity(
                names.VERIFY, VerifyRequest(rollout_id=rid, task=inp.task, model=inp.model,
                                            messages=tuple(messages), state=state),
                result_type=Score, **env_opts)
        except ActivityError as err:
            failure = failure_of(err)

        summary = RolloutSummary(
            rollout_id=rid, run_id=inp.run_id, task_id=inp.task.id, sample_index=inp.sample_index,
            status="failed" if failure else "completed", reward=score.reward if score else None,
            masked=bool(score and score.masked), failure_type=failure[0] if failure else (score and score.failure_type),
            failure_message=failure[1] if failure else None, turns=self._turn, tool_calls=tool_calls,
            usage=usage, attempts=attempts, latency_s=(workflow.now() - started).total_seconds(),
        )
        self._enter("persist")
        await workflow.execute_activity(
            names.PERSIST_ROLLOUT,
            RolloutRecord(summary=summary, env=inp.task.env, model=inp.model, transcript=tuple(messages),
                          score_details=score.details if score else {}),
            **activity_options(inp.limits.persist, names.ENV_QUEUE))
        updates = [names.SA_STATUS.value_set(summary.status)]
        if summary.reward is not None:
            updates.append(names.SA_REWARD.value_set(summary.reward))
        workflow.upsert_search_attributes(updates)
        self._enter(summary.status)
        if failure:
            # Recorded above; now fail the execution so the UI and ALLOW_DUPLICATE_FAILED_ONLY see it.
            raise ApplicationError(failure[1], summary.model_dump(mode="json"), type=failure[0],
                                   non_retryable=True)
        return summary

"""Resume failed rollouts inside the episode: reset each failed workflow to just before the activity
that failed it, so the steps that succeeded (setup, earlier turns, tool calls) are not run again.

Use it after fixing what failed (an endpoint that was down, a verifier bug in a redeployed worker).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import EventType, ResetReapplyExcludeType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.api.workflowservice.v1 import ResetWorkflowExecutionRequest
from temporalio.client import Client, WorkflowExecutionStatus

_FAILED_ACTIVITY = {
    EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED: "activity_task_failed_event_attributes",
    EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT: "activity_task_timed_out_event_attributes",
}


@dataclass(frozen=True)
class Resumed:
    workflow_id: str
    new_run_id: str | None
    reset_event_id: int | None
    note: str


def reset_point(events: Sequence[HistoryEvent]) -> int | None:
    """The WorkflowTaskCompleted that scheduled the activity whose failure ended the episode."""
    failed = [e for e in events if e.event_type in _FAILED_ACTIVITY]
    if not failed:
        return None
    last = failed[-1]
    scheduled = getattr(last, _FAILED_ACTIVITY[last.event_type]).scheduled_event_id
    completed = [e.event_id for e in events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
                 and e.event_id < scheduled]
    return max(completed) if completed else None


async def resume_workflow(client: Client, workflow_id: str, reason: str) -> Resumed:
    handle = client.get_workflow_handle(workflow_id)
    history = await handle.fetch_history()
    events = list(history.events)
    point = reset_point(events)
    if point is None:
        return Resumed(workflow_id, None, None, "no failed activity to resume from; rerun with --retry-failed")
    desc = await handle.describe()
    resp = await client.workflow_service.reset_workflow_execution(ResetWorkflowExecutionRequest(
        namespace=client.namespace,
        workflow_execution=WorkflowExecution(workflow_id=workflow_id, run_id=desc.run_id),
        reason=reason, request_id=str(uuid.uuid4()), workflow_task_finish_event_id=point,
        reset_reapply_exclude_types=[ResetReapplyExcludeType.RESET_REAPPLY_EXCLUDE_TYPE_SIGNAL],
    ))
    return Resumed(workflow_id, resp.run_id, point, "resumed")


def failed_query(run_id: str) -> str:
    return f"GymflowRun = '{run_id}' AND ExecutionStatus = 'Failed'"


async def failed_now(client: Client, run_id: str, *, limit: int = 10_000) -> list[str]:
    """Workflow ids of `run_id` whose latest run is failed, each once, in visibility order.

    Visibility lists every run: a rollout resumed before still shows its reset-away failed run (whose
    latest run may have completed), and one that failed twice shows two failed runs."""
    seen: set[str] = set()
    out: list[str] = []
    async for wf in client.list_workflows(failed_query(run_id), limit=limit):
        if wf.id in seen:
            continue
        seen.add(wf.id)
        latest = await client.get_workflow_handle(wf.id).describe()  # no run id: the current run
        if latest.status == WorkflowExecutionStatus.FAILED:
            out.append(wf.id)
    return out


async def resume_run(client: Client, run_id: str, *, reason: str, limit: int = 10_000) -> list[Resumed]:
    """Reset every rollout of `run_id` that is failed now (at most `limit`)."""
    return [await resume_workflow(client, wid, reason) for wid in await failed_now(client, run_id, limit=limit)]

"""Resume failed rollouts inside the episode: start each failed rollout's workflow again from the last step it
stored, so the steps that succeeded (setup, earlier turns, tool calls) are not run again.

The failed run's failure carries where its episode stood (workflows/episode.py: the head message and the
counters); the new run of the same workflow id starts there, as a continued-as-new run would. This works the same
whatever ran the failed step (a local activity in the workflow pool, or an activity on a pool), where a reset to
the failed activity would not: a local step has no activity event to reset to. The new run is a newer execution:
its record replaces the failed one's (gymflow/kernel/store/fence.py).

Use it after fixing what failed (an endpoint that was down, a verifier bug in a redeployed worker).
"""

from __future__ import annotations

from dataclasses import dataclass

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.common import WorkflowIDReusePolicy

from gymflow.kernel import names
from gymflow.kernel.episode_wire import EpisodeInput, EpisodeRef
from gymflow.kernel.wire import RolloutSummary


@dataclass(frozen=True)
class Resumed:
    workflow_id: str
    new_run_id: str | None
    from_turn: int | None  # the turn the new run starts at; None when nothing was resumed
    note: str


async def _failed_at(client: Client, workflow_id: str) -> tuple[EpisodeInput, EpisodeRef | None] | None:
    """The failed run's input and where its episode stood; None when its latest run did not fail."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    first, last = history.events[0], history.events[-1]
    if last.event_type != EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED:
        return None
    (inp,) = await client.data_converter.decode(
        first.workflow_execution_started_event_attributes.input.payloads, [EpisodeInput])
    failure = last.workflow_execution_failed_event_attributes.failure
    payloads = failure.application_failure_info.details.payloads
    details = await client.data_converter.decode(payloads) if payloads else []
    ref = EpisodeRef.model_validate(details[1]) if len(details) > 1 and details[1] else None
    return inp, ref


async def resume_workflow(client: Client, workflow_id: str, reason: str) -> Resumed:
    """Start the failed rollout `workflow_id` again from the last step its episode stored. `reason` is kept as the
    new run's memo, as Temporal keeps a reset's."""
    from gymflow.client import WORKFLOW_TIMEOUT

    found = await _failed_at(client, workflow_id)
    if found is None:
        return Resumed(workflow_id, None, None, "its latest run did not fail")
    inp, ref = found
    if ref is None:
        return Resumed(workflow_id, None, None, "it failed before its episode began; rerun with --retry-failed")
    desc = await client.get_workflow_handle(workflow_id).describe()
    handle = await client.start_workflow(
        names.EPISODE_WORKFLOW, inp.model_copy(update={"episode": ref}), id=workflow_id,
        task_queue=names.WORKFLOWS_QUEUE, result_type=RolloutSummary, execution_timeout=WORKFLOW_TIMEOUT,
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY, memo={"resumed": reason},
        search_attributes=desc.typed_search_attributes)
    return Resumed(workflow_id, handle.result_run_id, ref.turn, "resumed")


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

"""Options and failure mapping shared by the episode workflow's steps: both timeouts and a bounded retry policy on
every activity, and the net that turns whatever an activity failed with into a type of the closed set. Workflow
code: imports only the SDK and the kernel's names.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError, TimeoutError

with workflow.unsafe.imports_passed_through():
    from gymflow.kernel.failures import (
        ACTIVITY_TIMEOUT,
        FAILURE_TYPES,
        INTERNAL_ERROR,
        WORKFLOW_CANCELLED,
        short_message,
    )
    from gymflow.kernel.wire import ActivityLimits


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

"""Fenced persistence: a rollout's row belongs to one workflow execution (run) at a time, and a stale execution
(cancelled, restarted, reset, continued as new) can never overwrite what a newer one wrote.

Every write of the row carries its execution: the run id and the run's start time on Temporal's clock (never a
worker's). A write is taken when the row has no owner yet, or when it comes from an execution that started no
earlier than the owner and was never superseded; a write from another execution moves the ownership to it and
puts the previous owner in `superseded_executions`, so that one can never take the row back. A reset run may
keep its original's start time: the superseded list, not the clock, fences the original out. A write with no
execution (a start Temporal refused) is taken only by a row nobody owns.
"""

from __future__ import annotations


# `row` is the stored row (rollout_rows, or a CTE of its fence columns); the candidate's values are parameters.
def may_write(row: str, execution: str = "%(execution_id)s", started: str = "%(execution_started_at)s") -> str:
    """SQL: true when the execution `execution` (started at `started`) may write the rollout row `row`."""
    return (f"({row}.execution_id IS NULL OR ({execution}::text IS NOT NULL "
            f"AND NOT ({execution}::text = ANY({row}.superseded_executions)) "
            f"AND {started}::timestamptz >= {row}.execution_started_at))")


# SET clauses of an upsert that moves the row to the writing execution (EXCLUDED carries its columns).
TAKE_OVER = """execution_id = EXCLUDED.execution_id, execution_started_at = EXCLUDED.execution_started_at,
    superseded_executions = CASE
        WHEN rollout_rows.execution_id IS NOT NULL AND rollout_rows.execution_id <> EXCLUDED.execution_id
        THEN array_append(rollout_rows.superseded_executions, rollout_rows.execution_id)
        ELSE rollout_rows.superseded_executions END"""

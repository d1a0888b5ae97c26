"""The probe of issue 7: a task of 0.9 MB and a model answer of 1.2 MB. In the classic shape they once made a
workflow task fail on Temporal's 2 MB payload limit and left the workflow RUNNING with nothing pending until
its 24 h timeout. Now: the by-reference shape keeps both in Postgres and completes; the classic shape fails the
rollout typed and records it. Either way the workflow closes and the rollout is recorded."""

from __future__ import annotations

import pytest
from temporalio.client import WorkflowExecutionStatus

from gymflow.kernel.wire import ChatMessage
from gymflow.testing.scripted_openai import text
from tests.helpers import user_task
from tests.test_episode_workflow import _payload_sizes

TASK_BYTES, ANSWER_BYTES = 900_000, 1_200_000


def _big_task(task_id: str):
    task = user_task("answer at length", task_id=task_id)
    return task.model_copy(update={"messages": (ChatMessage(role="system", content="t" * TASK_BYTES),
                                                *task.messages)})


@pytest.mark.parametrize("shape", ["episode", "classic"])
async def test_a_large_task_and_a_large_answer_never_wedge_a_workflow(shape, gf, classic, scripted, sql, run_id):
    client = gf if shape == "episode" else classic
    scripted.script(text("a" * ANSWER_BYTES))
    inp = client.make_input(run_id, _big_task(f"big-{shape}"), 0, "policy")
    summary = await client.run_rollout(inp)
    desc = await client.temporal.get_workflow_handle(inp.rollout_id).describe()
    assert desc.status != WorkflowExecutionStatus.RUNNING
    ((status, ftype),) = sql("SELECT status, failure_type FROM rollouts WHERE id = %s", inp.rollout_id)
    if shape == "episode":
        assert (summary.status, status) == ("completed", "completed"), summary
        (size,) = sql("SELECT length(transcript::text) FROM rollouts WHERE id = %s", inp.rollout_id)[0]
        assert size > TASK_BYTES + ANSWER_BYTES
        assert max(await _payload_sizes(client, inp.rollout_id)) < 4_000
    else:
        assert (summary.status, summary.failure_type) == ("failed", "transcript_too_large"), summary
        assert (status, ftype) == ("failed", "transcript_too_large")

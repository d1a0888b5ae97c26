"""The probe of issue 7: a task of 0.9 MB and a model answer of 1.2 MB once made a workflow task fail on
Temporal's 2 MB payload limit and left the workflow RUNNING with nothing pending until its 24 h timeout. The
episode shape keeps both in Postgres: it completes, and history stays small."""

from __future__ import annotations

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


async def test_a_large_task_and_a_large_answer_never_wedge_a_workflow(gf, scripted, sql, run_id):
    client = gf
    scripted.script(text("a" * ANSWER_BYTES))
    inp = client.make_input(run_id, _big_task("big"), 0, "policy")
    # Over the default max_reply_chars (1,000,000): this probe is about history, so the limit makes room.
    inp = inp.model_copy(update={"limits": inp.limits.model_copy(update={"max_reply_chars": 2_000_000})})
    summary = await client.run_rollout(inp)
    desc = await client.temporal.get_workflow_handle(inp.rollout_id).describe()
    assert desc.status != WorkflowExecutionStatus.RUNNING
    ((status,),) = sql("SELECT status FROM rollouts WHERE id = %s", inp.rollout_id)
    assert (summary.status, status) == ("completed", "completed"), summary
    (size,) = sql("SELECT length(transcript::text) FROM rollouts WHERE id = %s", inp.rollout_id)[0]
    assert size > TASK_BYTES + ANSWER_BYTES
    assert max(await _payload_sizes(client, inp.rollout_id)) < 4_000

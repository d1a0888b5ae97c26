"""Which pools are polling: a collection with no generate worker would otherwise wait in silence."""

from __future__ import annotations

from collections.abc import Iterable

from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client

from gymflow.kernel import names
from gymflow.kernel.config import Settings

# queue -> the kind of task its pool polls for; generate queues are per model (see pool_queues)
POOL_QUEUES = {
    names.WORKFLOWS_QUEUE: TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
    names.ENV_QUEUE: TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
}


def pool_queues(models: Iterable[str] = ()) -> dict[str, TaskQueueType.ValueType]:
    """The queues a collection for `models` needs polled: workflows, env, and each model's generate queue."""
    return {**POOL_QUEUES, **{names.generate_queue(m): TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY for m in models}}


async def pollers(client: Client, queue: str, kind: TaskQueueType.ValueType) -> int:
    """How many workers polled `queue` recently (the server remembers pollers for a few minutes)."""
    resp = await client.workflow_service.describe_task_queue(DescribeTaskQueueRequest(
        namespace=client.namespace, task_queue=TaskQueue(name=queue), task_queue_type=kind))
    return len(resp.pollers)


async def idle_pools(client: Client, models: Iterable[str] = ()) -> list[str]:
    """Task queues that no worker polls, among those a collection for `models` needs."""
    return [q for q, kind in pool_queues(models).items() if await pollers(client, q, kind) == 0]


def pooled_models(settings: Settings, models: Iterable[str]) -> list[str]:
    """The models among `models` whose generation runs on the generate pool (models.<name>.placement: pool):
    only their generate queues need a worker; a local model is called from the workflow pool."""
    return [m for m in models if m in settings.models and settings.models[m].placement == "pool"]

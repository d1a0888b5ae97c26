"""The pool check that turns a silent wait into a warning."""

from __future__ import annotations

import asyncio

from gymflow.workers.health import idle_pools, pollers
from temporalio.api.enums.v1 import TaskQueueType


async def test_running_pools_are_seen_and_an_unpolled_queue_is_not(gf, generate_pool):
    idle = await idle_pools(gf.temporal, ["pooled"])
    for _ in range(60):  # the generate pool is its own process and may still be starting
        if not idle:
            break
        await asyncio.sleep(0.5)
        idle = await idle_pools(gf.temporal, ["pooled"])
    assert idle == []
    assert await pollers(gf.temporal, "nobody-polls-this", TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY) == 0


def test_only_pooled_models_need_a_generate_worker(settings):
    from gymflow.workers.health import pooled_models

    assert pooled_models(settings, ["policy", "pooled", "not-configured"]) == ["pooled"]

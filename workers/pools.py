"""Build the Temporal workers of each pool. Each pool polls its own task queue and scales on its own."""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Literal

from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from gymflow.kernel import names
from gymflow.kernel.config import Settings
from gymflow.kernel.errors import ConfigError
from gymflow.kernel.store.db import migrate

if TYPE_CHECKING:
    from gymflow.activities.env_processes import EnvProcesses

Pool = Literal["workflows", "env", "generate", "all"]
POOLS: tuple[str, ...] = ("workflows", "env", "generate")


@dataclass
class PoolWorkers:
    workers: list[Worker]
    closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)

    async def close(self) -> None:
        for close in self.closers:
            await close()


WORKFLOW_SANDBOX_ENV = "GYMFLOW_WORKFLOW_SANDBOX"


def workflow_runner() -> SandboxedWorkflowRunner | UnsandboxedWorkflowRunner:
    """How workflow code runs in this pool, from $GYMFLOW_WORKFLOW_SANDBOX:

    - `off` (default): unsandboxed, the cheapest (docs/benchmarks.md: ~5 ms of CPU per rollout less than
      `passthrough`). Determinism is checked where it is cheap to: the replay tests run every recorded history
      through the SDK's strict sandbox, and workflow modules import only wire types and keep no state.
    - `passthrough`: the sandbox's call checks (time, randomness, I/O) with every import passed through.
    - `strict`: the SDK's default sandbox, which re-imports the workflow modules for every run."""
    mode = os.environ.get(WORKFLOW_SANDBOX_ENV, "off")
    if mode == "off":
        return UnsandboxedWorkflowRunner()
    if mode == "strict":
        return SandboxedWorkflowRunner()
    if mode == "passthrough":
        return SandboxedWorkflowRunner(restrictions=SandboxRestrictions.default.with_passthrough_all_modules())
    raise ConfigError(f"${WORKFLOW_SANDBOX_ENV}={mode!r}: one of off, passthrough, strict")


def _env_processes(out: PoolWorkers) -> EnvProcesses:
    """The supervised processes environment code runs in (activities/env_processes.py), shared by this process's
    workflow and env workers; closed (bounded) after they stop."""
    from gymflow.activities.env_processes import EnvProcesses

    processes = EnvProcesses()
    processes.start()
    out.closers.append(processes.close)
    return processes


def _workflow_worker(client: Client, settings: Settings, database_url: str, out: PoolWorkers,
                     processes: EnvProcesses | None) -> Worker:
    """Workflows, plus the environment-side steps of environments placed "local" (environments/base.py), which
    run here as local activities: this pool reaches Postgres too."""
    from gymflow.activities.episode import EpisodeActivities
    from gymflow.activities.model_client import ModelClients
    from gymflow.activities.redact import Redactor
    from gymflow.workflows.episode import EpisodeWorkflow

    models = ModelClients(settings.models)
    out.closers.append(models.close)
    local = EpisodeActivities(database_url, models, settings.environments,
                              redactor=Redactor.from_settings(settings), processes=processes)
    out.closers.append(local.close)
    concurrency = settings.pools.workflows.concurrency
    # A workflow task stays open while its local activities run: with generation local (models.<name>.placement)
    # each rollout in flight holds a task slot for its model calls, so the slots must cover every rollout.
    tasks = concurrency if any(m.placement == "local" for m in settings.models.values()) else min(concurrency, 200)
    return Worker(client, task_queue=names.WORKFLOWS_QUEUE, workflows=[EpisodeWorkflow],
                  activities=[local.begin, local.generate, local.run_tools, local.turn, local.finish],
                  max_concurrent_workflow_tasks=tasks,
                  max_cached_workflows=max(concurrency, 100),
                  max_concurrent_local_activities=tasks,
                  # Nothing schedules (non-local) activities on this queue: one poller is enough.
                  max_concurrent_activity_task_polls=1,
                  workflow_runner=workflow_runner(),
                  # Any exception in workflow code (a bug, a non-determinism) fails the rollout, typed, instead of
                  # retrying its workflow task until the 24 h execution timeout (docs/architecture.md).
                  workflow_failure_exception_types=[Exception],
                  graceful_shutdown_timeout=timedelta(seconds=10))


def served_models(settings: Settings, models: Sequence[str] | None = None) -> tuple[str, ...]:
    """The models a generate worker serves: `models` (`--models`), default every configured one."""
    if models is None:
        return tuple(sorted(settings.models))
    chosen = tuple(dict.fromkeys(m.strip() for m in models if m.strip()))
    unknown = [m for m in chosen if m not in settings.models]
    if unknown or not chosen:
        known = ", ".join(sorted(settings.models)) or "none"
        what = f"not configured: {', '.join(unknown)}" if unknown else "empty"
        raise ConfigError(f"--models: {what} (models: {known})")
    return chosen


def build_pool(client: Client, settings: Settings, pool: Pool, database_url: str,
               shutdown_grace: timedelta = timedelta(seconds=30), generate_models: Sequence[str] | None = None
               ) -> PoolWorkers:
    """Workers for `pool` ('all' = every pool in this process). Applies migrations first.
    `generate_models`: the models whose generate queues to poll (default: every configured model)."""
    from gymflow.activities import redact

    wanted = POOLS if pool == "all" else (pool,)
    out = PoolWorkers(workers=[])
    # The worker's secrets out of failure messages (history, rollouts.failure_message) and every log line too.
    redact.install(redact.Redactor.from_settings(settings))
    processes = _env_processes(out) if {"workflows", "env"} & set(wanted) else None
    if "workflows" in wanted:
        # No migrate here: workflows keep running while Postgres is down (their local activities retry, bounded),
        # so this pool must start without it. The env and generate pools apply migrations.
        out.workers.append(_workflow_worker(client, settings, database_url, out, processes))
    if "env" not in wanted and "generate" not in wanted:
        return out

    migrate(database_url)

    from gymflow.activities.episode import EpisodeActivities
    from gymflow.activities.model_client import ModelClients
    from gymflow.activities.redact import Redactor

    models = ModelClients(settings.models)
    out.closers.append(models.close)
    redactor = Redactor.from_settings(settings)  # the worker's secrets, kept out of stored messages
    if "env" in wanted:
        from gymflow.environments.sandbox import describe_limits

        logging.getLogger(__name__).info("env pool: %s", describe_limits())  # what binds code_gen's programs

        episode = EpisodeActivities(database_url, models, settings.environments, redactor=redactor, processes=processes)
        out.closers.append(episode.close)
        concurrency = settings.pools.env.concurrency
        out.workers.append(Worker(
            client, task_queue=names.ENV_QUEUE,
            activities=[episode.begin, episode.run_tools, episode.finish],
            activity_executor=ThreadPoolExecutor(concurrency), max_concurrent_activities=concurrency,
            max_task_queue_activities_per_second=settings.pools.env.rate_limit_per_s,
            graceful_shutdown_timeout=shutdown_grace))
    if "generate" in wanted:
        episode_gen = EpisodeActivities(database_url, models, settings.environments, redactor=redactor)
        out.closers.append(episode_gen.close)
        # One worker per model queue: a rollout waits for a worker that has its model instead of failing on
        # one that lacks it. Concurrency and the rate limit apply per model queue.
        for queue in (names.generate_queue(m) for m in served_models(settings, generate_models)):
            out.workers.append(Worker(
                client, task_queue=queue, activities=[episode_gen.generate],
                max_concurrent_activities=settings.pools.generate.concurrency,
                max_task_queue_activities_per_second=settings.pools.generate.rate_limit_per_s,
                graceful_shutdown_timeout=shutdown_grace))
    return out

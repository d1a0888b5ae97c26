"""The async Python client: start one rollout, or collect a dataset `n` samples per task, resumably.

Workflow ids are deterministic, so collecting the same run again attaches to running episodes
(conflict policy USE_EXISTING) and skips finished ones (reuse policy REJECT_DUPLICATE).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.common import (
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.exceptions import ApplicationError, WorkflowAlreadyStartedError

from gymflow.kernel import names
from gymflow.kernel.config import Settings
from gymflow.kernel.store.db import make_engine, make_sessionmaker, migrate
from gymflow.kernel.store.repo import save_rollout, upsert_run
from gymflow.kernel.store.reports import run_report
from gymflow.kernel.wire import RolloutInput, RolloutRecord, RolloutSummary, SamplingParams, Task
from workers.connect import connect_temporal, resolve_addresses

Outcome = Literal["started", "attached", "finished"]
WORKFLOW_TIMEOUT = timedelta(hours=24)  # an upper bound so that every wait on a result ends


@dataclass(frozen=True)
class CollectResult:
    summary: RolloutSummary
    outcome: Outcome


def _summary_from_failure(err: WorkflowFailureError, inp: RolloutInput) -> RolloutSummary:
    cause = err.cause
    if isinstance(cause, ApplicationError) and cause.details and isinstance(cause.details[0], dict):
        return RolloutSummary.model_validate(cause.details[0])
    kind = type(cause).__name__ if cause else "WorkflowFailure"
    return RolloutSummary(rollout_id=inp.rollout_id, run_id=inp.run_id, task_id=inp.task.id,
                          sample_index=inp.sample_index, status="failed", failure_type=f"workflow_{kind}",
                          failure_message=str(cause or err))


class GymflowClient:
    def __init__(self, temporal: Client, settings: Settings, database_url: str) -> None:
        self.temporal = temporal
        self.settings = settings
        self._engine = make_engine(database_url, pool_size=2)
        self._sessions = make_sessionmaker(self._engine)

    @classmethod
    async def connect(cls, settings: Settings) -> GymflowClient:
        temporal_address, database_url = resolve_addresses(settings)
        await asyncio.to_thread(migrate, database_url)
        return cls(await connect_temporal(temporal_address, settings.temporal.namespace), settings, database_url)

    async def close(self) -> None:
        await self._engine.dispose()

    def make_input(self, run_id: str, task: Task, sample_index: int, model: str,
                   sampling: SamplingParams | None = None, max_turns: int | None = None) -> RolloutInput:
        defaults = self.settings.rollout
        self.settings.model_config_for(model)  # fail here, not in a worker, when the model is unknown
        return RolloutInput(run_id=run_id, task=task, sample_index=sample_index, model=model,
                            sampling=sampling or defaults.sampling, max_turns=max_turns or defaults.max_turns,
                            limits=defaults.limits, turns_per_run=defaults.turns_per_run)

    async def start_rollout(self, inp: RolloutInput, *, retry_failed: bool = False
                            ) -> tuple[WorkflowHandle[Any, RolloutSummary], Outcome]:
        rid = inp.rollout_id
        try:
            handle = await self.temporal.start_workflow(
                names.ROLLOUT_WORKFLOW, inp, id=rid, task_queue=names.WORKFLOWS_QUEUE,
                result_type=RolloutSummary, execution_timeout=WORKFLOW_TIMEOUT,
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                id_reuse_policy=(WorkflowIDReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY if retry_failed
                                 else WorkflowIDReusePolicy.REJECT_DUPLICATE),
                search_attributes=TypedSearchAttributes([
                    SearchAttributePair(names.SA_RUN, inp.run_id), SearchAttributePair(names.SA_ENV, inp.task.env),
                    SearchAttributePair(names.SA_MODEL, inp.model), SearchAttributePair(names.SA_STATUS, "running"),
                ]),
                static_summary=f"{inp.task.env} · task {inp.task.id} · sample {inp.sample_index} · {inp.model}",
            )
        except WorkflowAlreadyStartedError:
            return self.temporal.get_workflow_handle(rid, result_type=RolloutSummary), "finished"
        resp = getattr(handle, "_start_workflow_response", None)
        started = getattr(resp, "started", True)
        return handle, "started" if started else "attached"

    async def result(self, handle: WorkflowHandle[Any, RolloutSummary], inp: RolloutInput) -> RolloutSummary:
        try:
            return await handle.result()
        except WorkflowFailureError as err:
            summary = _summary_from_failure(err, inp)
            if not (isinstance(err.cause, ApplicationError) and err.cause.details):
                # Terminated, timed out or cancelled: the workflow never persisted; record it here.
                async with self._sessions.begin() as session:
                    await save_rollout(session, RolloutRecord(summary=summary, env=inp.task.env, model=inp.model))
            return summary

    async def run_rollout(self, inp: RolloutInput) -> RolloutSummary:
        handle, _ = await self.start_rollout(inp)
        return await self.result(handle, inp)

    async def record_run(self, run_id: str, *, env: str, model: str, dataset: str | None, n: int,
                         dataset_errors: Sequence[str] = ()) -> None:
        async with self._sessions.begin() as session:
            await upsert_run(session, run_id, env=env, model=model, dataset=dataset, samples_per_task=n,
                             dataset_errors=list(dataset_errors))

    async def report(self, run_id: str) -> dict[str, list[dict[str, Any]]]:
        """Mean reward and pass@k, failures by type, latency percentiles for one run (the SQL views)."""
        async with self._sessions() as session:
            return await run_report(session, run_id)

    async def collect(self, run_id: str, tasks: Iterable[Task], *, n: int, model: str,
                      sampling: SamplingParams | None = None, max_turns: int | None = None,
                      max_in_flight: int = 1000, retry_failed: bool = False) -> AsyncIterator[CollectResult]:
        """Run every task `n` times; yield each result as it finishes. At most `max_in_flight` awaited at once."""
        inputs = [self.make_input(run_id, t, i, model, sampling, max_turns) for t in tasks for i in range(n)]
        results: asyncio.Queue[CollectResult | BaseException] = asyncio.Queue()
        slots = asyncio.Semaphore(max_in_flight)

        async def one(inp: RolloutInput) -> None:
            try:
                handle, outcome = await self.start_rollout(inp, retry_failed=retry_failed)
                await results.put(CollectResult(await self.result(handle, inp), outcome))
            except BaseException as e:  # surfaced to the caller, never swallowed
                await results.put(e)
            finally:
                slots.release()

        async def produce() -> None:
            for inp in inputs:
                await slots.acquire()
                running.add(t := asyncio.create_task(one(inp)))
                t.add_done_callback(running.discard)

        running: set[asyncio.Task[None]] = set()
        producer = asyncio.create_task(produce())
        try:
            for _ in range(len(inputs)):
                item = await results.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            producer.cancel()
            for t in list(running):
                t.cancel()

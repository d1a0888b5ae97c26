"""The async Python client: start one rollout, or collect a dataset `n` samples per task, resumably.

Workflow ids are deterministic, so collecting the same run again attaches to running episodes
(conflict policy USE_EXISTING) and skips finished ones (reuse policy REJECT_DUPLICATE). The same
property lets the client ride out a Temporal restart: a start or a wait that meets an outage is
simply repeated, for a bounded time, against the same workflow id.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import unicodedata
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, TypeVar

from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncSession
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.common import (
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.exceptions import (
    ApplicationError,
    CancelledError,
    TerminatedError,
    WorkflowAlreadyStartedError,
)
from temporalio.exceptions import TimeoutError as TemporalTimeoutError
from temporalio.service import RPCError, RPCStatusCode
from tenacity import AsyncRetrying, retry_if_exception, stop_after_delay

from gymflow.kernel import failures, names
from gymflow.kernel.config import Settings, unconfigured_model
from gymflow.kernel.connect import (
    TemporalUnreachable,
    connect_temporal,
    quiet_runtime,
    resolve_addresses,
    seconds_from_env,
    startup_wait_s,
    temporal_options,
)
from gymflow.kernel.episode_wire import episode_input
from gymflow.kernel.errors import ConfigError, GymflowError
from gymflow.kernel.limits import MAX_RUN_ID_BYTES
from gymflow.kernel.store.completed import completed_by
from gymflow.kernel.store.db import (
    database_location,
    is_unreachable,
    make_engine,
    make_sessionmaker,
    migrate_when_reachable,
)
from gymflow.kernel.store.episodes import save_tasks
from gymflow.kernel.store.repo import save_rollout, upsert_run
from gymflow.kernel.store.reports import run_report
from gymflow.kernel.wire import RolloutInput, RolloutRecord, RolloutSummary, SamplingParams, Task

# started/attached: ran (or finished) during this call; finished: was already done; rejected: Temporal
# refused to start it (recorded as a `start_rejected` failure).
Outcome = Literal["started", "attached", "finished", "rejected"]
WORKFLOW_TIMEOUT = timedelta(hours=24)  # an upper bound so that every wait on a result ends
RECONNECT_WAIT_ENV = "GYMFLOW_RECONNECT_WAIT_S"
DEFAULT_RECONNECT_WAIT_S = 600.0
NOTICE_EVERY_S = 5.0  # at most one "unreachable" line per this many seconds, however many rollouts wait
OUTAGE_GAP_S = 30.0  # failures further apart than this are separate outages (the SDK retries ~10 s per call)
CANCEL_GRACE_S = 10.0  # how long a stopped collection waits for its in-flight tasks to unwind
_CLOSED_BY = {TerminatedError: failures.WORKFLOW_TERMINATED, CancelledError: failures.WORKFLOW_CANCELLED,
              TemporalTimeoutError: failures.WORKFLOW_TIMED_OUT}
log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class CollectResult:
    summary: RolloutSummary
    outcome: Outcome


def reconnect_wait_from_env(environ: dict[str, str] | None = None) -> float:
    """How long a start or a wait rides out a Temporal outage: $GYMFLOW_RECONNECT_WAIT_S, default 600 s."""
    return seconds_from_env(RECONNECT_WAIT_ENV, DEFAULT_RECONNECT_WAIT_S, environ)


def is_transient(err: BaseException) -> bool:
    """An RPC failure that a server restart or a network blip explains: worth repeating."""
    if not isinstance(err, RPCError):
        return False
    if err.status in (RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED):
        return True
    text = err.message.lower()
    if err.status == RPCStatusCode.RESOURCE_EXHAUSTED:
        return "larger than max" not in text  # a server rate limit passes; an oversized request never will
    return "transport error" in text or "connection reset" in text


def _summary_from_failure(err: WorkflowFailureError, inp: RolloutInput) -> RolloutSummary:
    cause = err.cause
    if isinstance(cause, ApplicationError) and cause.details and isinstance(cause.details[0], dict):
        return RolloutSummary.model_validate(cause.details[0])
    if isinstance(cause, ApplicationError):  # failed typed but unrecorded (e.g. store_unavailable)
        kind = failures.known(cause.type)
        # An exception raised in workflow code fails the rollout (workers/pools.py): its class goes in the message.
        text = cause.message if kind == cause.type else f"workflow code raised {cause.type}: {cause.message}"
    else:  # closed from outside the workflow (terminated, cancelled, timed out)
        kind = next((name for cls, name in _CLOSED_BY.items() if isinstance(cause, cls)), failures.INTERNAL_ERROR)
        text = str(cause or err)
    return RolloutSummary(rollout_id=inp.rollout_id, run_id=inp.run_id, task_id=inp.task.id,
                          sample_index=inp.sample_index, status="failed", failure_type=kind,
                          failure_message=failures.short_message(text))


def run_id_problem(run_id: str) -> str | None:
    """Why `run_id` cannot head workflow ids `<run>/<task>/<sample>` (Temporal caps ids at 1,000 bytes), or None."""
    size = len(run_id.encode("utf-8", "surrogatepass"))
    if not run_id.strip():
        return "run id: empty"
    if size > MAX_RUN_ID_BYTES:
        return f"run id: {size:,} bytes; at most {MAX_RUN_ID_BYTES}"
    if "/" in run_id:
        return f"run id {run_id!r}: must not contain '/' (it is part of the workflow id)"
    bad = next((ch for ch in run_id if unicodedata.category(ch) in ("Cc", "Cs", "Zl", "Zp")), None)
    if bad is not None:
        return f"run id {run_id!r}: control character U+{ord(bad):04X}"
    return None


Placement = Literal["local", "pool"]


def placement_of(settings: Settings, env: str) -> Placement:
    """`environments.<env>.placement` from the config when set, else the environment's declared placement."""
    options = settings.environments.get(env, {})
    chosen = options.get("placement")
    if chosen is None:
        from gymflow.environments.registry import available, get_environment  # imports that one environment only

        if env not in available():
            return "pool"  # the rollout then fails typed (unknown_environment) where the env pool meets it
        return get_environment(env).placement_for(options)
    if chosen not in ("local", "pool"):
        raise ConfigError(f"environments.{env}.placement: {chosen!r} is not one of 'local', 'pool'")
    return chosen


def check_collectable(settings: Settings, envs: Iterable[str], model: str, run_id: str | None = None) -> None:
    """Before anything starts: the run id fits a workflow id, every environment is installed and the model is
    configured."""
    # lazy: lists entry points, imports only the configured environments
    from gymflow.environments.registry import available, check_options

    installed = available()
    # A typo, a NaN or a call limit past the activity's timeout fails here, not per rollout.
    check_options(settings.environments, "settings.environments",
                  activity_timeout_s=settings.rollout.limits.env.start_to_close_s)
    problems = []
    if run_id is not None and (why := run_id_problem(run_id)):
        problems.append(why)
    unknown = sorted(set(envs) - set(installed))
    if unknown:
        problems.append(f"unknown environment{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} "
                        f"(installed: {', '.join(installed) or 'none'}; see `gymflow env list`)")
    if model not in settings.models:
        problems.append(unconfigured_model(model, settings.models))
    if problems:
        raise ConfigError("; ".join(problems) + "; nothing was started")


class _Outage:
    """One notice line per few seconds while Temporal is unreachable, shared by every waiting rollout."""

    def __init__(self, address: str, notify: Callable[[str], None]) -> None:
        self.address, self.notify = address, notify
        self.since: float | None = None
        self.last_failure = 0.0
        self.last_notice = -math.inf

    def failed(self) -> None:
        now = time.monotonic()
        if self.since is None or now - self.last_failure > OUTAGE_GAP_S:
            self.since, self.last_notice = now, -math.inf
        self.last_failure = now
        if now - self.last_notice >= NOTICE_EVERY_S:
            self.notify(f"Temporal unreachable at {self.address}, retrying (since {now - self.since:.0f} s)")
            self.last_notice = now

    def recovered(self) -> None:
        if self.since is not None:
            self.notify(f"Temporal at {self.address} is back (after {time.monotonic() - self.since:.0f} s); "
                        "re-attached to the running rollouts")
            self.since = None


class GymflowClient:
    def __init__(self, temporal: Client, settings: Settings, database_url: str, *,
                 reconnect_wait_s: float | None = None, on_notice: Callable[[str], None] | None = None) -> None:
        self.temporal = temporal
        self.settings = settings
        self.reconnect_wait_s = reconnect_wait_from_env() if reconnect_wait_s is None else reconnect_wait_s
        self.on_notice: Callable[[str], None] = on_notice or log.warning  # the CLI prints these lines
        self._placements: dict[str, Placement] = {}
        self._stored_tasks: set[tuple[str, str]] = set()  # (run, task) already in `tasks`, for by-reference runs
        self._outage = _Outage(temporal.service_client.config.target_host, lambda m: self.on_notice(m))
        self._database_url = database_url
        self._engine = make_engine(database_url, pool_size=2)
        self._sessions = make_sessionmaker(self._engine)

    @classmethod
    async def connect(cls, settings: Settings, *, wait_s: float | None = None,
                      on_notice: Callable[[str], None] | None = None) -> GymflowClient:
        """Wait (up to `wait_s`, default $GYMFLOW_STARTUP_WAIT_S) for Postgres and Temporal, then connect."""
        temporal_address, database_url = resolve_addresses(settings)
        wait = startup_wait_s() if wait_s is None else wait_s
        notify = on_notice or log.warning
        options = temporal_options(settings)  # a missing API key variable or cert file fails before any wait
        await migrate_when_reachable(database_url, wait_s=wait, on_wait=notify)
        temporal = await connect_temporal(temporal_address, wait_s=wait, on_wait=notify, runtime=quiet_runtime(),
                                          options=options)
        return cls(temporal, settings, database_url, on_notice=on_notice)

    async def close(self) -> None:
        await self._engine.dispose()

    def make_input(self, run_id: str, task: Task, sample_index: int, model: str,
                   sampling: SamplingParams | None = None, max_turns: int | None = None) -> RolloutInput:
        defaults = self.settings.rollout
        self.settings.model_config_for(model)  # fail here, not in a worker, when the model is unknown
        # A row's own limit can only lower the run's; applied here, so both workflows honour it unchanged.
        limit = max_turns or defaults.max_turns
        limit = min(limit, task.max_turns) if task.max_turns else limit
        return RolloutInput(run_id=run_id, task=task, sample_index=sample_index, model=model,
                            sampling=sampling or defaults.sampling, max_turns=limit,
                            limits=defaults.limits, turns_per_run=defaults.turns_per_run)

    async def _ride_out(self, call: Callable[[], Awaitable[T]], what: str) -> T:
        """`call()`, repeated with backoff while Temporal is unreachable, for at most reconnect_wait_s."""
        first: float | None = None
        delay = 0.5
        while True:
            try:
                out = await call()
            except RPCError as err:
                if not is_transient(err):
                    raise
                self._outage.failed()
                now = time.monotonic()
                first = now if first is None else first
                if now - first >= self.reconnect_wait_s:
                    raise TemporalUnreachable(
                        f"Temporal at {self._outage.address} unreachable for {now - first:.0f} s while waiting to "
                        f"{what} ({err.status.name}: {failures.short_message(err.message, 200)}); gave up. Run the "
                        "same command again once it is back: finished rollouts are kept, running ones re-attached"
                    ) from None
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            if first is not None:
                self._outage.recovered()
            return out

    async def store_tasks(self, run_id: str, tasks: Sequence[Task]) -> None:
        """Store a run's tasks once, for the by-reference workflow (its input carries only the task id)."""
        todo = list({t.id: t for t in tasks if (run_id, t.id) not in self._stored_tasks}.values())
        for start in range(0, len(todo), 500):
            chunk = todo[start:start + 500]

            async def write(chunk: list[Task] = chunk) -> None:
                async with self._sessions.begin() as session:
                    await save_tasks(session, run_id, chunk)

            await self._with_store(write, f"storing the tasks of run {run_id}")
            self._stored_tasks.update((run_id, t.id) for t in chunk)

    def generate_placement(self, model: str) -> Placement:
        """Where `model`'s generate steps run: `models.<model>.placement` ('pool' for a model not configured here:
        the generate pool then says it does not know it)."""
        cfg = self.settings.models.get(model)
        return cfg.placement if cfg is not None else "pool"

    def placement(self, env: str) -> Placement:
        """Where `env`'s setup, tool calls and verify run: `environments.<env>.placement` in the config, else the
        environment's own default (environments/base.py)."""
        if env not in self._placements:
            self._placements[env] = placement_of(self.settings, env)
        return self._placements[env]

    async def start_rollout(self, inp: RolloutInput, *, retry_failed: bool = False, rerun: bool = False
                            ) -> tuple[WorkflowHandle[Any, RolloutSummary], Outcome]:
        """Start (or attach to) the rollout's workflow. Raises RPCError when Temporal refuses this one.
        `rerun`: start it again even when it completed (the trainer iterator restarting a stale rollout)."""
        rid = inp.rollout_id

        await self.store_tasks(inp.run_id, [inp.task])
        workflow, arg = names.EPISODE_WORKFLOW, episode_input(inp, self.placement(inp.task.env),
                                                              self.generate_placement(inp.model))

        def start() -> Awaitable[WorkflowHandle[Any, RolloutSummary]]:
            return self.temporal.start_workflow(
                workflow, arg, id=rid, task_queue=names.WORKFLOWS_QUEUE,
                result_type=RolloutSummary, execution_timeout=WORKFLOW_TIMEOUT,
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                id_reuse_policy=(WorkflowIDReusePolicy.ALLOW_DUPLICATE if rerun
                                 else WorkflowIDReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY if retry_failed
                                 else WorkflowIDReusePolicy.REJECT_DUPLICATE),
                search_attributes=TypedSearchAttributes([
                    SearchAttributePair(names.SA_RUN, inp.run_id), SearchAttributePair(names.SA_ENV, inp.task.env),
                    SearchAttributePair(names.SA_MODEL, inp.model), SearchAttributePair(names.SA_STATUS, "running"),
                ]),
                static_summary=f"{inp.task.env} · task {inp.task.id} · sample {inp.sample_index} · {inp.model}",
            )

        try:
            # A start whose reply was lost in an outage is repeated safely: USE_EXISTING attaches to it.
            handle = await self._ride_out(start, f"start {rid}")
        except WorkflowAlreadyStartedError:
            return self.temporal.get_workflow_handle(rid, result_type=RolloutSummary), "finished"
        resp = getattr(handle, "_start_workflow_response", None)
        started = getattr(resp, "started", True)
        return handle, "started" if started else "attached"

    async def result(self, handle: WorkflowHandle[Any, RolloutSummary], inp: RolloutInput) -> RolloutSummary:
        try:
            return await self._ride_out(handle.result, f"wait for {inp.rollout_id}")
        except WorkflowFailureError as err:
            summary = _summary_from_failure(err, inp)
            if not (isinstance(err.cause, ApplicationError) and err.cause.details):
                # Terminated, timed out or cancelled. It may still have persisted the episode first: a cancel that
                # arrives while an all-local episode's last workflow task runs is seen only when that task
                # completes, and the replay that follows knows none of its turns. Keep that record.
                desc = await self._ride_out(handle.describe, f"describe {inp.rollout_id}")
                execution = (desc.run_id, desc.start_time)
                kept = await self.in_store(lambda s: completed_by(s, inp.rollout_id, desc.run_id),
                                           f"read rollout {inp.rollout_id}")
                if kept is not None:
                    return kept
                await self._save(summary, inp, execution)  # it never persisted: record it here, fenced
            return summary

    async def _save(self, summary: RolloutSummary, inp: RolloutInput,
                    execution: tuple[str, datetime] | None = None) -> None:
        """Record a rollout the workflow could not; waits (bounded) for Postgres to come back. `execution` (run id,
        start time) is the closed run's: a newer execution's record is never replaced (store/fence.py)."""
        record = RolloutRecord(summary=summary, env=inp.task.env, model=inp.model,
                               execution_id=execution[0] if execution else None,
                               execution_started_at=execution[1] if execution else None)

        async def write() -> None:
            async with self._sessions.begin() as session:
                await save_rollout(session, record)

        await self._with_store(write, f"record rollout {inp.rollout_id}")

    async def in_store(self, work: Callable[[AsyncSession], Awaitable[T]], what: str) -> T:
        """`work` in one transaction, waiting (bounded) for an unreachable Postgres; e.g. the trainer iterator's
        policy-version reads and writes (gymflow/kernel/store/policy_versions.py)."""
        out: list[T] = []

        async def write() -> None:
            async with self._sessions.begin() as session:
                out.append(await work(session))

        await self._with_store(write, what)
        return out[-1]

    async def _with_store(self, write: Callable[[], Awaitable[None]], what: str) -> None:
        """Run `write` (one transaction), waiting (bounded) for an unreachable Postgres to come back."""
        where = database_location(self._database_url)
        try:
            async for attempt in AsyncRetrying(
                    retry=retry_if_exception(is_unreachable), stop=stop_after_delay(self.reconnect_wait_s),
                    wait=lambda rs: min(5.0, 0.5 + rs.seconds_since_start / 2), reraise=True,
                    before_sleep=lambda rs: self.on_notice(
                        f"Postgres at {where} unreachable, retrying (since {rs.seconds_since_start:.0f} s)")):
                with attempt:
                    await write()
        except OperationalError as err:
            raise GymflowError(
                f"Postgres at {where} refused or did not answer ({what}: "
                f"{failures.short_message(err.orig or err, 200)}); run the same command again once it "
                "is back", failure_type=failures.STORE_UNAVAILABLE) from None

    async def _rejected(self, inp: RolloutInput, err: RPCError) -> RolloutSummary:
        """Temporal refused this one rollout (payload or id too large...): record it, the collection goes on."""
        summary = RolloutSummary(
            rollout_id=inp.rollout_id, run_id=inp.run_id, task_id=inp.task.id, sample_index=inp.sample_index,
            status="failed", failure_type=failures.START_REJECTED,
            failure_message=failures.short_message(f"Temporal refused to start it ({err.status.name}): {err.message}"))
        await self._save(summary, inp)
        return summary

    async def run_one(self, inp: RolloutInput, *, retry_failed: bool = False, rerun: bool = False) -> CollectResult:
        """Start or attach, then wait for the result; a start Temporal refuses becomes a recorded failure."""
        try:
            handle, outcome = await self.start_rollout(inp, retry_failed=retry_failed, rerun=rerun)
        except RPCError as err:  # transient ones were ridden out inside start_rollout
            return CollectResult(await self._rejected(inp, err), "rejected")
        return CollectResult(await self.result(handle, inp), outcome)

    async def run_rollout(self, inp: RolloutInput) -> RolloutSummary:
        return (await self.run_one(inp)).summary

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
        """Run every task `n` times; yield each result as it finishes. At most `max_in_flight` awaited at once.
        Unknown environments or model fail before anything starts. Close the iterator (`aclosing`) to stop
        early: in-flight waits are cancelled and awaited (the workflows themselves keep running)."""
        tasks = list(tasks)
        check_collectable(self.settings, {t.env for t in tasks}, model, run_id)
        inputs = [self.make_input(run_id, t, i, model, sampling, max_turns) for t in tasks for i in range(n)]
        await self.store_tasks(run_id, tasks)  # in bulk, before any workflow needs them
        results: asyncio.Queue[CollectResult | BaseException] = asyncio.Queue()
        slots = asyncio.Semaphore(max_in_flight)

        async def one(inp: RolloutInput) -> None:
            try:
                item: CollectResult | BaseException = await self.run_one(inp, retry_failed=retry_failed)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # surfaced to the caller, never swallowed
                item = e
            finally:
                slots.release()
            results.put_nowait(item)

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
            pending = [producer, *running]
            for t in pending:
                t.cancel()
            # Bounded: a task that ignores cancellation must not hold the command open.
            await asyncio.wait(pending, timeout=CANCEL_GRACE_S)

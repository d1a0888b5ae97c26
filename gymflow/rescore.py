"""Rescore a run: verify its stored episodes again with the verifiers installed here (changed code, or changed
options), into a new score version beside the collect's own (gymflow/kernel/store/scores.py).

Each episode is read from Postgres (the accepted chain and the state it ended in) and verified in the same
supervised processes a worker uses (activities/env_processes.py), with the same judges; nothing is generated.
Durable by its writes: every score is stored once per (version, rollout), so an interrupted rescore, run again,
scores only the rollouts it had not stored. Verification runs in this process, not on the worker pools: a rescore
is CPU-bound verify work sized to where it is started (`--concurrency`).
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import importlib.metadata
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gymflow.activities.env_activities import EnvActivities, verify_episode
from gymflow.activities.env_processes import EnvProcesses
from gymflow.activities.model_client import ModelClients
from gymflow.activities.redact import Redactor
from gymflow.environments.base import VerifyContext
from gymflow.environments.registry import check_options, get_environment
from gymflow.kernel.config import Settings
from gymflow.kernel.connect import resolve_addresses, startup_wait_s
from gymflow.kernel.errors import STORE_UNAVAILABLE, GymflowError
from gymflow.kernel.failures import short_message
from gymflow.kernel.store import scores
from gymflow.kernel.store.db import migrate_when_reachable
from gymflow.kernel.store.direct import DirectPool
from gymflow.kernel.store.episodes import latest_state, load_task, read_chain
from gymflow.kernel.wire import ChatMessage, Score, Task

BATCH = 200  # pending rollouts read per query


@dataclass
class RescoreResult:
    version: scores.ScoreVersion
    resumed: bool
    scored: int = 0  # stored by this call
    already: int = 0  # stored before (an earlier, interrupted call)
    finished: bool = False
    errors: dict[str, int] = field(default_factory=dict)  # failure type -> rollouts masked with it


def verifier_identity(env_name: str) -> dict[str, str]:
    """What names the verifier that scores: its environment's module, that module's source hash, gymflow's version
    (a verifier changed in a helper module the environment imports is covered by gymflow's version only)."""
    env = get_environment(env_name)
    module = inspect.getmodule(type(env))
    source = inspect.getsource(module) if module is not None else ""
    return {"module": type(env).__module__, "source_sha256": hashlib.sha256(source.encode()).hexdigest()[:16],
            "gymflow": importlib.metadata.version("gymflow")}


def merged_options(settings: Settings, overrides: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """The config's environment options with `overrides` (`--option env.key=value`) on top, checked as the config's
    are (names, types, bounds, against the env activity's timeout)."""
    merged = {name: dict(opts) for name, opts in settings.environments.items()}
    for name, opts in overrides.items():
        merged.setdefault(name, {}).update(opts)
    return check_options(merged, "rescore options", activity_timeout_s=settings.rollout.limits.env.start_to_close_s)


async def _run_envs(pool: DirectPool, run_id: str) -> list[str]:
    async with pool.connection() as conn:
        rows = await (await conn.execute("SELECT DISTINCT env FROM rollout_rows WHERE run_id = %(run)s ORDER BY 1",
                                         {"run": run_id})).fetchall()
    return [r[0] for r in rows]


class _Rescorer:
    def __init__(self, pool: DirectPool, run_id: str, options: dict[str, dict[str, Any]], judges: EnvActivities,
                 processes: EnvProcesses, redactor: Redactor) -> None:
        self.pool, self.run_id, self.options = pool, run_id, options
        self.judges, self.processes, self.redactor = judges, processes, redactor
        self._tasks: dict[str, Task] = {}

    async def task(self, task_id: str) -> Task:
        if task_id not in self._tasks:
            async with self.pool.connection() as conn:
                task = await load_task(conn, self.run_id, task_id)
            if task is None:
                raise GymflowError(f"task {task_id!r} of run {self.run_id!r} is not stored")
            self._tasks[task_id] = task
        return self._tasks[task_id]

    async def score(self, task_id: str, sample: int, model: str, head_id: int) -> Score:
        """The episode's score from the verifier installed here; a verifier or task that fails is a masked score
        of its type, never a 0 (a store outage raises: the rerun picks the rollout up)."""
        try:
            task = await self.task(task_id)
            async with self.pool.connection() as conn:
                chain = await read_chain(conn, head_id)
            messages = tuple(ChatMessage.model_validate(m.body) for m in chain)
            ctx = VerifyContext(policy_model=model, chat=self.judges._judge_chat(task.id, sample),  # noqa: SLF001
                                options=dict(self.options.get(task.env, {})))
            return await verify_episode(get_environment(task.env), None, messages, copy.deepcopy(latest_state(chain)),
                                        ctx, task, self.processes)
        except GymflowError as e:
            if e.failure_type == STORE_UNAVAILABLE:  # not the verifier's: the rerun picks the rollout up
                raise
            return Score(reward=None, masked=True, failure_type=e.failure_type,
                         details={"error": short_message(self.redactor.text(str(e)))})


async def rescore_run(settings: Settings, run_id: str, *, name: str | None = None,
                      overrides: Mapping[str, Mapping[str, Any]] | None = None, concurrency: int = 4,
                      stop_after: int | None = None, on_progress: Callable[[int, int], None] | None = None
                      ) -> RescoreResult:
    """Rescore `run_id` into score version `name` (new, or resumed when it exists unfinished with the same
    verifiers and options). `stop_after`: store at most that many scores, then return unfinished (a rerun goes
    on). `on_progress(scored, already)` after each stored score."""
    _, database_url = resolve_addresses(settings)
    await migrate_when_reachable(database_url, wait_s=startup_wait_s())
    options = merged_options(settings, overrides or {})
    pool = DirectPool(database_url, max_size=concurrency + 2)
    processes = EnvProcesses()
    models = ModelClients(settings.models)
    try:
        envs = await _run_envs(pool, run_id)
        if not envs:
            raise GymflowError(f"run {run_id!r} has no stored rollouts (see `gymflow report --list`)")
        used = {env: options.get(env, {}) for env in envs}
        async with pool.connection() as conn:
            version, resumed = await scores.open_version(conn, run_id, name, {e: verifier_identity(e) for e in envs},
                                                         used)
        result = RescoreResult(version=version, resumed=resumed, already=version.scored)
        processes.start()
        rescorer = _Rescorer(pool, run_id, options, EnvActivities(models, options), processes,
                             Redactor.from_settings(settings))
        gate = asyncio.Semaphore(concurrency)

        async def one(rollout_id: str, task_id: str, sample: int, model: str, head_id: int) -> None:
            async with gate:
                if stop_after is not None and result.scored >= stop_after:
                    return
                score = await rescorer.score(task_id, sample, model, head_id)
                async with pool.connection() as conn:
                    stored = await scores.write_score(
                        conn, version.id, rollout_id, reward=score.reward, masked=score.masked,
                        failure_type=score.failure_type,
                        failure_message=score.details.get("error") if score.masked else None,
                        details=rescorer.redactor.body(score.details))
                if stored:
                    result.scored += 1
                    if score.failure_type:
                        result.errors[score.failure_type] = result.errors.get(score.failure_type, 0) + 1
                if on_progress is not None:
                    on_progress(result.scored, result.already)

        while stop_after is None or result.scored < stop_after:
            async with pool.connection() as conn:
                batch = await scores.pending(conn, version.id, run_id, BATCH)
            if not batch:
                async with pool.connection() as conn:
                    await scores.finish(conn, version.id)
                result.finished = True
                break
            await asyncio.gather(*(one(*row) for row in batch))
        return result
    finally:
        await processes.close()
        await models.close()
        await pool.close()

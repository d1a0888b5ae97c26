"""The episode's reads and writes in Postgres, for its activities (activities/episode.py): each retried on its own
(bounded) so a database blip costs no model call, with the per-process caches of tasks, tool schemas and chains.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable
from contextlib import nullcontext
from typing import TypeVar

from gymflow.activities.boundary import STORE_RETRY_S, retry_read, retry_store
from gymflow.activities.chain_cache import ChainCache
from gymflow.environments.registry import get_environment
from temporalio import activity

from gymflow.kernel import names
from gymflow.kernel.errors import GymflowError, TaskError
from gymflow.kernel.failures import WORKER_LOST
from gymflow.kernel.store.direct import DirectPool
from gymflow.kernel.store.episodes import (
    NewMessage,
    StoredMessage,
    append_batch,
    as_stored,
    encode,
    load_task,
    load_task_tools,
    produced,
    read_chain_after,
    started_and_produced,
)
from gymflow.kernel.store.repo import Conn
from gymflow.kernel.wire import Task, ToolSpec

# Tasks are immutable per (run, task id): cache them per worker process. The samples of a task (GRPO's group)
# run close together, so the cache need only cover the tasks in flight; a larger one only grows the process
# (4096 entries: ~20 MB per workflow-pool process over a 20k-rollout run of distinct tasks).
_TASK_CACHE = 1024
T = TypeVar("T")
_GENERATING = frozenset({names.EPISODE_GENERATE, names.EPISODE_TURN})
# Starts of one local step on workers that had not run it before (the first, cache misses, re-runs after its
# workflow task was lost) before the rollout fails as worker_lost: a poison step ends, bounded.
MAX_STEP_STARTS = 5
MAX_CONNECTIONS = 20  # per worker process: the workflow pool's local steps and the env/generate pools' own


def producer_of(part: str = "") -> str:
    """The writing activity (and `part` of it): a retry (or a zombie attempt) of it shares the key, another run
    never does."""
    info = activity.info()
    return f"{info.workflow_run_id}/{info.activity_id}{part}"


class EpisodeStore:
    def __init__(self, database_url: str, store_retry_s: float = STORE_RETRY_S,
                 max_connections: int = MAX_CONNECTIONS) -> None:
        # Every statement of the episode on psycopg directly, in autocommit: reads and single-statement writes
        # need no BEGIN and COMMIT round trips; writes of several statements take a transaction. No SQLAlchemy.
        self._direct = DirectPool(database_url, max_size=max_connections)
        self._tasks: OrderedDict[tuple[str, str], Task] = OrderedDict()
        self._task_tools: OrderedDict[tuple[str, str], tuple[ToolSpec, ...]] = OrderedDict()
        self._chains = ChainCache()
        self.store_retry_s = store_retry_s

    # ---- reads and writes, each retried on its own (bounded) so a database blip costs no model call ----

    async def close(self) -> None:
        await self._direct.close()

    async def _read(self, what: str, read: Callable[[Conn], Awaitable[T]]) -> T:
        return await retry_read(self._direct.connection, read, what, budget_s=self.store_retry_s)

    async def _read_policy(self, read: Callable[[Conn], Awaitable[T]]) -> T:
        return await self._read("reading the policy version", read)

    async def _task(self, run_id: str, task_id: str) -> Task:
        key = (run_id, task_id)
        if key in self._tasks:
            self._tasks.move_to_end(key)
            return self._tasks[key]
        task = await self._read("reading the task", lambda s: load_task(s, run_id, task_id))
        if task is None:
            raise TaskError(f"task {task_id!r} of run {run_id!r} is not stored (start rollouts with the gymflow "
                            "client, which stores each task before starting its workflows)")
        self._tasks[key] = task
        if len(self._tasks) > _TASK_CACHE:
            self._tasks.popitem(last=False)
        return task

    async def _tools(self, task: Task, run_id: str) -> tuple[ToolSpec, ...]:
        """The tool schemas `begin` stored for the task; from the environment only for a task stored before."""
        key = (run_id, task.id)
        if key not in self._task_tools:
            stored = await self._read("reading the task's tools", lambda s: load_task_tools(s, run_id, task.id))
            if stored is None:
                env = get_environment(task.env)
                stored = tuple(env.tools(task, env.parse_task(task)))
            self._task_tools[key] = stored
            if len(self._task_tools) > _TASK_CACHE:
                self._task_tools.popitem(last=False)
        return self._task_tools[key]

    async def _chain(self, rollout_id: str, head_id: int) -> list[StoredMessage]:
        """The episode up to `head_id`; only what was appended since this worker last read it comes from
        Postgres (activities/chain_cache.py)."""
        known = self._chains.get(rollout_id)
        if known and known[-1].id == head_id:  # this worker wrote or read the head last: nothing to read
            return list(known)
        chain = await self._read("reading the episode", lambda s: read_chain_after(s, head_id, known))
        self._chains.put(rollout_id, chain)
        return chain

    async def _append(self, rollout_id: str, chain: list[StoredMessage], messages: list[NewMessage],
                      also: Callable[[Conn], Awaitable[None]] | None = None, part: str = ""
                      ) -> tuple[list[int], list[StoredMessage] | None]:
        """Append `messages` after `chain` (the episode up to its head; [] for the first messages), and run `also`
        in the same transaction. Returns their ids and None, or, when an earlier attempt of this producer had
        written its batch (whose contents may differ), ([], that batch). The chain this worker now holds is
        cached, so its next step here reads nothing back."""
        producer, out = producer_of(part), []
        parent = chain[-1] if chain else None
        encoded = encode(messages)
        # One message and nothing else: a single INSERT (its conflict check is a read): no transaction needed.
        single = len(messages) == 1 and also is None

        async def write() -> None:
            async with self._direct.connection() as conn:
                async with nullcontext() if single else conn.transaction():
                    out.append(await append_batch(conn, rollout_id=rollout_id,
                                                  parent_id=parent.id if parent else None, producer=producer,
                                                  messages=encoded))
                    if also is not None:
                        await also(conn)

        await retry_store(write, "appending to the episode", budget_s=self.store_retry_s)
        ids, earlier = out[-1]
        if earlier is None:
            self._chains.put(rollout_id, [*chain, *as_stored(ids, parent, encoded)])
        else:
            self._chains.drop(rollout_id)
        return ids, earlier

    async def _already_produced(self, rollout_id: str, part: str = "") -> list[StoredMessage]:
        """What an earlier attempt of this very activity stored (its completion was lost), oldest first. Nothing
        on a first attempt of a (non-local) activity: the producer key names this workflow run's activity, so no one
        else writes under it. A local activity starts again at attempt 1 when its workflow task is retried (the
        worker died before recording its result), so a local generate always looks: a model call is worth a read."""
        info = activity.info()
        if info.attempt == 1 and not (info.is_local and info.activity_type in _GENERATING and not part):
            return []
        producer = producer_of(part)
        return await self._read("reading earlier attempts", lambda s: produced(s, rollout_id, producer))

    async def _counted_start(self, rollout_id: str) -> list[StoredMessage]:
        """`_already_produced` for a local step on a worker that did not run the step before it: after its worker
        died or hung (the workflow task was retried elsewhere) or lost its cache. Counted in Postgres, so a step
        that takes its worker down every time ends typed after MAX_STEP_STARTS instead of moving on to the
        next worker forever (docs/architecture.md, "A poison rollout ends")."""
        producer = producer_of()
        starts, earlier = await self._read("counting the step's starts",
                                           lambda s: started_and_produced(s, rollout_id, producer))
        if starts > MAX_STEP_STARTS:
            raise GymflowError(f"this step was started {starts} times on a worker that had not run it before: each "
                               "time its workflow task was lost (the workflow pool's process died or hung)",
                               failure_type=WORKER_LOST)
        return earlier

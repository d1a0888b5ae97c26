"""The trainer iterator: a training loop pulls whole groups (the `n` samples of a task) as they complete.

- Source: a dataset (a sequence of tasks: epochs, a seeded shuffle per epoch) or a stream (any iterable or async
  iterable of tasks, taken once, in order).
- Backpressure: at most `max_groups_in_flight` groups (so `max_groups_in_flight * n` rollouts) run at once; the
  next task is started only when a group has been handed over.
- Ids: epoch `e`, sample `i` of a task is rollout `<run>/<task>/<e*n + i>`, so epochs never share a rollout id
  and the task id (and the stored task) stays the dataset's.
- Resume: `position` (the trainer saves it with its checkpoint) holds the first group not yet handed over and
  the groups after it that were. A new iterator given it starts exactly the remaining groups; rollouts that
  were in flight are attached to (same deterministic ids) or their finished results read, never run twice.
  The trainer persists it rather than gymflow, because only the trainer knows which groups its checkpoint has
  consumed.
- Incomplete groups: `incomplete` says wait (re-run failed members, at most `max_retries` rounds, then drop),
  drop, or hand over partial with the failed members marked (groups.py). Never silently partial.
- Staleness: with `max_staleness=K`, only groups whose oldest turn is at most K policy versions behind the
  current one are handed over (policy.py). `stale="finish_and_tag"` lets older ones finish and withholds them
  as `stale`; `"cancel_and_restart"` cancels an in-flight rollout as soon as the policy moves more than K past
  the version current at its start, starts it again, and re-runs finished members found stale at the end (at
  most `max_restarts` times per member, then the group is `stale`). `"continue"` keeps the work (AReaL's way):
  nothing is cancelled or withheld, an episode in flight goes on under the new version, every turn keeps the
  version that sampled it (records.TokenSequence.token_versions, beside the behaviour logprobs) and the group
  carries its lag (`Group.staleness`); K bounds how far generation runs ahead instead: no new group starts while
  one in flight began more than K versions behind the current one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from temporalio.service import RPCError

from gymflow.client import CANCEL_GRACE_S, GymflowClient, check_collectable
from gymflow.kernel.store.policy_versions import CACHE_TTL_S, NO_VERSION_ORDINAL, current_version, oldest_ordinals
from gymflow.kernel.store.repo import upsert_run
from gymflow.kernel.wire import RolloutInput, RolloutSummary, SamplingParams, Task
from gymflow.training.groups import (
    INCOMPLETE_POLICIES,
    Group,
    Incomplete,
    failed_members,
    incomplete_verdict,
)

Stale = Literal["finish_and_tag", "cancel_and_restart", "continue"]
STALE_POLICIES: tuple[Stale, ...] = ("finish_and_tag", "cancel_and_restart", "continue")
POLL_S = 0.5  # how often an in-flight rollout checks the policy version (cancel_and_restart)
ORDINAL_TTL_S = 0.5
CANCEL_TIMEOUT_S = 30.0
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Position:
    """Where a dataset iteration stands: groups before (epoch, index) are handed over, and so are `ahead`
    (pairs (epoch, index) past it, finished out of order). JSON round-trips through to_json / from_json."""

    epoch: int = 0
    index: int = 0
    ahead: tuple[tuple[int, int], ...] = ()

    def to_json(self) -> str:
        return json.dumps({"epoch": self.epoch, "index": self.index, "ahead": [list(p) for p in self.ahead]})

    @classmethod
    def from_json(cls, text: str | bytes) -> Position:
        try:
            raw = json.loads(text)
        except (ValueError, TypeError) as e:
            raise ValueError(f"position: not JSON ({e})") from None
        if not isinstance(raw, dict):
            raise ValueError("position: must be a JSON object with epoch, index, ahead")
        for key in ("epoch", "index"):
            if not _count(raw.get(key)):
                raise ValueError(f"position: {key} must be an integer >= 0, got {raw.get(key)!r}")
        ahead = raw.get("ahead", [])
        if not isinstance(ahead, list) or not all(isinstance(p, list) and len(p) == 2 and all(map(_count, p))
                                                  for p in ahead):
            raise ValueError("position: ahead must be a list of [epoch, index] pairs of integers >= 0")
        return cls(raw["epoch"], raw["index"], tuple(sorted((e, i) for e, i in ahead)))


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


@dataclass
class _Slot:
    epoch: int
    index: int
    task: Task


@dataclass
class _Member:
    inp: RolloutInput
    summary: RolloutSummary | None = None
    restarts: int = 0
    started_ordinal: int = NO_VERSION_ORDINAL


@dataclass
class RolloutIterator:
    """`async for group in RolloutIterator(...)`; `position` after each group is what to save; `stop()` drains
    (no new groups; the in-flight ones are still handed over); closing the loop early cancels the waits (the
    workflows keep running, and a restarted iterator attaches to them): use `async with` or `aclose()`, since
    `break` alone leaves that to the garbage collector. Withheld groups (dropped, stale) are
    counted in `withheld` and handed over too only with `include_withheld=True`."""

    client: GymflowClient
    run_id: str
    source: Sequence[Task] | Iterable[Task] | AsyncIterable[Task]
    n: int
    model: str
    max_groups_in_flight: int = 8
    epochs: int | None = 1  # None: forever (datasets only)
    seed: int = 0
    shuffle: bool = True
    start_position: Position | None = None
    incomplete: Incomplete = "wait"
    max_retries: int = 2
    max_staleness: int | None = None
    stale: Stale = "finish_and_tag"
    max_restarts: int = 3
    sampling: SamplingParams | None = None
    max_turns: int | None = None
    include_withheld: bool = False
    withheld: list[Group] = field(default_factory=list)

    def __post_init__(self) -> None:
        problems = []
        if not _count(self.n) or self.n < 1:
            problems.append(f"n must be an integer >= 1, got {self.n!r}")
        if not _count(self.max_groups_in_flight) or self.max_groups_in_flight < 1:
            problems.append(f"max_groups_in_flight must be an integer >= 1, got {self.max_groups_in_flight!r}")
        if self.incomplete not in INCOMPLETE_POLICIES:
            problems.append(f"incomplete must be one of {', '.join(INCOMPLETE_POLICIES)}, got {self.incomplete!r}")
        if self.stale not in STALE_POLICIES:
            problems.append(f"stale must be one of {', '.join(STALE_POLICIES)}, got {self.stale!r}")
        if self.max_staleness is not None and not _count(self.max_staleness):
            problems.append(f"max_staleness must be an integer >= 0 or None, got {self.max_staleness!r}")
        for name in ("max_retries", "max_restarts", "seed"):
            if not isinstance(getattr(self, name), int):
                problems.append(f"{name} must be an integer, got {getattr(self, name)!r}")
        self._dataset = list(self.source) if isinstance(self.source, Sequence) else None
        if self._dataset is not None:
            problems.extend(_dataset_problems(self._dataset))
            if self.epochs is not None and (not _count(self.epochs) or self.epochs < 1):
                problems.append(f"epochs must be an integer >= 1 or None, got {self.epochs!r}")
        elif self.epochs != 1:
            problems.append("epochs: a task stream is taken once; pass a sequence of tasks for epochs")
        if problems:
            raise ValueError("; ".join(problems))
        self.position = self.start_position or Position()
        self._done: set[tuple[int, int]] = set(self.position.ahead)
        self._stopping = False
        self._checked_envs: set[str] = set()
        self._ordinal_cache: tuple[float, int | None] = (-1e9, None)
        self._group_starts: dict[tuple[int, int], int] = {}  # (epoch, index) in flight -> ordinal at its start
        self._in_flight = 0
        self.max_seen_in_flight = 0  # the most groups ever running at once (backpressure, observable)
        self._gen: AsyncGenerator[Group, None] | None = None

    # ---- the trainer's side ------------------------------------------------------------------------

    def stop(self) -> None:
        """Start no more groups; the iteration ends once the in-flight ones are handed over (drain)."""
        self._stopping = True

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def __aiter__(self) -> RolloutIterator:
        return self

    async def __anext__(self) -> Group:
        if self._gen is None:
            self._gen = self._groups()
        return await self._gen.__anext__()

    async def aclose(self) -> None:
        """Stop now: the waits are cancelled (bounded), the workflows keep running for a later iterator."""
        if self._gen is not None:
            await self._gen.aclose()

    async def __aenter__(self) -> RolloutIterator:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _groups(self) -> AsyncGenerator[Group, None]:
        queue: asyncio.Queue[Group | BaseException | None] = asyncio.Queue()
        slots = asyncio.Semaphore(self.max_groups_in_flight)
        running: set[asyncio.Task[None]] = set()

        async def one(slot: _Slot) -> None:
            key = (slot.epoch, slot.index)
            try:
                if self.stale == "continue" and self.max_staleness is not None:
                    self._group_starts[key] = await self._current_ordinal() or NO_VERSION_ORDINAL
                item: Group | BaseException = await self._run_group(slot)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # surfaced to the trainer, never swallowed
                item = e
            finally:
                self._group_starts.pop(key, None)
            queue.put_nowait(item)

        async def produce() -> None:
            try:
                async for slot in self._slots():
                    await slots.acquire()  # released when a group is handed over: backpressure
                    await self._ahead_gate()
                    if self._stopping:
                        break
                    self._in_flight += 1
                    self.max_seen_in_flight = max(self.max_seen_in_flight, self._in_flight)
                    running.add(t := asyncio.create_task(one(slot)))
                    t.add_done_callback(running.discard)
            except Exception as e:  # a bad stream row: the trainer hears of it
                queue.put_nowait(e)
            queue.put_nowait(None)

        # `gymflow export` reads the run's samples per task to split its groups by epoch, as here.
        envs = ",".join(sorted({t.env for t in self._dataset})) if self._dataset is not None else None
        await self.client.in_store(lambda s: upsert_run(s, self.run_id, model=self.model, samples_per_task=self.n,
                                                        **({"env": envs} if envs else {})),
                                   f"recording run {self.run_id}")
        producer = asyncio.create_task(produce())
        produced_all = False
        try:
            while not (produced_all and self._in_flight == 0):
                item = await queue.get()
                if item is None:
                    produced_all = True
                    continue
                if isinstance(item, BaseException):
                    raise item
                self._in_flight -= 1
                self._advance(item.epoch, item.index)
                slots.release()
                if item.trainable:
                    yield item
                else:
                    self.withheld.append(item)
                    log.info("group %s withheld: %s (%s)", item.group_id, item.verdict, item.reason)
                    if self.include_withheld:
                        yield item
        finally:
            pending = [producer, *running]
            for t in pending:
                t.cancel()
            await asyncio.wait(pending, timeout=CANCEL_GRACE_S)  # bounded: nothing may hold the trainer

    def _advance(self, epoch: int, index: int) -> None:
        """Mark (epoch, index) handed over; move the cursor past every handed-over group in order."""
        self._done.add((epoch, index))
        e, i = self.position.epoch, self.position.index
        size = len(self._dataset) if self._dataset is not None else None
        while (e, i) in self._done:
            self._done.discard((e, i))
            i += 1
            if size is not None and i == size:
                e, i = e + 1, 0
        self.position = Position(e, i, tuple(sorted(self._done)))

    # ---- the source ----------------------------------------------------------------------------------

    async def _slots(self) -> AsyncIterator[_Slot]:
        skip = set(self._done)
        if self._dataset is not None:
            size, epoch, index = len(self._dataset), self.position.epoch, self.position.index
            check_collectable(self.client.settings, {t.env for t in self._dataset}, self.model, self.run_id)
            while self.epochs is None or epoch < self.epochs:
                order = self._order(epoch)
                for i in range(index, size):
                    if (epoch, i) not in skip:
                        yield _Slot(epoch, i, self._dataset[order[i]])
                epoch, index = epoch + 1, 0
            return
        seen: set[str] = set()
        i, start = 0, self.position.index
        async for task in _aiter(self.source):
            if not isinstance(task, Task):
                raise ValueError(f"task stream item {i}: expected a Task, got {type(task).__name__}")
            if task.id in seen:
                raise ValueError(f"task stream item {i}: duplicate task id {task.id!r} (its rollout ids would "
                                 "collide with the earlier one's)")
            seen.add(task.id)
            if task.env not in self._checked_envs:
                check_collectable(self.client.settings, {task.env}, self.model, self.run_id)
                self._checked_envs.add(task.env)
            if i >= start and (0, i) not in skip:
                yield _Slot(0, i, task)
            i += 1

    def _order(self, epoch: int) -> list[int]:
        """The epoch's task order: the same for the same seed and epoch in every process."""
        order = list(range(len(self._dataset or ())))
        if self.shuffle:
            random.Random(f"gymflow/{self.seed}/{epoch}").shuffle(order)  # str seeds hash the same everywhere
        return order

    # ---- one group -------------------------------------------------------------------------------------

    async def _run_group(self, slot: _Slot) -> Group:
        first = slot.epoch * self.n
        members = [_Member(self.client.make_input(self.run_id, slot.task, first + i, self.model, self.sampling,
                                                  self.max_turns)) for i in range(self.n)]
        await _all(self._run_member(m) for m in members)
        retries = 0
        while True:
            summaries = tuple(m.summary for m in members if m.summary is not None)
            broken = [m for m in members if m.summary and m.summary.status == "failed"]
            if self.incomplete == "wait" and broken and retries < self.max_retries:
                retries += 1  # only failed workflows can run again; a masked one is a result
                await _all(self._run_member(m, retry_failed=True) for m in broken)
                continue
            staleness, stale_members = await self._staleness(members)
            if stale_members and self.stale == "cancel_and_restart":
                restartable = [m for m in stale_members if m.restarts < self.max_restarts]
                if len(restartable) == len(stale_members):
                    for m in restartable:
                        m.restarts += 1
                    await _all(self._run_member(m, rerun=True) for m in restartable)
                    continue
            break
        verdict, reason = (("stale", f"oldest turn {staleness} policy versions behind; at most {self.max_staleness}")
                           if stale_members else incomplete_verdict(summaries, self.incomplete))
        return Group(self.run_id, slot.task, slot.epoch, slot.index, summaries, verdict, failed_members(summaries),
                     staleness, sum(m.restarts for m in members), retries, reason)

    async def _staleness(self, members: list[_Member]) -> tuple[int | None, list[_Member]]:
        """(current ordinal - the group's oldest turn's ordinal, the members over the bound); (None, []) when
        no bound is set or no version was ever declared."""
        if self.max_staleness is None:
            return None, []
        current = await self._current_ordinal(fresh=True)
        if current is None:
            return None, []
        ids = [m.inp.rollout_id for m in members]
        oldest = await self.client.in_store(lambda s: oldest_ordinals(s, ids), f"reading the policy versions of "
                                            f"{self.run_id}")
        if not oldest:
            return 0, []
        staleness = current - min(oldest.values())
        if self.stale == "continue":
            return staleness, []  # measured, never withheld: the trainer corrects for it
        over = [m for m in members if current - oldest.get(m.inp.rollout_id, current) > self.max_staleness]
        return staleness, over

    async def _ahead_gate(self) -> None:
        """stale="continue" with K: wait while a group in flight began more than K versions behind the current
        one. Ends: those groups go on to their end (their rollouts' own timeouts bound them) and leave the set."""
        if self.stale != "continue" or self.max_staleness is None:
            return
        while self._group_starts and not self._stopping:
            current = await self._current_ordinal()
            if current is None or current - min(self._group_starts.values()) <= self.max_staleness:
                return
            await asyncio.sleep(POLL_S)

    async def _current_ordinal(self, fresh: bool = False) -> int | None:
        loop = asyncio.get_running_loop()
        at, value = self._ordinal_cache
        if fresh or loop.time() - at >= ORDINAL_TTL_S:
            now = await self.client.in_store(lambda s: current_version(s, self.model),
                                             f"reading the policy version of {self.model}")
            value = now.ordinal if now else None
            self._ordinal_cache = (loop.time(), value)
        return value

    async def _run_member(self, m: _Member, *, retry_failed: bool = False, rerun: bool = False) -> None:
        """Run (or attach to) one rollout to its end; under cancel_and_restart, cancel and start it again when
        the policy moves more than max_staleness past the version current at its start."""
        watch = self.max_staleness is not None and self.stale == "cancel_and_restart"
        while True:
            m.started_ordinal = (await self._current_ordinal() or NO_VERSION_ORDINAL) if watch else 0
            run = asyncio.create_task(self.client.run_one(m.inp, retry_failed=retry_failed, rerun=rerun))
            cancelled = False
            try:
                while not (await asyncio.wait({run}, timeout=POLL_S if watch else None))[0]:
                    current = await self._current_ordinal()
                    if (current is not None and current - m.started_ordinal > (self.max_staleness or 0)
                            and m.restarts < self.max_restarts):
                        cancelled = await self._cancel(m.inp.rollout_id)
                        break
            except BaseException:
                run.cancel()
                raise
            result = await run  # a cancelled workflow ends as a recorded `workflow_cancelled` failure
            if cancelled and result.summary.status == "failed":
                # Temporal counts a cancelled run as failed, so ALLOW_DUPLICATE_FAILED_ONLY starts it again;
                # once the generate workers' cached view (policy.CACHE_TTL_S) has seen the version we saw.
                await asyncio.sleep(max(0.0, self._ordinal_cache[0] + CACHE_TTL_S - asyncio.get_running_loop().time()))
                m.restarts += 1
                retry_failed, rerun = True, False
                continue
            m.summary = result.summary
            return

    async def _cancel(self, rollout_id: str) -> bool:
        handle = self.client.temporal.get_workflow_handle(rollout_id)
        try:
            await asyncio.wait_for(handle.cancel(), timeout=CANCEL_TIMEOUT_S)
        except (RPCError, TimeoutError) as e:  # it finished meanwhile, or Temporal is away: the end check decides
            log.info("cancelling stale rollout %s: %s", rollout_id, e)
            return False
        return True


async def _all(runs: Iterable[Coroutine[Any, Any, None]]) -> None:
    """Run them together; the first error cancels the others (none is left running unawaited)."""
    try:
        async with asyncio.TaskGroup() as group:
            for run in runs:
                group.create_task(run)
    except ExceptionGroup as errors:
        raise errors.exceptions[0] from None


def _dataset_problems(tasks: list[Task]) -> list[str]:
    problems = []
    if not tasks:
        problems.append("dataset: no tasks")
    bad = next((i for i, t in enumerate(tasks) if not isinstance(t, Task)), None)
    if bad is not None:
        problems.append(f"dataset item {bad}: expected a Task, got {type(tasks[bad]).__name__}")
        return problems
    seen: dict[str, int] = {}
    for i, t in enumerate(tasks):
        if t.id in seen:
            problems.append(f"dataset item {i}: duplicate task id {t.id!r} (also item {seen[t.id]})")
            break
        seen[t.id] = i
    return problems


async def _aiter(source: Iterable[Task] | AsyncIterable[Task]) -> AsyncIterator[Task]:
    if isinstance(source, AsyncIterable):
        async for t in source:
            yield t
    else:
        for t in source:
            yield t


async def iterate_groups(client: GymflowClient, run_id: str, dataset_or_stream: Sequence[Task] | Iterable[Task]
                         | AsyncIterable[Task], *, n: int, model: str, max_groups_in_flight: int = 8,
                         epochs: int | None = 1, seed: int = 0, start_position: Position | None = None,
                         incomplete: Incomplete = "wait", max_staleness: int | None = None,
                         stale: Stale = "finish_and_tag", **options: Any) -> AsyncIterator[Group]:
    """Functional form of RolloutIterator (options: shuffle, max_retries, max_restarts, sampling, max_turns,
    include_withheld). Use the class to read `position` between groups."""
    it = RolloutIterator(client, run_id, dataset_or_stream, n, model, max_groups_in_flight=max_groups_in_flight,
                         epochs=epochs, seed=seed, start_position=start_position, incomplete=incomplete,
                         max_staleness=max_staleness, stale=stale, **options)
    async with it:
        async for group in it:
            yield group


__all__ = ["Position", "RolloutIterator", "iterate_groups"]

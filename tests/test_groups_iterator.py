"""Groups and the trainer iterator (gymflow/training/iterator.py): unit tests, then the real stack."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import Counter
from typing import Any

import pytest
from gymflow.environments import registry

from gymflow.kernel.wire import RolloutSummary
from gymflow.testing.scripted_openai import Reply, context_length_error, text, tool_call
from gymflow.training.groups import failed_members, incomplete_verdict
from gymflow.training.iterator import Position, RolloutIterator
from gymflow.training.policy import declare_policy_version
from gymflow.training.rows import row_group
from tests.faulty_env import (  # noqa: F401 - faulty_env is a fixture
    ENTRY_POINT,
    FaultyEnvironment,
    faulty_env,
    faulty_task,
)

# ---- units -----------------------------------------------------------------------------------------------


def _summary(i: int, status: str = "completed", reward: float | None = 1.0, masked: bool = False,
             failure_type: str | None = None) -> RolloutSummary:
    return RolloutSummary(rollout_id=f"r/t/{i}", run_id="r", task_id="t", sample_index=i, status=status,
                          reward=reward, masked=masked, failure_type=failure_type)


def test_verdicts_never_pass_a_partial_group_as_complete():
    whole = (_summary(0), _summary(1, reward=0.0))
    broken = (_summary(0), _summary(1, "failed", None, failure_type="context_length_exceeded"),
              _summary(2, masked=True, reward=None))
    assert incomplete_verdict(whole, "drop") == ("complete", None)
    assert failed_members(broken) == (1, 2)
    assert incomplete_verdict(broken, "partial") == ("partial", None)
    verdict, why = incomplete_verdict(broken, "drop")
    assert verdict == "dropped" and "2 of 3" in why and "context_length_exceeded" in why and "masked" in why
    assert incomplete_verdict(broken, "wait")[0] == "dropped"  # what retries did not mend


def test_position_round_trip_and_bad_input():
    pos = Position(2, 3, ((2, 5), (3, 0)))
    assert Position.from_json(pos.to_json()) == pos
    for bad, field in (("[]", "object"), ('{"epoch": -1, "index": 0}', "epoch"), ('{"epoch": 0, "index": "x"}',
                       "index"), ('{"epoch": 0, "index": 0, "ahead": [[1]]}', "ahead"), ("{", "not JSON")):
        with pytest.raises(ValueError, match=field):
            Position.from_json(bad)


class _FakeClient:
    settings = None


def _it(tasks: list, **kw: Any) -> RolloutIterator:
    return RolloutIterator(_FakeClient(), "run", tasks, 2, "policy", **kw)  # type: ignore[arg-type]


def test_shuffle_is_seeded_per_epoch_and_cursor_skips_what_was_handed_over():
    tasks = [faulty_task(f"t{i}") for i in range(8)]
    a, b = _it(tasks, seed=5), _it(tasks, seed=5)
    assert a._order(0) == b._order(0) and sorted(a._order(0)) == list(range(8))
    assert a._order(0) != a._order(1) or a._order(1) != a._order(2)  # epochs are reshuffled
    assert _it(tasks, shuffle=False)._order(3) == list(range(8))
    a._advance(0, 1)  # out of order: the cursor stays, (0, 1) is remembered
    assert a.position == Position(0, 0, ((0, 1),))
    for i in (0, 2, 3, 4, 5, 6, 7):
        a._advance(0, i)
    assert a.position == Position(1, 0, ())


async def test_continue_holds_new_groups_while_one_in_flight_is_over_the_bound(monkeypatch):
    it = _it([faulty_task("t0")], stale="continue", max_staleness=1)
    current = {"ordinal": 3}

    async def ordinal(fresh: bool = False) -> int:
        return current["ordinal"]

    monkeypatch.setattr(it, "_current_ordinal", ordinal)
    monkeypatch.setattr("gymflow.training.iterator.POLL_S", 0.01)
    it._group_starts = {(0, 0): 2, (0, 1): 1}  # (0, 1) began 2 versions back: over K = 1
    gate = asyncio.create_task(it._ahead_gate())
    await asyncio.sleep(0.1)
    assert not gate.done()  # held
    it._group_starts.pop((0, 1))  # that group ended; the other is 1 behind: within K
    await asyncio.wait_for(gate, 1)
    assert await asyncio.wait_for(_it([faulty_task("t0")], stale="continue")._ahead_gate(), 1) is None  # no K


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="duplicate task id 't0'"):
        _it([faulty_task("t0"), faulty_task("t0")])
    with pytest.raises(ValueError, match="incomplete must be one of"):
        _it([faulty_task("t0")], incomplete="retry")
    with pytest.raises(ValueError, match="max_groups_in_flight"):
        _it([faulty_task("t0")], max_groups_in_flight=0)
    with pytest.raises(ValueError, match="stream is taken once"):
        RolloutIterator(_FakeClient(), "run", iter([faulty_task("t0")]), 2, "policy", epochs=2)  # type: ignore


# ---- the real stack ------------------------------------------------------------------------------------------


class Responder:
    """Answers by each request's first user message: a context-length error for the first request of the
    prompts in `fail_first`; with `multi_turn`, a `sleep` tool call first and text after the tool result."""

    def __init__(self, fail_first: set[str] = frozenset(), multi_turn: bool = False, delay_s: float = 0.0,
                 slow: dict[str, float] | None = None):
        self.fail_first, self.multi_turn, self.delay_s, self.slow = fail_first, multi_turn, delay_s, slow or {}
        self.seen: Counter[str] = Counter()
        self._lock = threading.Lock()

    def __call__(self, body: dict[str, Any]) -> Reply:
        messages = body["messages"]
        prompt = next(m["content"] for m in messages if m["role"] == "user")
        with self._lock:
            first = self.seen[prompt] == 0
            self.seen[prompt] += 1
        if first and prompt in self.fail_first:
            return context_length_error()
        delay = self.slow.get(prompt, self.delay_s)
        if self.multi_turn and messages[-1]["role"] == "user":
            return tool_call("sleep", {}, delay_s=delay)
        return text("done", delay_s=delay)


@pytest.fixture
def installed(request, monkeypatch):
    """The test environment is listed as installed, so the iterator's up-front check accepts it."""
    name, real = request.getfixturevalue("faulty_env"), registry.available
    monkeypatch.setattr(registry, "available", lambda: {**real(), name: ENTRY_POINT.value})


@pytest.fixture
def respond(scripted):
    def install(responder: Responder) -> Responder:
        scripted.responder = responder
        return responder

    yield install
    scripted.responder = None


def _max_overlap(starts: list[float], length: float) -> int:
    events = sorted([(s, 1) for s in starts] + [(s + length, -1) for s in starts], key=lambda e: (e[0], e[1]))
    now = best = 0
    for _, step in events:
        now += step
        best = max(best, now)
    return best


@pytest.mark.usefixtures("installed")
async def test_whole_groups_only_and_backpressure(gf, scripted, respond, sql, run_id):
    respond(Responder(delay_s=0.4))
    tasks = [faulty_task(f"g{i}", text=f"{run_id} g{i}") for i in range(4)]
    it = RolloutIterator(gf, run_id, tasks, n=2, model="policy", max_groups_in_flight=2, seed=1)
    groups = []
    async with it:
        async for g in it:
            ids = [m.rollout_id for m in g.members]
            # Handed over only once every member has ended and is stored.
            assert sql("SELECT count(*) FROM rollouts WHERE id = ANY(%s) AND finished_at IS NOT NULL", ids) == [(2,)]
            groups.append(g)
    assert sorted(g.task.id for g in groups) == ["g0", "g1", "g2", "g3"]
    assert all(g.verdict == "complete" and len(g.members) == 2 and g.failed == () for g in groups)
    assert {m.sample_index for g in groups for m in g.members} == {0, 1}
    overlap = _max_overlap([r.at for r in scripted.requests], 0.4)
    assert 2 <= overlap <= 4, overlap  # two groups of two; unbounded, all eight would overlap
    assert it.max_seen_in_flight == 2 and it.position == Position(1, 0, ())


@pytest.mark.parametrize("policy", ["drop", "partial", "wait"])
@pytest.mark.usefixtures("installed")
async def test_incomplete_group_verdicts(gf, respond, sql, run_id, policy):
    bad = f"{run_id} bad"
    respond(Responder(fail_first={bad}))
    tasks = [faulty_task("ok", text=f"{run_id} ok"), faulty_task("bad", text=bad)]
    it = RolloutIterator(gf, run_id, tasks, n=2, model="policy", incomplete=policy, shuffle=False)
    async with it:
        got = {g.task.id: g async for g in it}
    assert got["ok"].verdict == "complete"
    if policy == "drop":
        assert "bad" not in got and [g.task.id for g in it.withheld] == ["bad"]
        (dropped,) = it.withheld
        assert dropped.verdict == "dropped" and not dropped.trainable and len(dropped.failed) == 1
        assert "context_length_exceeded" in dropped.reason
    elif policy == "partial":
        group = got["bad"]
        assert group.verdict == "partial" and len(group.failed) == 1 and group.trainable
        (failed,) = [m for m in group.members if m.sample_index in group.failed]
        assert failed.failure_type == "context_length_exceeded" and group.rewards.count(None) == 1
    else:
        group = got["bad"]
        assert group.verdict == "complete" and group.retries == 1 and group.failed == ()
        statuses = sql("SELECT status FROM rollouts WHERE run_id = %s AND task_id = 'bad'", run_id)
        assert sorted(s for (s,) in statuses) == ["completed", "completed"]  # the re-run replaced the failure


@pytest.mark.usefixtures("installed")
async def test_stop_and_resume_from_position_no_duplicate_no_skip(gf, scripted, respond, sql, run_id):
    tasks = [faulty_task(f"s{i}", text=f"{run_id} s{i}") for i in range(5)]

    def make(position: Position | None) -> RolloutIterator:
        return RolloutIterator(gf, run_id, tasks, n=2, model="policy", epochs=2, seed=3, max_groups_in_flight=3,
                               start_position=position)

    first, seen, grouped = make(None), [], {}
    slow = tasks[first._order(0)[0]]  # the first group in order finishes last: later ones are handed over first
    respond(Responder(delay_s=0.1, slow={slow.messages[0].content: 2.5}))
    async with first:
        async for g in first:
            seen.append((g.epoch, g.task.id))
            grouped |= {m.rollout_id: g.group_id for m in g.members}
            if len(seen) == 3:
                break  # the trainer stops with groups in flight
    assert first.position.index == 0 and len(first.position.ahead) == 3  # the cursor waits for the slow one
    saved = first.position.to_json()
    second = make(Position.from_json(saved))  # as a new trainer process would
    async with second:
        async for g in second:
            seen.append((g.epoch, g.task.id))
            grouped |= {m.rollout_id: g.group_id for m in g.members}
    assert sorted(seen) == sorted((e, t.id) for e in (0, 1) for t in tasks)  # each once: no duplicate, no skip
    rows = sql("SELECT task_id, sample_index FROM rollouts WHERE run_id = %s", run_id)
    assert sorted(rows) == sorted((t.id, s) for t in tasks for s in range(4))  # epoch 1 = samples 2, 3
    assert len(scripted.requests) == 20  # in-flight rollouts were attached to, never run twice
    # The run records its samples per task, so `gymflow export` puts each rollout in the group it was handed
    # over in (one task, one epoch), not one group per task across epochs.
    assert sql("SELECT samples_per_task FROM runs WHERE id = %s", run_id) == [(2,)]
    stored = sql("SELECT id, run_id, task_id, sample_index FROM rollouts WHERE run_id = %s", run_id)
    assert {r[0]: row_group(dict(zip(("id", "run_id", "task_id", "sample_index"), r, strict=True)), 2)
            for r in stored} == grouped
    assert len(set(grouped.values())) == 10


@pytest.mark.usefixtures("installed")
async def test_stop_drains_the_groups_in_flight(gf, respond, sql, run_id):
    respond(Responder(delay_s=0.3))
    tasks = [faulty_task(f"d{i}", text=f"{run_id} d{i}") for i in range(4)]
    it = RolloutIterator(gf, run_id, tasks, n=1, model="policy", max_groups_in_flight=2, shuffle=False)
    got = []
    async with it:
        async for g in it:
            got.append(g.task.id)
            it.stop()  # no new group; the one still running is handed over, then the iteration ends
    assert sorted(got) == ["d0", "d1"] and it.in_flight == 0 and it.position == Position(0, 2, ())
    assert sql("SELECT count(*) FROM rollouts WHERE run_id = %s", run_id) == [(2,)]  # nothing left behind
    rest = RolloutIterator(gf, run_id, tasks, n=1, model="policy", shuffle=False, start_position=it.position)
    async with rest:
        assert sorted([g.task.id async for g in rest]) == ["d2", "d3"]


@pytest.mark.usefixtures("installed")
async def test_task_stream(gf, respond, run_id):
    respond(Responder())

    async def stream(ids: list[str]):
        for i in ids:
            yield faulty_task(i, text=f"{run_id} {i}")

    it = RolloutIterator(gf, run_id, stream(["a", "b"]), n=1, model="policy")
    async with it:
        assert sorted([g.task.id async for g in it]) == ["a", "b"]
    assert it.position == Position(0, 2, ())
    dup = RolloutIterator(gf, run_id, stream(["a", "c", "a"]), n=1, model="policy")
    with pytest.raises(ValueError, match="item 2: duplicate task id 'a'"):
        async with dup:
            _ = [g async for g in dup]


async def _wait_requests(scripted, count: int, timeout_s: float = 20.0) -> None:
    end = time.monotonic() + timeout_s
    while len(scripted.requests) < count:
        assert time.monotonic() < end, f"only {len(scripted.requests)} model requests"
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("stale", ["finish_and_tag", "cancel_and_restart", "continue"])
@pytest.mark.usefixtures("installed")
async def test_staleness_zero(gf, scripted, respond, sql, run_id, stale, monkeypatch):
    real_verify = FaultyEnvironment.verify

    async def quick_verify(self, data, messages, state, ctx):  # noqa: ANN001, ANN202 - only the tool need be slow
        return await real_verify(self, data.model_copy(update={"slow_s": 0.0}), messages, state, ctx)

    monkeypatch.setattr(FaultyEnvironment, "verify", quick_verify)
    respond(Responder(multi_turn=True))
    old, new = f"old-{uuid.uuid4().hex[:8]}", f"new-{uuid.uuid4().hex[:8]}"
    await declare_policy_version(gf, "policy", old)
    await asyncio.sleep(0.6)  # the generate pool's view of the current version is at most 0.5 s old
    tasks = [faulty_task(f"k{i}", text=f"{run_id} k{i}", slow_s=2.0) for i in range(2)]
    it = RolloutIterator(gf, run_id, tasks, n=2, model="policy", max_staleness=0, stale=stale,
                         include_withheld=True)

    async def drain() -> list:
        async with it:
            return [g async for g in it]

    run = asyncio.create_task(drain())
    await _wait_requests(scripted, 4)  # every member's first turn came from `old`; now the policy moves on
    await declare_policy_version(gf, "policy", new)
    groups = await asyncio.wait_for(run, 60)
    versions = sql("SELECT g.rollout_id, g.turn, g.policy_version FROM generations g JOIN rollouts r "
                   "ON r.id = g.rollout_id WHERE r.run_id = %s ORDER BY 1, 2", run_id)
    assert len(groups) == 2
    if stale == "continue":  # the work is kept: no member cancelled, none withheld, each turn its own version
        assert all(g.verdict == "complete" and g.staleness == 1 and g.trainable and g.restarts == 0 for g in groups)
        assert it.withheld == [] and len(scripted.requests) == 4 * 2
        assert {(turn, v) for _, turn, v in versions} == {(0, old), (1, new)}
        assert sorted(sql("SELECT status FROM rollouts WHERE run_id = %s", run_id)) == [("completed",)] * 4
    elif stale == "finish_and_tag":
        assert all(g.verdict == "stale" and g.staleness == 1 and not g.trainable for g in groups)
        assert len(it.withheld) == 2 and all(v == old for _, turn, v in versions if turn == 0)
        statuses = sql("SELECT status FROM rollouts WHERE run_id = %s", run_id)
        assert sorted(statuses) == [("completed",)] * 4  # finished, tagged, not cancelled
    else:
        assert all(g.verdict == "complete" and g.staleness == 0 and g.restarts >= 1 for g in groups), groups
        assert len(versions) == 8 and {v for *_, v in versions} == {new}  # every turn of every member
        # Cancelled in flight (during the tool call) and started again: one old turn each, then two new ones,
        # the restart under ALLOW_DUPLICATE_FAILED_ONLY (client.run_one's retry_failed); were it refused, the
        # member would end as the cancelled run.
        assert len(scripted.requests) == 4 * 3
        # Each id: the cancelled run (EpisodeWorkflow records a cancellation and ends FAILED) and its restart.
        runs = Counter([(w.id, w.status.name) async for w in gf.temporal.list_workflows(f"GymflowRun = '{run_id}'")])
        assert runs == Counter({(f"{run_id}/k{t}/{i}", s): 1 for t in (0, 1) for i in (0, 1)
                                for s in ("FAILED", "COMPLETED")})
        assert it.withheld == []

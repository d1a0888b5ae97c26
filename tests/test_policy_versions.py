"""Policy versions (gymflow/kernel/store/policy_versions.py): declarations, and every turn stamped with its version."""

from __future__ import annotations

import asyncio
import time
import uuid
from types import SimpleNamespace
from typing import Any

import pytest

from gymflow.kernel.errors import ConfigError
from gymflow.kernel.store.policy_versions import (
    MAX_VERSION_CHARS,
    Current,
    PolicyCache,
    reported_version,
    set_policy_version,
)
from gymflow.testing.scripted_openai import completion_json, text, tool_call
from gymflow.training.policy import declare_policy_version
from tests.faulty_env import faulty_env, faulty_task  # noqa: F401 - faulty_env is a fixture


def test_reported_version_takes_only_a_short_clean_string():
    def resp(value: Any) -> SimpleNamespace:
        return SimpleNamespace(model_extra={"policy_version": value})

    assert reported_version(resp("step-7")) == "step-7"
    assert reported_version(resp(7)) == "7"
    for hostile in (True, None, {"a": 1}, ["x"], "", "a\x00b", "x" * (MAX_VERSION_CHARS + 1), 1.5):
        assert reported_version(resp(hostile)) is None, hostile
    assert reported_version(SimpleNamespace()) is None and reported_version(SimpleNamespace(model_extra=None)) is None
    assert reported_version(SimpleNamespace(policy_version="w-3")) == "w-3"  # gymflow's parsed Completion
    assert reported_version(SimpleNamespace(policy_version="\x00" * 10_000)) is None


async def test_cache_reads_at_most_once_per_interval():
    reads: list[int] = []

    async def read(query: Any) -> Current:
        reads.append(1)
        return Current("m", f"v{len(reads)}", len(reads))

    cache = PolicyCache(ttl_s=0.3)
    first = await cache.current("m", read)
    assert await cache.current("m", read) == first and len(reads) == 1
    await asyncio.sleep(0.35)
    assert (await cache.current("m", read)).version == "v2"
    meta = await cache.turn_meta("m", read, Current("m", "v2", 2), None)
    assert meta == {"policy_version": "v2", "policy_ordinal": 2}


async def test_declarations_get_increasing_ordinals(gf, run_id):
    model = f"m-{run_id}"

    async def declare(version: str) -> Current:
        return await gf.in_store(lambda s: set_policy_version(s, model, version), "test")

    a, b, again = await declare("a"), await declare("b"), await declare("b")
    assert (a.ordinal, b.ordinal) == (1, 2) and again == b  # re-declaring the current one ages nothing
    assert (await declare("a")).ordinal == 3  # a rollback is a new declaration
    with pytest.raises(ValueError, match="policy version: empty"):
        await declare(" ")
    with pytest.raises(ValueError, match="control character"):
        await declare("v\x00")
    with pytest.raises(ConfigError, match="not configured"):
        await declare_policy_version(gf, "no-such-model", "v1")


async def _wait_requests(scripted, count: int, timeout_s: float = 20.0) -> None:
    end = time.monotonic() + timeout_s
    while len(scripted.requests) < count:
        assert time.monotonic() < end, f"only {len(scripted.requests)} model requests"
        await asyncio.sleep(0.05)


@pytest.mark.usefixtures("faulty_env")
async def test_each_turn_records_the_version_that_produced_it(gf, scripted, sql, run_id):
    v1, v2 = f"v1-{uuid.uuid4().hex[:8]}", f"v2-{uuid.uuid4().hex[:8]}"
    first = await declare_policy_version(gf, "policy", v1)
    await asyncio.sleep(0.6)  # older cached views in the generate pool expire
    scripted.script(tool_call("sleep", {}), text("done"))
    inp = gf.make_input(run_id, faulty_task("p", slow_s=1.5), 0, "policy")
    run = asyncio.create_task(gf.run_one(inp))
    await _wait_requests(scripted, 1)  # turn 0 is generated; the slow tool runs
    second = await declare_policy_version(gf, "policy", v2)
    assert (await run).summary.status == "completed"
    assert second.ordinal == first.ordinal + 1
    rows = sql("SELECT turn, policy_version FROM generations WHERE rollout_id = %s ORDER BY turn", inp.rollout_id)
    assert rows == [(0, v1), (1, v2)]
    ordinals = sql("SELECT (tokens->>'policy_ordinal')::int FROM messages WHERE rollout_id = %s AND role = "
                   "'assistant' ORDER BY id", inp.rollout_id)
    assert ordinals == [(first.ordinal,), (second.ordinal,)]


@pytest.mark.usefixtures("faulty_env")
async def test_the_servers_own_version_wins(gf, scripted, sql, run_id):
    served = f"srv-{uuid.uuid4().hex[:8]}"
    known = await declare_policy_version(gf, "policy", served)
    await declare_policy_version(gf, "policy", f"later-{uuid.uuid4().hex[:8]}")
    await asyncio.sleep(0.6)
    body = {"id": "c1", "object": "chat.completion", "created": 0, "model": "m", "policy_version": served,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
    scripted.script(completion_json(body))
    inp = gf.make_input(run_id, faulty_task("s"), 0, "policy")
    assert (await gf.run_one(inp)).summary.status == "completed"
    assert sql("SELECT policy_version FROM generations WHERE rollout_id = %s", inp.rollout_id) == [(served,)]
    # Its ordinal is that version's, not the (newer) declared one's: staleness stays exact.
    assert sql("SELECT (tokens->>'policy_ordinal')::int FROM messages WHERE rollout_id = %s AND role = "
               "'assistant'", inp.rollout_id) == [(known.ordinal,)]

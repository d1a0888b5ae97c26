"""Transient model failures retry (bounded, Retry-After honoured); deterministic ones fail typed, once."""

from __future__ import annotations

from gymflow.testing.scripted_openai import context_length_error, http_error, text
from tests.helpers import user_task


async def test_500_then_success_records_attempts(gf, scripted, sql, run_id):
    scripted.script(http_error(500, "upstream exploded"), text("fine now"))
    inp = gf.make_input(run_id, user_task("hi"), 0, "policy")
    summary = await gf.run_rollout(inp)
    assert summary.status == "completed"
    assert len(scripted.requests) == 2
    assert sql("SELECT status, attempts FROM rollouts WHERE id = %s", inp.rollout_id) == [("completed", 2)]
    assert sql("SELECT turn, attempt FROM generations WHERE rollout_id = %s", inp.rollout_id) == [(0, 2)]


async def test_429_waits_for_retry_after(gf, scripted, sql, run_id):
    # Backoff in tests starts at 0.2 s, so a gap of >= 2 s can only come from Retry-After.
    scripted.script(http_error(429, "slow down", headers={"Retry-After": "2"}), text("ok"))
    inp = gf.make_input(run_id, user_task("hi"), 0, "policy")
    summary = await gf.run_rollout(inp)
    assert summary.status == "completed"
    first, second = scripted.requests[0].at, scripted.requests[1].at
    assert second - first >= 2.0
    assert sql("SELECT attempts FROM rollouts WHERE id = %s", inp.rollout_id) == [(2,)]


async def test_context_length_fails_typed_without_retry(gf, scripted, sql, run_id):
    scripted.script(context_length_error())
    inp = gf.make_input(run_id, user_task("a very long prompt"), 0, "policy")
    summary = await gf.run_rollout(inp)
    assert summary.status == "failed"
    assert summary.failure_type == "context_length_exceeded"
    assert len(scripted.requests) == 1, "a deterministic 400 must not be retried"
    rows = sql("SELECT status, failure_type, failure_message, reward FROM rollouts WHERE id = %s", inp.rollout_id)
    assert rows[0][:2] == ("failed", "context_length_exceeded")
    assert "maximum context length" in rows[0][2]
    assert rows[0][3] is None, "a failed rollout is never scored 0"
    desc = await gf.temporal.get_workflow_handle(inp.rollout_id).describe()
    assert desc.status.name == "FAILED"


async def test_persistent_5xx_ends_failed_after_bounded_retries(gf, scripted, sql, run_id):
    scripted.script(*[http_error(503, "down")] * 10)
    inp = gf.make_input(run_id, user_task("hi"), 0, "policy")
    summary = await gf.run_rollout(inp)
    assert summary.status == "failed" and summary.failure_type == "model_unavailable"
    assert len(scripted.requests) == 4  # TEST_LIMITS.generate.max_attempts
    assert sql("SELECT status, failure_type FROM rollouts WHERE id = %s", inp.rollout_id) == [
        ("failed", "model_unavailable")]

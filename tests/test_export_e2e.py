"""A two-turn tool rollout group through the real stack, the scripted server returning vLLM-style token ids from
a deterministic tokenizer, exported as RL records: the mask is 1 exactly on generated tokens, logprobs line up,
and a server that re-templates history is caught as drift."""

from __future__ import annotations

import json

from gymflow.kernel.store.db import make_engine, make_sessionmaker
from gymflow.testing.scripted_openai import (
    assistant_token_ids,
    prompt_token_ids,
    token_logprob,
    weather_responder,
)
from gymflow.training.export import export_run
from tests.helpers import weather_task


async def _collect(gf, run_id, n):
    results = [r async for r in gf.collect(run_id, [weather_task()], n=n, model="vllm")]
    assert [r.summary.status for r in results] == ["completed"] * n


async def _export_rl(url, run_id, out):
    engine = make_engine(url, pool_size=1)
    try:
        async with make_sessionmaker(engine)() as session:
            return await export_run(session, run_id, "rl", out)
    finally:
        await engine.dispose()


def _read_jsonl(path):
    return {r["rollout_id"]: r for r in map(json.loads, path.read_text().splitlines())}


async def test_rl_export_of_a_tool_rollout_group_is_token_exact(gf, scripted, stack, sql, run_id, tmp_path):
    scripted.responder = weather_responder  # a tool call, then an answer from the tool's result
    try:
        scripted.tokenizer = "deterministic"
        await _collect(gf, run_id, n=2)
        scripted.tokenizer = "drift"
        await _collect(gf, f"{run_id}-drift", n=1)
    finally:
        scripted.responder, scripted.tokenizer = None, None

    summary = await _export_rl(stack.database_url, run_id, tmp_path / "rl.jsonl")
    assert summary.rows == 2 and not summary.excluded and not summary.flagged
    rows = _read_jsonl(tmp_path / "rl.jsonl")
    for rid, row in rows.items():
        (transcript,) = sql("SELECT transcript FROM rollouts WHERE id = %s", rid)[0]
        assert [m["role"] for m in transcript] == ["system", "user", "assistant", "tool", "assistant"]
        # What the server saw and generated, recomputed from the stored conversation.
        p0, g0 = prompt_token_ids(transcript[:2]), assistant_token_ids(None, transcript[2]["tool_calls"])
        p1, g1 = prompt_token_ids(transcript[:4]), assistant_token_ids(transcript[4]["content"], None)
        assert p1[:len(p0) + len(g0)] == p0 + g0  # the tokenizer mode really is prefix-consistent
        env = len(p1) - len(p0) - len(g0)
        assert row["input_ids"] == p1 + g1
        assert row["loss_mask"] == [0] * len(p0) + [1] * len(g0) + [0] * env + [1] * len(g1)
        assert row["logprobs"] == [token_logprob(t) if m else 0.0
                                   for t, m in zip(row["input_ids"], row["loss_mask"], strict=True)]
        assert row["reward"] == 1.0 and row["group_id"] == f"{run_id}/{row['task_id']}/e0"
        assert not row["token_drift"] and row["turns_in_sequence"] == row["turns"] == 2
    assert len({r["group_id"] for r in rows.values()}) == 1

    drift = await _export_rl(stack.database_url, f"{run_id}-drift", tmp_path / "drift.jsonl")
    assert drift.rows == 1 and sum(drift.flagged.values()) == 1
    (row,) = _read_jsonl(tmp_path / "drift.jsonl").values()
    (transcript,) = sql("SELECT transcript FROM rollouts WHERE id = %s", row["rollout_id"])[0]
    assert row["token_drift"] and row["drift_turns"] == [1] and row["turns_in_sequence"] == 1
    p0, g0 = prompt_token_ids(transcript[:2]), assistant_token_ids(None, transcript[2]["tool_calls"])
    assert row["input_ids"] == p0 + g0 and row["loss_mask"] == [0] * len(p0) + [1] * len(g0)

"""`gymflow export`: rows written to the real Postgres with the store, exported, and loaded back with `datasets`."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # local files only; never reach a hub
os.environ.setdefault("HF_HUB_OFFLINE", "1")
import datasets  # noqa: E402
from click.testing import CliRunner  # noqa: E402

from gymflow.cli.main import cli  # noqa: E402
from gymflow.kernel.store.db import make_engine, make_sessionmaker, migrate  # noqa: E402
from gymflow.kernel.store.repo import save_rollout, upsert_run  # noqa: E402
from gymflow.kernel.wire import ChatMessage, FunctionCall, RolloutRecord, RolloutSummary, ToolCall  # noqa: E402
from gymflow.training.export import export_run  # noqa: E402
from tests.helpers import store_chain  # noqa: E402

CALL = ToolCall(id="call_1", function=FunctionCall(name="get_weather", arguments='{"city": "Paris"}'))


def _transcript(task: str, answer: str) -> tuple[ChatMessage, ...]:
    return (ChatMessage(role="system", content="You are helpful."),
            ChatMessage(role="user", content=f"Weather for {task}?"),
            ChatMessage(role="assistant", content=None, tool_calls=(CALL,)),
            ChatMessage(role="tool", content="sunny", tool_call_id="call_1", name="get_weather"),
            ChatMessage(role="assistant", content=answer))


def _turns(sample: int) -> list[dict]:
    """Two consistent turns: prompt(1) = prompt(0) + gen(0) + environment tokens."""
    p0, g0 = [1, 2, 3, 10 + sample], [100, 101]
    p1, g1 = p0 + g0 + [7, 8], [200, 201, 202]
    return [dict(turn=0, prompt_token_ids=p0, generation_token_ids=g0, generation_log_probs=[-0.1, -0.2],
                 policy_version="step-1"),
            dict(turn=1, prompt_token_ids=p1, generation_token_ids=g1, generation_log_probs=[-0.3, -0.4, -0.5],
                 policy_version="step-2")]


async def _insert(url: str, run_id: str, rows: list[dict]) -> None:
    """rows: task, sample, status, reward, masked, turns (generation dicts), answer."""
    await asyncio.to_thread(migrate, url)  # idempotent: the tables, migration 0005 included
    engine = make_engine(url, pool_size=1)
    try:
        async with make_sessionmaker(engine).begin() as s:
            for r in rows:
                rid = f"{run_id}/{r['task']}/{r['sample']}"
                turns = r.get("turns", [])
                summary = RolloutSummary(rollout_id=rid, run_id=run_id, task_id=r["task"], sample_index=r["sample"],
                                         status=r.get("status", "completed"), reward=r.get("reward"),
                                         masked=r.get("masked", False), turns=len(turns))
                head = await store_chain(s, rid, _transcript(r["task"], r.get("answer", "Sunny.")), turns)
                await save_rollout(s, RolloutRecord(summary=summary, env="single_tool", model="policy", head_id=head))
    finally:
        await engine.dispose()


async def _export(url: str, run_id: str, fmt: str, out: Path, **kw):
    engine = make_engine(url, pool_size=1)
    try:
        async with make_sessionmaker(engine)() as session:
            return await export_run(session, run_id, fmt, out, **kw)
    finally:
        await engine.dispose()


def _load(path: Path, cache: Path) -> datasets.Dataset:
    builder = "parquet" if path.suffix == ".parquet" else "json"
    return datasets.load_dataset(builder, data_files=str(path), split="train", cache_dir=str(cache))


async def test_rl_records_round_trip(stack, run_id, tmp_path):
    drifted = _turns(2)
    drifted[1]["prompt_token_ids"] = [1, 2, 3, 99, 100, 101, 7, 8]  # turn 1 re-tokenised turn 0's prompt
    no_ids = [dict(turn=0, generation_log_probs=None), dict(turn=1)]
    await _insert(stack.database_url, run_id, [
        dict(task="a", sample=0, reward=1.0, turns=_turns(0)),
        dict(task="a", sample=1, reward=None, masked=True, turns=_turns(1)),
        dict(task="a", sample=2, reward=0.0, turns=drifted),
        dict(task="b", sample=0, status="failed", turns=_turns(0)[:1]),
        dict(task="b", sample=1, reward=1.0, turns=no_ids),
    ])
    for suffix in (".parquet", ".jsonl"):
        out = tmp_path / f"rl{suffix}"
        summary = await _export(stack.database_url, run_id, "rl", out)
        assert summary.rows == 2 and summary.excluded == {"masked": 1, "failed": 1, "without token ids": 1}
        assert sum(summary.flagged.values()) == 1 and "token drift" in summary.line()
        ds = _load(out, tmp_path / "cache")
        by_id = {r["rollout_id"]: r for r in ds}
        good = by_id[f"{run_id}/a/0"]
        assert good["input_ids"] == [1, 2, 3, 10, 100, 101, 7, 8, 200, 201, 202]
        assert good["loss_mask"] == [0, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1]
        assert good["logprobs"] == pytest.approx([0, 0, 0, 0, -0.1, -0.2, 0, 0, -0.3, -0.4, -0.5])
        assert good["policy_versions"] == ["step-1", "step-2"] and good["group_id"] == f"{run_id}/a/e0"
        assert good["reward"] == 1.0 and not good["token_drift"] and good["turns_in_sequence"] == 2
        cut = by_id[f"{run_id}/a/2"]
        assert cut["token_drift"] and cut["drift_turns"] == [1] and cut["turns_in_sequence"] == 1
        assert cut["input_ids"] == [1, 2, 3, 12, 100, 101] and cut["loss_mask"] == [0, 0, 0, 0, 1, 1]
    masked = await _export(stack.database_url, run_id, "rl", tmp_path / "m.parquet", include_masked=True)
    assert masked.rows == 3 and "masked" not in masked.excluded


async def test_sft_keeps_rollouts_at_or_above_the_threshold(stack, run_id, tmp_path):
    await _insert(stack.database_url, run_id, [
        dict(task="a", sample=0, reward=1.0, answer="Sunny \x00 and warm."),  # NUL: stored as U+FFFD
        dict(task="a", sample=1, reward=0.0),
        dict(task="b", sample=0, reward=0.5),
        dict(task="b", sample=1, masked=True),
    ])
    summary = await _export(stack.database_url, run_id, "sft", tmp_path / "sft.parquet")
    assert summary.rows == 1 and summary.excluded == {"below min reward 1.0": 2, "masked": 1}
    (row,) = list(_load(tmp_path / "sft.parquet", tmp_path / "cache"))
    assert [m["role"] for m in row["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    assert [m["role"] for m in row["prompt"]] == ["system", "user"]
    assert row["prompt"] + row["completion"] == row["messages"]
    call = row["messages"][2]["tool_calls"][0]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert row["messages"][3]["tool_call_id"] == "call_1" and row["messages"][4]["content"] == "Sunny \ufffd and warm."
    lower = await _export(stack.database_url, run_id, "sft", tmp_path / "sft.jsonl", min_reward=0.5)
    assert lower.rows == 2 and len(_load(tmp_path / "sft.jsonl", tmp_path / "cache")) == 2


async def test_dpo_pairs_best_against_worst_and_skips_ties(stack, run_id, tmp_path):
    await _insert(stack.database_url, run_id, [
        dict(task="a", sample=0, reward=0.5, answer="middle"),
        dict(task="a", sample=1, reward=1.0, answer="best"),
        dict(task="a", sample=2, reward=0.0, answer="worst"),
        dict(task="a", sample=3, masked=True, answer="masked"),
        dict(task="b", sample=0, reward=1.0), dict(task="b", sample=1, reward=1.0),  # tie: no pair
        dict(task="c", sample=0, reward=1.0), dict(task="c", sample=1, status="failed"),  # one scored sample
    ])
    for suffix in (".parquet", ".jsonl"):
        summary = await _export(stack.database_url, run_id, "dpo", tmp_path / f"dpo{suffix}")
        assert summary.rows == 1
        assert summary.excluded == {"masked": 1, "failed": 1, "groups tied (highest = lowest reward)": 1,
                                    "groups with one scored sample": 1}
        (row,) = list(_load(tmp_path / f"dpo{suffix}", tmp_path / "cache"))
        assert row["chosen"][-1]["content"] == "best" and row["rejected"][-1]["content"] == "worst"
        assert (row["chosen_reward"], row["rejected_reward"]) == (1.0, 0.0)
        assert [m["role"] for m in row["prompt"]] == ["system", "user"] and row["chosen"][0]["role"] == "assistant"
        assert row["chosen_rollout_id"] == f"{run_id}/a/1" and row["rejected_rollout_id"] == f"{run_id}/a/2"


async def test_groups_are_per_epoch_when_the_run_records_its_samples_per_task(stack, run_id, tmp_path):
    # Two epochs of two samples (the trainer iterator's ids: epoch e, sample i is sample index 2e + i): a pair per
    # epoch, never the best of one epoch against the worst of another.
    await _insert(stack.database_url, run_id, [
        dict(task="a", sample=0, reward=1.0, answer="e0 best"),
        dict(task="a", sample=1, reward=0.0, answer="e0 worst"),
        dict(task="a", sample=2, reward=0.5, answer="e1 best"),
        dict(task="a", sample=3, reward=0.25, answer="e1 worst"),
    ])
    engine = make_engine(stack.database_url, pool_size=1)
    try:
        async with make_sessionmaker(engine).begin() as s:
            await upsert_run(s, run_id, model="policy", samples_per_task=2)
    finally:
        await engine.dispose()
    summary = await _export(stack.database_url, run_id, "dpo", tmp_path / "dpo.jsonl")
    pairs = sorted(map(json.loads, (tmp_path / "dpo.jsonl").read_text().splitlines()), key=lambda r: r["group_id"])
    assert summary.rows == 2 and [p["group_id"] for p in pairs] == [f"{run_id}/a/e0", f"{run_id}/a/e1"]
    assert [(p["chosen"][-1]["content"], p["rejected"][-1]["content"]) for p in pairs] == [
        ("e0 best", "e0 worst"), ("e1 best", "e1 worst")]
    await _export(stack.database_url, run_id, "sft", tmp_path / "sft.jsonl", min_reward=0.0)
    rows = [json.loads(line) for line in (tmp_path / "sft.jsonl").read_text().splitlines()]
    assert {r["sample_index"]: r["group_id"][len(run_id):] for r in rows} == {0: "/a/e0", 1: "/a/e0", 2: "/a/e1",
                                                                               3: "/a/e1"}


async def test_bad_arguments_are_refused_before_writing(stack, run_id, tmp_path):
    await _insert(stack.database_url, run_id, [dict(task="a", sample=0, reward=1.0)])
    cases = [("nope", "rl", tmp_path / "x.parquet", {}, "has no rollouts"),
             (run_id, "rl", tmp_path / "x.csv", {}, "must end in .parquet or .jsonl"),
             (run_id, "rl", tmp_path / "missing" / "x.jsonl", {}, "does not exist"),
             (run_id, "dpo", tmp_path / "x.jsonl", {"min_reward": 1.0}, "do not apply to dpo"),
             (run_id, "ppo", tmp_path / "x.jsonl", {}, "must be one of")]
    for run, fmt, out, kw, message in cases:
        with pytest.raises(ValueError, match=message):
            await _export(stack.database_url, run, fmt, out, **kw)
    assert list(tmp_path.iterdir()) == []


def test_cli_writes_the_file_and_prints_the_summary(stack, config_file, run_id, tmp_path):
    asyncio.run(_insert(stack.database_url, run_id, [dict(task="a", sample=0, reward=1.0, turns=_turns(0)),
                                                     dict(task="a", sample=1, status="failed")]))
    out = tmp_path / "rl.jsonl"
    result = CliRunner().invoke(cli, ["export", run_id, "--format", "rl", "--out", str(out), "-c", str(config_file)])
    assert result.exit_code == 0, result.output
    assert f"exported 1 rl rows to {out}; left out: 1 failed" in result.output
    assert json.loads(out.read_text())["loss_mask"] == [0, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1]
    bad = CliRunner().invoke(cli, ["export", "missing-run", "--format", "sft", "--out", str(out), "-c",
                                   str(config_file)])
    assert bad.exit_code == 1 and "run 'missing-run' has no rollouts" in bad.output

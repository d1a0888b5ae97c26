"""`gymflow profile` and `gymflow check` on a run collected through the real stack with scripted replies: tasks
always solved, never solved and mixed, a failed and an unscored task; a hollow, a truncated, a repetitive and a
zero-token reply, a tool call with bad arguments and a re-templating tokenizer (token drift)."""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from gymflow.cli.main import cli as main_cli
from gymflow.data.datasets import load_jsonl
from gymflow.kernel.store.db import make_engine, make_sessionmaker
from gymflow.reports.health import repetition_coverage, run_checks
from gymflow.reports.profile import load_profile
from gymflow.testing.scripted_openai import completion_json, http_error, text, tool_call
from tests.conftest import ROOT

SOLVE = [tool_call("get_weather", {"city": "SF"}), text("cold")]
MISS = [text("no idea")]
REPEAT = "the cat sat on the mat " * 30
TRUNCATED = completion_json({"id": "c", "object": "chat.completion", "created": 0, "model": "m", "choices": [
    {"index": 0, "message": {"role": "assistant", "content": "The answer is"}, "finish_reason": "length"}],
    "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}})
BAD_REQUEST = http_error(400, "temperature must be <= 2")


def _rows() -> list[dict]:
    ask = [{"role": "user", "content": "what's it like in sf?"}]
    return [{"id": "easy", "env": "single_tool", "messages": [{"role": "user", "content": "weather in SF?"}]},
            {"id": "hard", "env": "single_tool", "messages": [{"role": "user", "content": "weather, hard"}]},
            {"id": "m1", "env": "single_tool", "messages": ask, "level": 3},
            # the same prompt as m1 (a duplicate prompt), as a Responses row with a sampling setting
            {"id": "m2", "env": "single_tool", "responses_create_params": {"input": ask, "temperature": 0.5}},
            {"id": "broken", "env": "single_tool", "messages": [{"role": "user", "content": "broken"}]}]


# (task, sample, model, replies); drift: the tokenizer re-templates history.
PLAN = [("easy", 0, "policy", SOLVE), ("easy", 1, "policy", SOLVE), ("easy", 2, "drift", SOLVE),
        ("hard", 0, "policy", [text("   ")]), ("hard", 1, "policy", [TRUNCATED]), ("hard", 2, "policy", [text(REPEAT)]),
        ("m1", 0, "policy", SOLVE), ("m1", 1, "policy", MISS), ("m1", 2, "policy", SOLVE),
        ("m1", 3, "policy", [BAD_REQUEST]),
        ("m2", 0, "policy", MISS), ("m2", 1, "policy", [tool_call("get_weather", "{not json"), text("sorry")]),
        ("m2", 2, "policy", [text("no", completion_tokens=0)]),
        ("broken", 0, "policy", [BAD_REQUEST]), ("broken", 1, "policy", [BAD_REQUEST])]


def gymflow(config_file: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gymflow.cli.main", *args, "--config", str(config_file)],
                          capture_output=True, text=True, cwd=ROOT, timeout=60, env={**os.environ, "COLUMNS": "200"})


async def cli(config_file: Path, *args: str):
    """The command in this process (its own event loop, in a thread): a subprocess costs seconds of imports."""
    runner = CliRunner()
    return await asyncio.to_thread(runner.invoke, main_cli, [*args, "--config", str(config_file)])


async def collect(gf, scripted, run_id: str, tasks: dict, plan) -> None:
    for task_id, sample, model, replies in plan:
        scripted.script(*replies)
        if model == "drift":
            scripted.tokenizer = "drift"
        try:
            await gf.run_rollout(gf.make_input(run_id, tasks[task_id], sample, "vllm" if model == "drift" else model))
        finally:
            scripted.tokenizer = None


@pytest.fixture
def dataset(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _rows()))
    tasks, errors = load_jsonl(path, env=None)
    assert not errors
    return {t.id: t for t in tasks}


async def _session_call(database_url: str, fn, *args, **kw):
    engine = make_engine(database_url, pool_size=1)
    try:
        async with make_sessionmaker(engine)() as session:
            return await fn(session, *args, **kw)
    finally:
        await engine.dispose()


async def test_profile_and_check(gf, scripted, run_id, dataset, stack, config_file, tmp_path):
    await collect(gf, scripted, run_id, dataset, PLAN)
    clean, empty = f"{run_id}-clean", f"{run_id}-empty"
    await collect(gf, scripted, clean, dataset, [("easy", 0, "policy", SOLVE), ("easy", 1, "policy", SOLVE)])
    await collect(gf, scripted, empty, dataset, [("broken", 0, "policy", [BAD_REQUEST])])

    # ---- profile: the numbers, by hand ----
    prof = await _session_call(stack.database_url, load_profile, run_id)
    assert prof.ks == [1, 2, 3]
    by = {t.task_id: t for t in prof.tasks}
    assert [(t.samples, t.scored, t.masked, t.failed, t.passed) for t in (by["easy"], by["hard"], by["m1"],
            by["m2"], by["broken"])] == [(3, 3, 0, 0, 3), (3, 3, 0, 0, 0), (4, 3, 0, 1, 2), (3, 3, 0, 0, 1),
                                         (2, 0, 0, 2, 0)]
    m1, m2 = by["m1"], by["m2"]
    assert m1.pass_rate == pytest.approx(2 / 3) and m1.mean == pytest.approx(2 / 3)
    assert m1.std == pytest.approx(math.sqrt(2 / 9)) and (m1.min, m1.max) == (0.0, 1.0)
    # m1: pass, miss, pass -> pass@1 2/3, pass@2 1 - C(1,2)/C(3,2) = 1; majority@2 of (pass, miss) is a tie: 0
    assert [m1.pass_at(k) for k in (1, 2, 3)] == pytest.approx([2 / 3, 1, 1])
    assert [m1.majority_at(k) for k in (1, 2, 3)] == [1, 0, 1]
    # m2: miss, pass (the bad-arguments call still called the tool), miss -> pass@2 = 1 - C(2,2)/C(3,2) = 2/3
    assert [m2.pass_at(k) for k in (1, 2, 3)] == pytest.approx([1 / 3, 2 / 3, 1])
    assert [m2.majority_at(k) for k in (1, 2, 3)] == [0, 0, 0]
    assert by["broken"].pass_at(1) is None and by["broken"].pass_rate is None
    summary = {s.k: (s.pass_at_k, s.majority_at_k, s.tasks) for s in prof.summary}
    assert summary[1] == pytest.approx((0.5, 0.5, 4)) and summary[2] == pytest.approx((2 / 3, 0.25, 4))
    assert summary[3] == pytest.approx((0.75, 0.5, 4))
    assert {c: prof.by_category(c) for c in ("solved", "unsolved", "mixed", "unscored")} == {
        "solved": ["easy"], "unsolved": ["hard"], "mixed": ["m1", "m2"], "unscored": ["broken"]}
    big = await _session_call(stack.database_url, load_profile, run_id, ks=[2, 5])
    assert big.ks == [2, 5] and big.summary[1].pass_at_k is None and big.summary[1].tasks == 0
    assert any("k=5 is more than any task's scored samples (at most 3)" in n for n in big.notes)

    # ---- check: each verdict, its counts and examples ----
    checks = {c.id: c for c in await _session_call(stack.database_url, run_checks, run_id)}
    assert list(checks) == ["hollow_turns", "zero_completion_tokens", "truncated_replies", "runaway_repetition",
                            "tool_call_parse_failures", "token_drift", "tasks_failing_every_sample",
                            "duplicate_rollout_identities", "duplicate_prompts", "failure_share"]
    turns = 6 + 3 + 5 + 4  # easy, hard, m1 (its failed sample has none), m2
    expect = {"hollow_turns": ("fail", 1, turns, [f"{run_id}/hard/0"]),
              "zero_completion_tokens": ("fail", 1, turns, [f"{run_id}/m2/2"]),
              "truncated_replies": ("warn", 1, turns, [f"{run_id}/hard/1"]),
              "runaway_repetition": ("fail", 1, turns, [f"{run_id}/hard/2"]),
              "tool_call_parse_failures": ("fail", 1, 6, [f"{run_id}/m2/1"]),
              "token_drift": ("fail", 1, 1, [f"{run_id}/easy/2"]),
              "tasks_failing_every_sample": ("fail", 1, 5, [f"{run_id}/broken/0"]),
              "duplicate_rollout_identities": ("ok", 0, 15, []),
              "duplicate_prompts": ("warn", 1, 5, [f"{run_id}/m1/0", f"{run_id}/m2/0"]),
              "failure_share": ("fail", 3, 15, [f"{run_id}/broken/0", f"{run_id}/broken/1", f"{run_id}/m1/3"])}
    assert {k: (c.verdict, c.n, c.of, c.examples) for k, c in checks.items()} == expect
    assert checks["hollow_turns"].counts == {"empty": 0, "whitespace_only": 1, "reasoning_only": 0}
    assert checks["tool_call_parse_failures"].counts == {"bad_arguments": 1, "unknown_tool": 0, "other_tool_errors": 0}
    assert checks["tasks_failing_every_sample"].counts == {"never_solved": 1}
    assert checks["failure_share"].counts["type:model_bad_request"] == 3

    # ---- the CLI: text, --out-tasks, --json, exit codes, bad input ----
    out = tmp_path / "next.jsonl"
    text_profile = await cli(config_file, "profile", run_id, "--out-tasks", str(out))
    assert text_profile.exit_code == 0, text_profile.output
    assert "mixed (2): m1, m2" in text_profile.stdout and "never solved (1): hard" in text_profile.stdout
    assert f"Wrote 2 task rows (mixed) to {out}" in text_profile.stdout
    loaded, errors = load_jsonl(out, env=None)
    assert not errors and loaded == [dataset["m1"], dataset["m2"]]  # the same tasks, sampling and data included
    assert "responses_create_params" in out.read_text().splitlines()[1]

    # The gate, as a pipeline runs it: a real process, exit status 1, one JSON object on stdout.
    check_json = await asyncio.to_thread(gymflow, config_file, "check", run_id, "--json")
    assert check_json.returncode == 1, check_json.stderr
    report = json.loads(check_json.stdout)
    assert report["failed"] and {c["id"]: c["verdict"] for c in report["checks"]} == {
        k: v[0] for k, v in expect.items()}
    clean_check = await cli(config_file, "check", clean)
    assert clean_check.exit_code == 0, clean_check.output
    assert "0 fail" in clean_check.stdout and "SKIP  token_drift" in clean_check.stdout

    for command in ("profile", "check"):
        unknown = await cli(config_file, command, "no-such-run")
        assert unknown.exit_code == 1 and "no rollouts recorded for run 'no-such-run'" in unknown.stderr
    empty_p = await cli(config_file, "profile", empty)
    assert empty_p.exit_code == 1 and "none completed with a reward (1 failed" in empty_p.stderr
    empty_c = await cli(config_file, "check", empty)
    assert empty_c.exit_code == 1 and "FAIL  tasks_failing_every_sample: 1 of 1 tasks" in empty_c.stdout
    assert "SKIP  hollow_turns: 0 of 0" in empty_c.stdout
    k5 = await cli(config_file, "profile", run_id, "--k", "5", "--json")
    assert k5.exit_code == 0 and "k=5 is more than any task's" in json.loads(k5.stdout)["notes"][0]
    bad = await cli(config_file, "profile", run_id, "--keep", "solved")
    assert bad.exit_code == 2 and "--keep chooses what --out-tasks writes" in bad.stderr


def test_repetition_coverage():
    assert repetition_coverage(REPEAT) > 0.9
    assert repetition_coverage("!" * 400) > 0.9  # no spaces: character grams
    prose = ("Sampling many completions per prompt lets the estimator average out the noise of a single draw, "
             "and the unbiased form avoids the optimism of taking the best of exactly k samples. ") * 1
    assert repetition_coverage(prose) == 0.0
    assert repetition_coverage("") == 0.0

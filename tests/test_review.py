"""Human review: labels stored beside the verifier's score (never over it), the review queues, the agreement report
(precision and recall of the verifier's passes against the reviewers) and the labels' export, on a run collected
through the real stack; bad labels get a clear error and nothing is lost when two reviewers label at once."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner
from gymflow.environments import registry

from gymflow.cli.main import cli
from gymflow.kernel.connect import resolve_addresses
from gymflow.kernel.store import reviews
from gymflow.kernel.store.direct import DirectPool
from gymflow.kernel.wire import ChatMessage, Task
from gymflow.testing.scripted_openai import text
from tests.rescore_env import ENTRY_POINT, NAME, rescore_env  # noqa: F401 - rescore_env: a fixture


@pytest.fixture
async def run(gf, run_id, rescore_env, scripted, monkeypatch):  # noqa: F811
    real = registry.available
    monkeypatch.setattr(registry, "available", lambda: {**real(), NAME: ENTRY_POINT.value})
    asked: Counter[str] = Counter()

    def reply(body: dict) -> object:  # "say X" says X; "say yes then no": yes the first time, no the second
        prompt = body["messages"][-1]["content"].removeprefix("please say ")
        asked[prompt] += 1
        return text(prompt if prompt != "yes then no" else ("yes" if asked[prompt] == 1 else "no"))

    scripted.responder = reply
    tasks = [Task(id=t, env=NAME, messages=(ChatMessage(role="user", content=f"please say {says}"),))
             for t, says in (("a", "yes"), ("b", "no"), ("d", "yes then no"))]
    try:
        results = [r.summary async for r in gf.collect(run_id, tasks, n=2, model="policy")]
    finally:
        scripted.responder = None
    assert sorted((s.task_id, s.reward) for s in results) == [("a", 1.0), ("a", 1.0), ("b", 0.0), ("b", 0.0),
                                                             ("d", 0.0), ("d", 1.0)]
    return run_id


def _gymflow(config_file: Path, *args: str) -> str:
    done = CliRunner().invoke(cli, [*args, "-c", str(config_file)])
    assert done.exit_code == 0, done.output
    return done.output


def _fails(config_file: Path, *args: str) -> str:
    done = CliRunner().invoke(cli, [*args, "-c", str(config_file)])
    assert done.exit_code != 0, done.output
    return done.output


def test_labels_queues_agreement_and_export(run, config_file, sql, tmp_path):
    d_pass, d_fail = (f"{run}/d/{k}" for k in sorted((0, 1), key=lambda k: -sql(
        "SELECT reward FROM rollouts WHERE id = %s", f"{run}/d/{k}")[0][0]))
    queued = _gymflow(config_file, "review", "queue", run, "--kind", "disagreements", "--reviewer", "alice")
    assert f"{run}/d/0" in queued and f"{run}/d/1" in queued and f"{run}/a/0" not in queued
    for rid, verdict, extra in [
        (d_pass, "wrong", ["--comment", "<script>x</script> says yes but means no"]),  # a false pass
        (d_fail, "right", []),
        (f"{run}/a/0", "right", ["--tag", "easy"]),
        (f"{run}/b/0", "wrong", ["--reward", "1", "--comment", "no is the right answer here"]),  # a false fail
        (f"{run}/b/1", "unsure", []),
    ]:
        assert "marked" in _gymflow(config_file, "review", "mark", rid, "--verdict", verdict, "--reviewer", "alice",
                                    *extra)
    # A second reviewer, and alice changing her mind on a/1 (her newest label counts, the old one is kept).
    _gymflow(config_file, "review", "mark", f"{run}/a/1", "--verdict", "wrong", "--reviewer", "alice")
    _gymflow(config_file, "review", "mark", f"{run}/a/1", "--verdict", "right", "--reviewer", "alice")
    _gymflow(config_file, "review", "mark", f"{run}/a/0", "--verdict", "right", "--reviewer", "bob")
    assert f"{run}/d/" not in _gymflow(config_file, "review", "queue", run, "--kind", "disagreements",
                                       "--reviewer", "alice"), "labelled ones leave the reviewer's queue"
    report = json.loads(_gymflow(config_file, "review", "report", run, "--json"))
    (env,) = report
    # Labels: d_pass fp; d_fail tn; a/0 tp (alice) and tp (bob); b/0 fn; b/1 unsure; a/1 tp.
    assert (env["labels"], env["agree"], env["disagree"], env["unsure"]) == (7, 4, 2, 1)
    assert (env["tp"], env["fp"], env["fn"], env["tn"]) == (3, 1, 1, 1)
    assert env["precision"] == pytest.approx(0.75) and env["recall"] == pytest.approx(0.75)
    assert env["fp_examples"] == [d_pass] and env["fn_examples"] == [f"{run}/b/0"]
    text_report = _gymflow(config_file, "review", "report", run)
    assert "precision 0.750, recall 0.750" in text_report and "no is the right answer here" in text_report
    # The verifier's scores are untouched.
    assert sql("SELECT count(*) FROM rollouts WHERE run_id = %s AND reward = 1", run) == [(3,)]
    assert sql("SELECT count(*) FROM reviews r JOIN rollout_rows o ON o.id = r.rollout_id WHERE o.run_id = %s",
               run) == [(8,)]
    out = tmp_path / "labels.jsonl"
    _gymflow(config_file, "review", "export", run, "--out", str(out))
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 7 and {r["reviewer"] for r in rows} == {"alice", "bob"}
    mine = {r["rollout_id"]: r for r in rows if r["reviewer"] == "alice"}
    assert mine[f"{run}/a/1"]["verdict"] == "right" and mine[f"{run}/b/0"]["reward"] == 1.0
    assert mine[d_pass]["comment"].startswith("<script>") and mine[d_pass]["verifier_reward"] == 1.0


def test_bad_labels_are_refused_by_field(run, config_file):
    assert "no rollout 'nope/x/0'" in _fails(config_file, "review", "mark", "nope/x/0", "--verdict", "right")
    assert "comment: contains a NUL character" in _fails(config_file, "review", "mark", f"{run}/a/0", "--verdict",
                                                         "right", "--comment", "a\x00b")
    assert "reward: nan is not a finite number" in _fails(config_file, "review", "mark", f"{run}/a/0",
                                                          "--verdict", "wrong", "--reward", "nan")
    assert "--verdict" in _fails(config_file, "review", "mark", f"{run}/a/0", "--verdict", "maybe")
    assert "give the failure type" in _fails(config_file, "review", "queue", run, "--kind", "failure")
    assert "no reviews yet" in _gymflow(config_file, "review", "report", run)


async def test_two_reviewers_labelling_at_once_both_stored(run, settings, sql):
    pool = DirectPool(resolve_addresses(settings)[1], max_size=8)

    async def label(who: str) -> int:
        async with pool.connection() as conn:
            return await reviews.add_review(conn, reviews.Label(f"{run}/a/0", who, "right"))

    try:
        ids = await asyncio.gather(*(label(f"r{i}") for i in range(8)))
    finally:
        await pool.close()
    assert len(set(ids)) == 8
    assert sql("SELECT count(DISTINCT reviewer) FROM reviews WHERE rollout_id = %s", f"{run}/a/0") == [(8,)]

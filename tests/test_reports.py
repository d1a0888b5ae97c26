"""The SQL views, `gymflow report` (failure messages with example ids and Temporal UI links, 80 columns,
--vs, --html) on failures seeded through the real stack, and the statistics behind pass@k and --vs."""

from __future__ import annotations

import asyncio
import math
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gymflow.reports.stats import compare_runs, pass_at_k, pass_at_k_curve, t_quantile
from gymflow.testing.scripted_openai import context_length_error, http_error, text, tool_call
from tests.conftest import ROOT
from tests.helpers import weather_task

UI = "http://ui.test:8233"
BAD_REQUEST = "temperature must be <= 2"


def gymflow(config_file: Path, *args: str, columns: int = 80, env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "gymflow.cli.main", *args, "--config", str(config_file)]
    environ = {k: v for k, v in os.environ.items() if k != "GYMFLOW_UI_URL"}
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=60,
                          env={**environ, "COLUMNS": str(columns), **(env or {})})


async def seed(gf, scripted, run_id: str, plan) -> None:
    for task_id, sample, replies in plan:
        scripted.script(*replies)
        await gf.run_rollout(gf.make_input(run_id, weather_task(task_id), sample, "policy"))


# task a: one success of two samples; task b: two zeros; task c: context length; task d: the same 400 twice.
PLAN = [("a", 0, [tool_call("get_weather", {"city": "SF"}), text("cold")]), ("a", 1, [text("?")]),
        ("b", 0, [text("?")]), ("b", 1, [text("?")]), ("c", 0, [context_length_error()]),
        ("d", 0, [http_error(400, BAD_REQUEST)]), ("d", 1, [http_error(400, BAD_REQUEST)])]


async def test_views_and_report_command(gf, scripted, run_id, config_file):
    await seed(gf, scripted, run_id, PLAN)
    views = await gf.report(run_id)
    (scores,) = views["run_scores"]
    assert (scores["rollouts"], scores["completed"], scores["failed"], scores["masked"]) == (7, 4, 3, 0)
    assert scores["mean_reward"] == 0.25
    assert float(scores["pass_at_k"]) == 0.5  # a solved, b not; c and d never scored, so not counted
    assert sorted((f["failure_type"], f["n"]) for f in views["failure_counts"]) == [
        ("context_length_exceeded", 1), ("model_bad_request", 2)]
    (lat,) = views["latency_percentiles"]
    assert 0 < lat["p50_s"] <= lat["p99_s"]

    proc = await asyncio.to_thread(gymflow, config_file, "report", run_id, "--ui-url", UI)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "…" not in out, out  # nothing cut at 80 columns: no header, value, id or link
    assert "Scores (run_scores)" in out and "0.25" in out and "k=1: 0.25  k=2: 0.5" in out
    # Types by count, each message with its count, example ids and their Temporal UI pages.
    assert out.index("model_bad_request: 2 rollouts") < out.index("context_length_exceeded: 1 rollout\n")
    assert re.search(rf"2x\s+policy: Error code: 400 - {re.escape(BAD_REQUEST)}", out)
    assert "maximum context length is 4096 tokens. However, you requested" in " ".join(out.split())
    for rid in (f"{run_id}/d/0", f"{run_id}/d/1", f"{run_id}/c/0"):
        assert f"{rid}  {UI}/namespaces/default/workflows/{rid.replace('/', '%2F')}" in out
    assert f"{run_id}/a/0" not in out  # completed rollouts are no failure examples

    # No UI known (the test stack is headless, so no stack file names one): ids only. --examples caps them.
    plain = await asyncio.to_thread(gymflow, config_file, "report", run_id, "--examples", "1")
    assert plain.returncode == 0, plain.stderr
    assert "http" not in plain.stdout and f"{run_id}/d/0" in plain.stdout and f"{run_id}/d/1" not in plain.stdout
    # $GYMFLOW_UI_URL is the other way to name the UI.
    via_env = await asyncio.to_thread(gymflow, config_file, "report", run_id, env={"GYMFLOW_UI_URL": UI + "/"})
    assert f"{UI}/namespaces/default/workflows/{run_id}%2Fc%2F0" in via_env.stdout


async def test_top_messages_per_type(gf, scripted, run_id, config_file):
    plan = [("m", i, [http_error(400, f"message {'AAB'[i]}")]) for i in range(3)]
    await seed(gf, scripted, run_id, plan)
    proc = await asyncio.to_thread(gymflow, config_file, "report", run_id, "--top", "1")
    assert proc.returncode == 0, proc.stderr
    assert "model_bad_request: 3 rollouts, 2 distinct messages" in proc.stdout
    assert re.search(r"2x\s+policy: Error code: 400 - message A", proc.stdout) and "message B" not in proc.stdout


async def test_report_unknown_run(gf, config_file):
    proc = await asyncio.to_thread(gymflow, config_file, "report", "no-such-run")
    assert proc.returncode == 1
    assert "no rollouts recorded for run 'no-such-run'" in proc.stderr and "Traceback" not in proc.stderr


async def test_report_vs_and_html(gf, scripted, config_file, tmp_path):
    # Run A never calls the tool (reward 0); B calls it on every sample of 3 tasks (reward 1): B − A = +1.
    a, b = "t-vs-a-" + os.urandom(3).hex(), "t-vs-b-" + os.urandom(3).hex()
    await seed(gf, scripted, a, [(t, s, [text("no")]) for t in "xyz" for s in range(2)])
    await seed(gf, scripted, b, [(t, s, [tool_call("get_weather", {"city": "SF"}), text("cold")])
                                 for t in "xyz" for s in range(2)] + [("x", 2, [context_length_error()])])
    html = tmp_path / "vs.html"
    proc = await asyncio.to_thread(gymflow, config_file, "report", a, "--vs", b, "--html", str(html))
    assert proc.returncode == 0, proc.stderr
    assert "…" not in proc.stdout
    assert f"Comparison: {b} (B) minus {a} (A)" in proc.stdout
    assert re.search(r"B - A\s+\+1\b", proc.stdout) and "paired t over the 3 tasks" in proc.stdout
    page = html.read_text()
    assert page.count("data:image/svg+xml;base64,") == 5 and "B &minus; A = +1" in page
    assert a in page and b in page and "context_length_exceeded" in page


# -- statistics: known values ----------------------------------------------------------------------------


def test_pass_at_k_known_values():
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)  # pass@1 is the success rate
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - math.comb(7, 5) / math.comb(10, 5))  # 0.91667
    assert pass_at_k(5, 0, 3) == 0.0 and pass_at_k(5, 3, 3) == 1.0  # fewer than k failures: always passes
    assert pass_at_k(200, 1, 100) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)
    curve = pass_at_k_curve({"t1": [1, 0, 0, 0], "t2": [0, 0], "t3": [1, 1, 0, 0.5]})
    assert [(p.k, p.tasks) for p in curve] == [(1, 3), (2, 3), (3, 2), (4, 2)]
    assert curve[0].value == pytest.approx((0.25 + 0 + 0.5) / 3)
    assert curve[1].value == pytest.approx((0.5 + 0 + (1 - 1 / 6)) / 3)
    assert curve[3].value == pytest.approx(1.0)


def test_t_quantiles_match_tables():
    for df, q in ((1, 12.7062), (2, 4.3027), (10, 2.2281), (30, 2.0423), (1000, 1.9623)):
        assert t_quantile(0.975, df) == pytest.approx(q, abs=1e-4)
    assert t_quantile(0.025, 5) == pytest.approx(-2.5706, abs=1e-4)


def _synthetic(rng: random.Random, tasks: int, n: int, shift: float) -> tuple[dict, dict]:
    """Bernoulli rewards with per-task difficulty (the correlation within a task); B passes `shift` more often."""
    a, b = {}, {}
    for t in range(tasks):
        p = rng.uniform(0.05, 0.7)
        a[f"t{t}"] = [float(rng.random() < p) for _ in range(n)]
        b[f"t{t}"] = [float(rng.random() < p + shift) for _ in range(n)]
    return a, b


def test_comparison_known_difference_and_coverage():
    rng = random.Random(1234)
    a, b = _synthetic(rng, tasks=200, n=8, shift=0.2)
    c = compare_runs(a, b, label_a="A", label_b="B")
    assert c.method == "paired-t" and c.shared == 200
    assert c.diff == pytest.approx(c.mean_b - c.mean_a)
    assert c.low < 0.2 < c.high and c.low > 0  # the true difference inside; no difference excluded
    # The same data without shared task ids falls back to Welch over task means: wider, as pairing removes the
    # task-difficulty variance.
    w = compare_runs(a, {f"other-{t}": r for t, r in b.items()})
    assert w.method == "welch-t" and w.diff == pytest.approx(c.diff)
    assert (w.high - w.low) > 1.3 * (c.high - c.low)
    # Coverage of the 95% interval over repeated experiments (true difference 0.2 by construction).
    hits = 0
    for _ in range(200):
        x, y = _synthetic(rng, tasks=40, n=4, shift=0.2)
        r = compare_runs(x, y)
        hits += r.low <= 0.2 <= r.high
    assert 0.90 <= hits / 200 <= 0.99, hits


def test_comparison_edge_cases():
    partial = compare_runs({"t1": [1.0], "t2": [0.0], "t3": [1.0]}, {"t1": [1.0], "t2": [1.0], "t9": [0.0]})
    assert partial.method == "paired-t" and partial.shared == 2 and "1 only in A, 1 only in B" in partial.detail
    none = compare_runs({"t1": [1.0, 0.0]}, {"t2": [1.0]})
    assert none.method == "none" and none.low is None and none.diff == pytest.approx(0.5)
    same = compare_runs({"t1": [1.0], "t2": [0.0]}, {"t3": [1.0], "t4": [0.0]})
    assert same.method == "welch-t" and same.diff == 0 and same.low < 0 < same.high

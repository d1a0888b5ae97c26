"""The HTML report and the 80-column terminal layout on synthetic runs (no stack), and the HTML rendered by
headless Chromium: a page that renders blank or broken fails here, not in a reader's browser."""

from __future__ import annotations

import base64
import random
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from gymflow.reports.data import RunData, workflow_url
from gymflow.reports.html import render_html
from gymflow.reports.stats import compare_runs
from gymflow.reports.text import render_report, render_rollout
from gymflow.testing.screenshot import chromium, screenshot

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
LINK = "http://ui.test:8233"


def synthetic_run(run_id: str, *, tasks: int = 12, n: int = 4, p_shift: float = 0.0, seed: int = 0) -> RunData:
    """A run with per-task difficulty, some failures of two types and a latency spread."""
    rng = random.Random(seed)
    points: list[dict[str, Any]] = []
    for t in range(tasks):
        p = min(1.0, 0.1 + 0.06 * t + p_shift)
        for s in range(n):
            i = t * n + s
            failed = i % 11 == 5
            kind = ("context_length_exceeded" if i % 2 else "model_bad_request") if failed else None
            points.append(dict(id=f"{run_id}/task-{t}/{s}", task_id=f"task-{t}", sample_index=s,
                               status="failed" if failed else "completed",
                               reward=None if failed else float(rng.random() < p), masked=False, failure_type=kind,
                               latency_s=0.2 + rng.random() * 3, started_at=T0 + timedelta(seconds=i),
                               finished_at=T0 + timedelta(seconds=i + 3)))
    failures = [dict(failure_type=k, failure_message=f"policy: {k} message that is long enough to wrap at eighty "
                     "columns, so that it must be wrapped rather than cut", n=c, type_n=c, messages=1,
                     examples=[p["id"] for p in points if p["failure_type"] == k][:3])
                for k, c in (("context_length_exceeded", 3), ("model_bad_request", 2))]
    completed = [p for p in points if p["status"] == "completed"]
    views = {
        "run_scores": [dict(run_id=run_id, env="single_tool", model="policy", rollouts=len(points),
                            completed=len(completed), failed=len(points) - len(completed), running=0, masked=0,
                            mean_reward=sum(p["reward"] for p in completed) / len(completed), pass_at_k=0.5)],
        "failure_counts": [dict(run_id=run_id, failure_type=f["failure_type"], n=f["n"]) for f in failures],
        "latency_percentiles": [dict(run_id=run_id, p50_s=1.1, p90_s=2.5, p99_s=3.1)],
    }
    return RunData(run_id=run_id, views=views, failures=failures, points=points)


def linker(rid: str) -> str:
    return workflow_url(LINK, "default", rid)


def test_80_columns_nothing_cut():
    a, b = synthetic_run("run-a"), synthetic_run("run-b", p_shift=0.2, seed=1)
    console = Console(width=80, record=True, color_system=None)
    render_report(console, [a, b], linker, compare_runs(a.rewards_by_task, b.rewards_by_task, label_a="run-a",
                                                        label_b="run-b"))
    out = console.export_text()
    assert "…" not in out  # rich's mark of a truncated cell or header
    for word in ("Scores (run_scores)", "Failures (failure_counts)", "Latency (latency_percentiles)", "env / model",
                 "rollouts", "mean reward", "pass@k", "k=1:", "k=4:", "Comparison: run-b (B) minus run-a (A)",
                 "95% CI", "paired t over the 12 tasks"):
        assert word in out, word
    # ids and links whole, on one line each, whatever the width
    assert f"run-a/task-1/1  {LINK}/namespaces/default/workflows/run-a%2Ftask-1%2F1" in out
    assert "must be wrapped rather than cut" in out.replace("\n", " ").replace("  ", " ")


def test_show_layout_80_columns_and_abbreviation():
    rollout = dict(id="r/t/0", run_id="r", task_id="t", sample_index=0, env="single_tool", model="policy",
                   status="failed", reward=None, masked=False, failure_type="model_bad_request",
                   failure_message="policy: temperature must be <= 2", turns=2, tool_calls=1, prompt_tokens=20,
                   completion_tokens=7, attempts=2, latency_s=0.5, started_at=T0, finished_at=T0,
                   transcript=[{"role": "user", "content": "word " * 400},
                               {"role": "assistant", "tool_calls": [{"id": "c1", "function": {
                                   "name": "get_weather", "arguments": '{"city": "SF"}'}}]},
                               {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": "cold"}],
                   score_details={"called_get_weather": True},
                   generations=[dict(turn=t, attempt=1, finish_reason="tool_calls", prompt_tokens=123456,
                                     completion_tokens=4567, latency_s=12.345, prompt_token_ids_n=123456,
                                     generation_token_ids_n=4567, log_probs_n=4567, has_prompt_token_ids=True,
                                     has_generation_token_ids=True, has_log_probs=True) for t in range(2)])
    console = Console(width=80, record=True, color_system=None)
    render_rollout(console, rollout, linker)
    out = console.export_text()
    assert "…" not in out
    for header in ("turn", "try", "finish", "prompt", "compl", "secs", "token ids", "logprobs"):
        assert re.search(rf"(^|\s){header}(\s|$)", out, re.M), header
    assert "123456+4567" in out and "tool_calls" in out
    assert "more characters; --full shows all" in out
    console = Console(width=80, record=True, color_system=None)
    render_rollout(console, rollout, linker, full=True)
    assert "more characters" not in console.export_text()


def _images(page: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r'src="data:image/svg\+xml;base64,([^"]+)"', page)]


def test_html_is_self_contained():
    a, b = synthetic_run("run-a"), synthetic_run("run-b", p_shift=0.2, seed=1)
    page = render_html([a, b], linker, compare_runs(a.rewards_by_task, b.rewards_by_task, label_a="run-a",
                                                    label_b="run-b"))
    images = _images(page)
    assert len(images) == 5  # histogram, pass@k, latency CDF, failures over time of each run
    assert all(i.lstrip().startswith(b"<?xml") and b"<svg" in i for i in images)
    # Nothing is fetched at view time: no scripts, stylesheets, or images from elsewhere.
    assert not re.search(r"<script|<link|src=\"(?!data:)", page)
    assert "B &minus; A" in page and "95% CI" in page
    assert f'href="{LINK}/namespaces/default/workflows/run-a%2Ftask-' in page


@pytest.mark.skipif(chromium() is None, reason="chromium is not installed (apt-get install chromium)")
def test_html_renders_in_headless_chromium(tmp_path: Path):
    a, b = synthetic_run("run-a"), synthetic_run("run-b", p_shift=0.2, seed=1)
    page = tmp_path / "report.html"
    page.write_text(render_html([a, b], linker, compare_runs(a.rewards_by_task, b.rewards_by_task)))
    png = tmp_path / "report.png"
    screenshot(page, png)
    assert png.exists() and png.stat().st_size > 30_000, png.stat().st_size
    image = pytest.importorskip("PIL.Image")
    with image.open(png) as im:
        rgb = im.convert("RGB")
        assert rgb.size == (1280, 1800)
        colours = rgb.getcolors(maxcolors=1 << 20) or []
        # A blank or unstyled page has a handful of colours; plots with anti-aliased lines and bars have hundreds.
        assert len(colours) > 200, len(colours)
        small = rgb.resize((64, 90))
        raw = small.tobytes()
        not_white = sum(1 for i in range(0, len(raw), 3) if raw[i] + raw[i + 1] + raw[i + 2] < 700)
        assert not_white > 64 * 90 * 0.03, not_white  # ink on more than 3% of the page

"""A worker pool serves Prometheus metrics when asked: rollout metrics (docs/metrics.md) and the SDK's own, on
one endpoint; the alert rules and the dashboard in deploy/ name only metrics the workers export."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
import yaml
from gymflow.activities import metrics as rollout_metrics
from gymflow.workers import metrics
from gymflow.workers.local_stack import free_port
from prometheus_client.parser import text_string_to_metric_families
from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from gymflow.testing.scripted_openai import context_length_error, text, tool_call
from tests.conftest import ROOT
from tests.helpers import weather_task

PROMETHEUS = ROOT / "deploy" / "prometheus"
DASHBOARD = ROOT / "deploy" / "grafana" / "gymflow-dashboard.json"
# Series Prometheus makes itself for every target: not exported by any worker.
SCRAPE_SERIES = {"up"}
PROMQL_WORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "bool",
                "offset", "inf", "nan", "sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk",
                "quantile", "count_values", "group"}

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(body: str) -> Samples:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(body) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum over the series of `name` whose labels include `labels` (0 when there is none)."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


def exported_names(body: str) -> set[str]:
    """Every series name a scrape can hold, including those of families with no series yet (HELP/TYPE only)."""
    names = {n for n, _ in parse(body)}
    for m in re.finditer(r"^# TYPE (\S+) (\w+)$", body, re.MULTILINE):
        name, kind = m.groups()
        names.add(name)
        if kind == "histogram":
            names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    return names


def promql_metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers outside strings, label matchers, ranges and grouping
    clauses that are neither functions (followed by '(') nor keywords."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    names = set()
    for m in re.finditer(r"(?<![\w.$])[A-Za-z_:][\w:]*(?![\w:])(?!\s*\()", expr):
        if m.group().lower() not in PROMQL_WORDS:
            names.add(m.group())
    return names


def test_promql_name_extraction():
    expr = ('histogram_quantile(0.95, sum by (task_queue, le) (rate(a_bucket{x=~"y.*", le!="1"}[5m] offset 30m)))'
            ' > 2 * b_total or absent(c{q="sum(d)"}) unless on (run) sum without (e) (f) and 5m_not > bool 1')
    assert promql_metric_names(expr) == {"a_bucket", "b_total", "c", "f"}


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    """This process's endpoint, as `gymflow worker --metrics` serves it: the test env pool records here."""
    port = free_port()
    metrics.start_server(f"127.0.0.1:{port}")
    yield f"http://127.0.0.1:{port}/metrics"


async def scrape(url: str, wait_s: float = 0.0) -> str:
    """The endpoint's text; waits up to `wait_s` for a worker process that is still starting."""
    async with httpx.AsyncClient() as http:
        for _ in range(int(wait_s / 0.5)):
            try:
                return (await http.get(url, timeout=10)).raise_for_status().text
            except httpx.ConnectError:
                await asyncio.sleep(0.5)
        return (await http.get(url, timeout=10)).raise_for_status().text


async def test_rollout_metrics_count_what_the_stack_did(gf, scripted, generate_pool, endpoint, run_id):
    gen_before = parse(await scrape(generate_pool.metrics_url, wait_s=60))
    env_before = parse(await scrape(endpoint))
    # Rollout 1: a bad tool call (the model sees the error), a good one, an answer: completed, reward 1.
    # Rollout 2: the prompt no longer fits the model: failed, context_length_exceeded, no reward.
    scripted.script(tool_call("launch_rockets", {"n": 3}), tool_call("get_weather", {"city": "SF"}), text("cold"),
                    context_length_error())
    done = await gf.run_rollout(gf.make_input(run_id, weather_task(), 0, "pooled"))
    failed = await gf.run_rollout(gf.make_input(run_id, weather_task("w1"), 0, "pooled"))
    assert (done.status, done.reward, failed.status) == ("completed", 1.0, "failed")

    env = parse(await scrape(endpoint))
    run = {"run": run_id, "env": "single_tool", "model": "pooled"}
    assert value(env, "gymflow_rollouts_started_total", **run) == 2
    assert value(env, "gymflow_rollouts_finished_total", **run, status="completed", failure_type="") == 1
    assert value(env, "gymflow_rollouts_finished_total", **run, status="failed",
                 failure_type="context_length_exceeded") == 1
    assert value(env, "gymflow_rollout_reward_count", **run) == 1
    assert value(env, "gymflow_rollout_reward_sum", **run) == 1.0
    assert value(env, "gymflow_rollout_reward_bucket", **run, le="0.9") == 0
    assert value(env, "gymflow_rollout_reward_bucket", **run, le="1.0") == 1

    def env_delta(name: str, **labels: str) -> float:
        return value(env, name, **labels) - value(env_before, name, **labels)

    assert env_delta("gymflow_tool_calls_total", env="single_tool", outcome="error") == 1
    assert env_delta("gymflow_tool_calls_total", env="single_tool", outcome="ok") == 1
    assert env_delta("gymflow_rollout_duration_seconds_count", env="single_tool", model="pooled") == 2

    # The generate pool is its own process: its --metrics endpoint holds the generation metrics.
    gen = parse(await scrape(generate_pool.metrics_url))

    def gen_delta(name: str, **labels: str) -> float:
        return value(gen, name, **labels) - value(gen_before, name, **labels)

    assert gen_delta("gymflow_generation_latency_seconds_count", model="pooled") == 3
    assert gen_delta("gymflow_generation_latency_seconds_sum", model="pooled") > 0
    assert gen_delta("gymflow_generation_tokens_total", model="pooled", type="prompt") == 3 * 10
    assert gen_delta("gymflow_generation_tokens_total", model="pooled", type="completion") > 0
    assert gen_delta("gymflow_generation_failures_total", model="pooled", failure_type="context_length_exceeded") == 1
    # ... beside the SDK's, in seconds, counters with _total: the backlog of the generate queue(s).
    queue = {ls for (n, ls), _ in gen.items() if n == "temporal_activity_schedule_to_start_latency_count"}
    assert any(dict(ls)["task_queue"].startswith("gymflow-generate") for ls in queue)
    assert value(gen, "temporal_request_total") > 0
    assert "API_KEY" not in str(gen) and "sk-gymflow-test" not in str(gen)


def test_idle_runs_are_forgotten():
    series = rollout_metrics._RunSeries(ttl_s=0.0)
    run = "t-" + uuid.uuid4().hex
    series.child(rollout_metrics.ROLLOUTS_STARTED, run, "e", "m").inc()
    assert rollout_metrics.ROLLOUTS_STARTED.labels(run, "e", "m")._value.get() == 1
    series._next_sweep = 0.0
    series.child(rollout_metrics.ROLLOUTS_STARTED, "other-" + run, "e", "m")  # any later event sweeps idle runs
    body = "\n".join(f"{s.labels}" for f in rollout_metrics.ROLLOUTS_STARTED.collect() for s in f.samples)
    assert f"'run': '{run}'" not in body


@activity.defn(name="metrics_probe")
async def _probe(x: str) -> str:
    return x


@workflow.defn(name="MetricsProbe")
class _ProbeWorkflow:
    @workflow.run
    async def run(self, x: str) -> str:
        # A local activity too: the SDK's counter of those is named `temporal_local_activity_total` already.
        await workflow.execute_local_activity(_probe, x, start_to_close_timeout=timedelta(seconds=10))
        return await workflow.execute_activity(_probe, x, start_to_close_timeout=timedelta(seconds=10))


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def probe_scrape(stack) -> str:
    """A scrape of `metrics.serve` (what `gymflow worker --metrics` runs) after a workflow, a local activity and an
    activity ran under it, so the SDK's workflow- and activity-task families are there beside gymflow's."""
    port = free_port()
    runtime = metrics.serve(f"127.0.0.1:{port}")
    client = await Client.connect(stack.temporal_address, runtime=runtime)
    queue = "gymflow-metrics-probe-" + uuid.uuid4().hex[:6]
    async with Worker(client, task_queue=queue, workflows=[_ProbeWorkflow], activities=[_probe],
                      workflow_runner=UnsandboxedWorkflowRunner()):
        await client.execute_workflow(_ProbeWorkflow.run, "x", id=queue, task_queue=queue)
        return (await scrape(f"http://127.0.0.1:{port}/metrics")).replace(queue, "PROBE")


async def test_one_endpoint_serves_rollout_and_sdk_metrics(probe_scrape):
    assert {"gymflow_rollouts_finished_total", "gymflow_generation_latency_seconds_bucket",
            "temporal_workflow_task_schedule_to_start_latency_bucket",
            "temporal_activity_schedule_to_start_latency_bucket", "temporal_num_pollers",
            "temporal_request_total", "temporal_local_activity_total"} <= exported_names(probe_scrape)
    samples = parse(probe_scrape)
    assert value(samples, "temporal_num_pollers", task_queue="PROBE") > 0
    # durations are seconds: a task picked up at once waited well under a second
    assert 0 < value(samples, "temporal_activity_schedule_to_start_latency_sum", task_queue="PROBE") < 5


async def test_sdk_counters_end_in_one_total(probe_scrape):
    """Every counter's series ends in `_total` once: the SDK's `temporal_local_activity_total` is served as that,
    not `temporal_local_activity_total_total` (the exporter's counters_total_suffix doubles it)."""
    counters = {f.name: {s.name for s in f.samples} for f in text_string_to_metric_families(probe_scrape)
                if f.type == "counter" and f.name.startswith("temporal_")}
    assert {"temporal_request", "temporal_local_activity"} <= set(counters), sorted(counters)
    for family, names in counters.items():
        assert names == {f"{family}_total"}, f"{family}: {sorted(names)}"
    assert "_total_total" not in probe_scrape
    samples = parse(probe_scrape)
    assert value(samples, "temporal_local_activity_total", task_queue="PROBE") >= 1
    assert value(samples, "temporal_request_total") > 0


def _alert_exprs() -> dict[str, str]:
    rules = yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())
    return {r["alert"]: r["expr"] for g in rules["groups"] for r in g["rules"]}


def _dashboard_exprs() -> dict[str, str]:
    dash = json.loads(DASHBOARD.read_text())
    out = {f"{p['title']} {t['refId']}": t["expr"] for p in dash["panels"] for t in p.get("targets", ())}
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            m = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", var["definition"])
            assert m, var["definition"]
            out[f"${var['name']}"] = m.group(1)
    return out


def test_alerts_are_the_five_promised():
    assert set(_alert_exprs()) == {"GymflowRunStalled", "GymflowFailureRateSpike", "GymflowJudgeFailing",
                                   "GymflowPoolNoPollers", "GymflowBacklogGrowing"}


async def test_alerts_and_dashboard_name_only_exported_metrics(probe_scrape):
    exported = exported_names(probe_scrape)
    for where, exprs in (("alerts.yml", _alert_exprs()), ("dashboard", _dashboard_exprs())):
        for name, expr in exprs.items():
            unknown = promql_metric_names(expr) - exported - SCRAPE_SERIES
            assert not unknown, f"{where} {name}: {sorted(unknown)} not exported by the workers"
    jobs = {j["job_name"] for j in yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())["scrape_configs"]}
    assert jobs == {"gymflow-workflows", "gymflow-env", "gymflow-generate"}


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (Debian: prometheus)")
def test_promtool_checks_config_rules_and_dashboard_queries(tmp_path: Path):
    def promtool(*args: str) -> None:
        out = subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr

    promtool("check", "config", str(PROMETHEUS / "prometheus.yml"))  # and the rule file it names
    promtool("test", "rules", str(PROMETHEUS / "alerts.test.yml"))
    # Each dashboard query parses as PromQL once Grafana's variables are filled in.
    exprs = [e.replace("$__rate_interval", "5m") for k, e in _dashboard_exprs().items() if not k.startswith("$")]
    rules = {"groups": [{"name": "dashboard", "rules": [{"record": f"dashboard:q{i}", "expr": e}
                                                         for i, e in enumerate(exprs)]}]}
    (tmp_path / "dashboard.yml").write_text(yaml.safe_dump(rules))
    promtool("check", "rules", str(tmp_path / "dashboard.yml"))


async def test_worker_serves_prometheus_metrics(config_file, gf):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gymflow.cli.main", "worker", "--pool", "workflows",
                             "--metrics", f"127.0.0.1:{port}", "--config", str(config_file)], cwd=ROOT)
    try:
        body = ""
        for _ in range(60):
            try:
                body = (await scrape(f"http://127.0.0.1:{port}/metrics"))
                if "temporal_worker_task_slots_available" in body:
                    break
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.5)
        assert "temporal_worker_task_slots_available" in body
        assert 'task_queue="gymflow-workflows"' in body
        assert "# TYPE gymflow_rollouts_finished_total counter" in body  # the same endpoint
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0

"""Rollout metrics: their definitions and the calls activities make where each fact is known.

Each fact is recorded where it is known, in the process that knows it: outcomes and rewards in the persist
activity, `started` in setup, tool calls in call_tool (env pool); latency and tokens in generate (generate
pool). Prometheus sums across processes, so nothing here is a cross-process gauge: in-flight rollouts are
`started - finished` in PromQL (docs/metrics.md lists every name and the alerts that use it).

Serving them (one endpoint per worker, with the SDK's own) is workers/metrics.py's job.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TypeVar

from prometheus_client import Counter, Histogram
from prometheus_client.metrics import MetricWrapperBase

from gymflow.kernel.failures import known
from gymflow.kernel.wire import RolloutRecord, Usage

log = logging.getLogger(__name__)
M = TypeVar("M", bound=MetricWrapperBase)

# `run` is the one label without a bound over time: a worker forgets a run's series once it has seen nothing
# of that run for this long, so its series count follows the runs in flight, not every run it ever served.
# Per-run history beyond that lives in Postgres (`gymflow report`).
RUN_TTL_S = 6 * 3600.0
# Rewards are usually in [0, 1]; the upper buckets keep larger scales readable. No negative bucket: with one,
# prometheus_client drops `_sum` (it could then decrease), and the mean reward needs it. A negative reward
# counts in le="0.0" and lowers `_sum`, which rate() reads as a counter reset: such envs read the buckets.
REWARD_BUCKETS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 2.0, 5.0, 10.0)
# From a cached short reply to a long reasoning trace against a loaded server.
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)
EPISODE_BUCKETS = (1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0)

ROLLOUTS_STARTED = Counter(
    "gymflow_rollouts_started", "Rollouts whose episode setup began (first attempt only).", ["run", "env", "model"])
ROLLOUTS_FINISHED = Counter(
    "gymflow_rollouts_finished", "Rollouts recorded in Postgres, by status (completed, masked, failed) and "
    "failure_type (the closed set of docs/failures.md; empty when completed).",
    ["run", "env", "model", "status", "failure_type"])
ROLLOUT_REWARD = Histogram(
    "gymflow_rollout_reward", "Reward of each scored rollout (masked and failed ones have none).",
    ["run", "env", "model"], buckets=REWARD_BUCKETS)
ROLLOUT_DURATION = Histogram(
    "gymflow_rollout_duration_seconds", "Wall time of a recorded rollout, setup to verify.", ["env", "model"],
    buckets=EPISODE_BUCKETS)
TOOL_CALLS = Counter(
    "gymflow_tool_calls", "Tool calls by outcome: ok, or error (a bad call whose error the model sees).",
    ["env", "outcome"])
GENERATION_LATENCY = Histogram(
    "gymflow_generation_latency_seconds", "Time of one successful model call (one turn), queueing for the "
    "model's concurrency limit included.", ["model"], buckets=LATENCY_BUCKETS)
GENERATION_TOKENS = Counter(
    "gymflow_generation_tokens", "Tokens of successful model calls, by type (prompt, completion).", ["model", "type"])
GENERATION_FAILURES = Counter(
    "gymflow_generation_failures", "Failed model-call attempts by failure_type (each attempt counts; Temporal "
    "retries the retryable ones).", ["model", "failure_type"])


class _RunSeries:
    """Children of run-labelled metrics, dropped once their run has been idle for `ttl_s`."""

    def __init__(self, ttl_s: float = RUN_TTL_S) -> None:
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._last_seen: dict[str, float] = {}
        self._series: dict[str, set[tuple[MetricWrapperBase, tuple[str, ...]]]] = {}
        self._next_sweep = 0.0

    def child(self, metric: M, *values: str) -> M:
        now = time.monotonic()
        with self._lock:
            run = values[0]
            self._last_seen[run] = now
            self._series.setdefault(run, set()).add((metric, values))
            if now >= self._next_sweep:
                self._next_sweep = now + min(60.0, self.ttl_s)
                self._forget_idle(now)
        return metric.labels(*values)

    def _forget_idle(self, now: float) -> None:
        for run, seen in list(self._last_seen.items()):
            if now - seen > self.ttl_s:
                del self._last_seen[run]
                for metric, values in self._series.pop(run, ()):
                    try:
                        metric.remove(*values)
                    except KeyError:
                        pass


RUN_SERIES = _RunSeries()


def rollout_started(run: str, env: str, model: str, attempt: int) -> None:
    """Counted on the first attempt only, so a retried setup is not a second rollout."""
    if attempt == 1:
        RUN_SERIES.child(ROLLOUTS_STARTED, run, env, model).inc()


def rollout_finished(record: RolloutRecord) -> None:
    """One recorded rollout. Persist is idempotent and retried: an attempt whose write succeeded but whose
    completion was lost (the worker died just then) is counted again; that is rare and we accept it."""
    s = record.summary
    status = "masked" if s.masked else s.status
    failure_type = known(s.failure_type) if s.failure_type else ""
    RUN_SERIES.child(ROLLOUTS_FINISHED, s.run_id, record.env, record.model, status, failure_type).inc()
    if s.reward is not None:
        RUN_SERIES.child(ROLLOUT_REWARD, s.run_id, record.env, record.model).observe(s.reward)
    ROLLOUT_DURATION.labels(record.env, record.model).observe(s.latency_s)


def tool_call(env: str, outcome: str) -> None:
    TOOL_CALLS.labels(env, outcome).inc()


def generation_done(model: str, latency_s: float, usage: Usage) -> None:
    GENERATION_LATENCY.labels(model).observe(latency_s)
    GENERATION_TOKENS.labels(model, "prompt").inc(usage.prompt_tokens)
    GENERATION_TOKENS.labels(model, "completion").inc(usage.completion_tokens)


def generation_failed(model: str, failure_type: str | None) -> None:
    GENERATION_FAILURES.labels(model, known(failure_type)).inc()



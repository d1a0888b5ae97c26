"""The measurements `python -m bench` makes on a started `BenchStack`: one workload, the low-load overhead, the
latency curve and the scaling run. Each returns a JSON-able dict."""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from bench.report import flatness
from bench.stack import FAST, SLOW, BenchStack
from bench.workloads import (
    check_reward,
    collect,
    history_bytes_per_rollout,
    percentile,
    summarise,
    tasks_for,
    transitions_per_rollout,
)
from gymflow.client import GymflowClient
from gymflow.kernel.store.db import make_engine
from gymflow.kernel.wire import Task

WARMUP = 40


def _tag(name: str) -> str:
    return f"bench-{name}-{time.strftime('%H%M%S')}-{time.monotonic_ns() % 10**6}"


def _progress(label: str, total: int) -> Any:
    step = max(1, total // 10)

    def on_done(done: int) -> None:
        if done % step == 0 or done == total:
            print(f"  {label}: {done}/{total}", file=sys.stderr, flush=True)
    return on_done


async def _client(bench: BenchStack) -> GymflowClient:
    return GymflowClient(bench.client.temporal, bench.settings, bench.database_url)


async def workload(bench: BenchStack, name: str, *, n: int, in_flight: int, env: str | None = None,
                   tasks_of: Callable[[int, str], list[Task]] | None = None) -> dict[str, Any]:
    """Rate, CPU per process, latency, transitions, history bytes and peak memory for `n` rollouts, after an
    unmeasured warm-up (WARMUP rollouts of the workload): one-off costs such as spawning the math checker
    processes or opening connection pools are paid once per worker process, not per rollout. `env`: run the
    workload's rows in this environment instead (bench/hostile_env.py's single_tool_direct). `tasks_of(n, tag)`:
    other rows instead of the workload's (bench/nemo_gym_side_by_side.py's adapter rows)."""
    make = tasks_of or (lambda k, tag: tasks_for(name, k, tag, env))
    client = await _client(bench)
    run_id = _tag(name)
    try:
        warm = _tag(f"{name}-warmup")
        await collect(bench, client, make(WARMUP, warm), run_id=warm, model=FAST,
                      in_flight=WARMUP)
        bench.sampler.reset_peaks()
        got = await collect(bench, client, make(n, run_id), run_id=run_id, model=FAST,
                            in_flight=in_flight, on_done=_progress(name, n))
        peak = {k: v / 2**20 for k, v in bench.sampler.peak.items()}
        out = summarise(got) | {"workload": name, "env": env, "generate": bench.generate, "in_flight": in_flight,
                                "transitions_per_rollout": await transitions_per_rollout(client, run_id),
                                "history_bytes_per_rollout": await history_bytes_per_rollout(client, run_id),
                                "peak_rss_mib": peak}
    finally:
        await client.close()
    if bench.correct_fraction is not None and env is None and tasks_of is None:
        out |= check_reward(name, got, bench.correct_fraction, bench.seed)  # SystemExit on a mismatch
    return out


def conversations(records: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Requests of one-at-a-time rollouts, split where a rollout's first request (turn 0) arrives."""
    out: list[list[dict[str, Any]]] = []
    for r in sorted(records, key=lambda r: r["arrived"]):
        if r["turn"] == 0 or not out:
            out.append([])
        out[-1].append(r)
    return out


async def finished_at(database_url: str, run_id: str) -> list[float]:
    """Wall-clock times at which each rollout of the run was persisted, in order."""
    engine = make_engine(database_url, pool_size=1)
    try:
        async with engine.connect() as conn:
            rows = await conn.execute(sa.text("SELECT extract(epoch FROM finished_at) FROM rollouts "
                                              "WHERE run_id = :r ORDER BY finished_at"), {"r": run_id})
            return [float(v) for (v,) in rows]
    finally:
        await engine.dispose()


def _ms_stats(values: list[float]) -> dict[str, Any]:
    ms = [1000 * v for v in values]
    return {"count": len(ms), "p50_ms": percentile(ms, 50), "p95_ms": percentile(ms, 95),
            "mean_ms": statistics.fmean(ms) if ms else None}


async def overhead(bench: BenchStack, *, n: int, name: str = "single_tool") -> dict[str, Any]:
    """Orchestration time per turn with one rollout in flight and a zero-latency model: model reply sent ->
    the rollout's next model request received, and last reply sent -> rollout row persisted."""
    client = await _client(bench)
    run_id = _tag(f"overhead-{name}")
    bench.mock_stats(FAST, reset=True)
    try:
        got = await collect(bench, client, tasks_for(name, n, run_id), run_id=run_id, model=FAST, in_flight=1)
    finally:
        await client.close()
    convs = conversations(bench.mock_stats(FAST, reset=True))
    between = [b["arrived"] - a["sent"] for c in convs for a, b in zip(c, c[1:], strict=False)]
    persisted = await finished_at(bench.database_url, run_id)
    to_persist: list[float] = []
    if len(persisted) == len(convs):
        to_persist = [p - c[-1]["sent_wall"] for c, p in zip(convs, persisted, strict=True)]
    return {"workload": name, "generate": bench.generate, "n": n, "statuses": got.statuses,
            "model_calls": sum(len(c) for c in convs), "conversations": len(convs),
            "reply_to_next_request": _ms_stats(between), "last_reply_to_persisted": _ms_stats(to_persist),
            "rollout_latency_p50_s": percentile(got.latencies, 50)}


def curve_n(in_flight: int, capacity: float | None, cap_s: float) -> tuple[int, bool]:
    """3x the in-flight count, fewer when the machine's measured rate would need more than `cap_s` for it."""
    n = 3 * in_flight
    if capacity:
        n_cap = max(in_flight, math.ceil(capacity * cap_s))
        if n_cap < n:
            return n_cap, True
    return n, False


async def latency_curve(bench: BenchStack, *, points: list[int], latency_s: float, name: str,
                        capacity: float | None, cap_s: float) -> dict[str, Any]:
    """Rate with a fixed model latency at each in-flight count, against the model-bound rate
    (in flight / (model calls per rollout x latency))."""
    rows = []
    for in_flight in points:
        n, capped = curve_n(in_flight, capacity, cap_s)
        client = await _client(bench)
        run_id = _tag(f"curve{in_flight}")
        bench.mock_stats(SLOW, reset=True)
        try:
            got = await collect(bench, client, tasks_for(name, n, run_id), run_id=run_id, model=SLOW,
                                in_flight=in_flight, on_done=_progress(f"curve {in_flight} in flight", n))
        finally:
            await client.close()
        calls = len(bench.mock_stats(SLOW, reset=True)) / n
        bound = in_flight / (calls * latency_s) if calls and latency_s else None
        rows.append({"in_flight": in_flight, "n": n, "capped_by_time": capped, "wall_s": got.wall_s,
                     "rollouts_per_s": got.rate, "model_calls_per_rollout": calls, "model_bound_per_s": bound,
                     "fraction_of_bound": got.rate / bound if bound else None, "statuses": got.statuses,
                     "p95_latency_s": percentile(got.latencies, 95),
                     "cpu_ms_per_rollout_by_process": {k: round(1000 * v / n, 2) for k, v in got.cpu_s.items()}})
    held = [r["in_flight"] for r in rows if (r["fraction_of_bound"] or 0) >= 0.9]
    return {"workload": name, "generate": bench.generate, "latency_s": latency_s, "time_cap_s": cap_s, "points": rows,
            "highest_in_flight_at_90pct": max(held) if held else None}


async def scaling(bench: BenchStack, *, n: int, window: int, in_flight: int,
                  name: str = "single_tool") -> dict[str, Any]:
    """One run of `n` rollouts, sampled every `window` completions; flatness as `bench.report.flatness` says."""
    client = await _client(bench)
    run_id = _tag(f"scale{n}")
    try:
        got = await collect(bench, client, tasks_for(name, n, run_id), run_id=run_id, model=FAST,
                            in_flight=in_flight, window=window, on_done=_progress(f"scale {n}", n))
    finally:
        await client.close()
    out = {"workload": name, "generate": bench.generate, "n": n, "window": window, "in_flight": in_flight,
           "rollouts_per_s": got.rate, "statuses": got.statuses, "windows": got.windows}
    return out | flatness(out)

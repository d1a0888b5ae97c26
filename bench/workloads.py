"""The benchmark workloads (tasks) and one measured collection of them.

single_tool: NeMo Gym's example_single_tool_call rows (get_weather: generate, tool, generate, verify);
single_turn: reasoning_gym basic_arithmetic (one generation, a trivial verify);
math: NeMo Gym's math_with_judge rows with no judge (one generation, math-verify).
Rows are repeated with distinct task ids up to N.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gymflow.environments.reasoning_gym_env import make_tasks

from bench.stack import MOCK_PROCESSES, BenchStack
from gymflow.client import GymflowClient
from gymflow.data.datasets import load_jsonl
from gymflow.kernel.wire import Task

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "nemo_gym"
WORKLOADS = ("single_tool", "single_turn", "math")
HISTORY_SAMPLE = 20
TRANSITIONS_SAMPLE = 200


def _nemo_rows(folder: str, env: str) -> list[Task]:
    path = SHARED / folder / "example.jsonl"
    tasks, errors = load_jsonl(path, env=env)
    if errors or not tasks:
        raise SystemExit(f"{path}: cannot load the benchmark rows ({len(errors)} bad lines, first: "
                         f"{errors[0] if errors else 'no rows'})")
    return tasks


def base_tasks(workload: str) -> list[Task]:
    if workload == "single_tool":
        return _nemo_rows("example_single_tool_call", "single_tool")
    if workload == "math":
        return _nemo_rows("math_with_judge", "math_with_judge")
    if workload == "single_turn":
        return make_tasks("basic_arithmetic", 50, seed=1)
    raise SystemExit(f"unknown workload {workload!r}; one of {', '.join(WORKLOADS)}")


def tasks_for(workload: str, n: int, tag: str, env: str | None = None) -> list[Task]:
    """`n` tasks cycling over the workload's rows, each with its own id (and in `env` instead, if given)."""
    base = base_tasks(workload)
    other = {"env": env} if env else {}
    return [base[i % len(base)].model_copy(update={"id": f"{tag}-{i}", **other}) for i in range(n)]


def answers() -> dict[str, str | None]:
    """The mock's answer table (gymflow/testing/mock_openai.py): every workload row's prompt -> its gold answer
    (None for single_tool: right means calling the offered tool)."""
    from gymflow.environments.reasoning_gym_env import ReasoningGymTask, entry_for

    out: dict[str, str | None] = {}
    for name in WORKLOADS:
        for t in base_tasks(name):
            prompt = next(m.content for m in t.messages if m.role == "user")
            if name == "single_tool":
                out[prompt] = None
            elif name == "math":
                out[prompt] = str(t.data["expected_answer"])
            else:
                out[prompt] = str(entry_for(ReasoningGymTask(**t.data))["answer"])
    return out


def check_reward(name: str, got: Collected, fraction: float, seed: int) -> dict[str, Any]:
    """The mean reward must be exactly the mean of the mock's per-task choices over the scored rollouts, and
    that within 4 binomial standard deviations of `fraction`; SystemExit naming the workload otherwise."""
    import math

    from gymflow.testing.mock_openai import is_right

    if not got.task_rewards:
        raise SystemExit(f"workload {name}: no scored rollouts (statuses {got.statuses}); expected mean reward "
                         f"{fraction:.3f}")
    expected = statistics.fmean(float(is_right(f"{got.run_id}/{t}", fraction, seed)) for t, _ in got.task_rewards)
    n = len(got.task_rewards)
    bound = 4 * math.sqrt(fraction * (1 - fraction) / n) + 1 / n
    mean = got.mean_reward or 0.0
    if abs(mean - expected) > 1e-9 or abs(expected - fraction) > bound:
        raise SystemExit(f"workload {name}: mean reward {mean:.4f} over {n} rollouts, expected {expected:.4f} "
                         f"(the mock is right on that share of the tasks; correct fraction {fraction}, "
                         f"+-{bound:.4f})")
    return {"correct_fraction": fraction, "expected_mean_reward": expected, "tolerance": bound}


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


@dataclass
class Window:
    """Rollouts completed between two readings (the scaling run's samples)."""

    done: int
    seconds: float
    cpu_s: float  # every process but the mocks
    latencies: list[float]
    rss: dict[str, int]
    cpu_by_process: dict[str, float] | None = None  # seconds per process (the mocks too) in the window

    def row(self) -> dict[str, Any]:
        n = len(self.latencies)
        return {"done": self.done, "rollouts_per_s": n / self.seconds if self.seconds else None,
                "cpu_ms_per_rollout": 1000 * self.cpu_s / n if n else None,
                "p95_latency_s": percentile(self.latencies, 95), "rss_mib": {k: v / 2**20 for k, v in self.rss.items()},
                "cpu_ms_per_rollout_by_process": {k: round(1000 * v / n, 2)
                                                  for k, v in (self.cpu_by_process or {}).items()} if n else {}}


@dataclass
class Collected:
    run_id: str
    n: int
    wall_s: float
    statuses: dict[str, int]
    mean_reward: float | None
    latencies: list[float]
    cpu_s: dict[str, float]
    windows: list[dict[str, Any]] = field(default_factory=list)
    task_rewards: list[tuple[str, float]] = field(default_factory=list)  # (task id, reward) of scored rollouts

    @property
    def rate(self) -> float:
        return self.n / self.wall_s if self.wall_s else 0.0


async def collect(bench: BenchStack, client: GymflowClient, tasks: list[Task], *, run_id: str, model: str,
                  in_flight: int, window: int = 0, on_done: Callable[[int], None] | None = None) -> Collected:
    """Collect every task once; CPU per process over the whole collection; a `Window` every `window` results."""
    statuses: dict[str, int] = {}
    rewards: list[float] = []
    task_rewards: list[tuple[str, float]] = []
    latencies: list[float] = []
    windows: list[dict[str, Any]] = []
    before = bench.cpu()
    t0 = time.monotonic()
    mark_t, mark_cpu, mark_i = t0, before, 0
    async for r in client.collect(run_id, tasks, n=1, model=model, max_in_flight=in_flight):
        s = r.summary
        statuses[s.status] = statuses.get(s.status, 0) + 1
        latencies.append(s.latency_s)
        if s.reward is not None and not s.masked:
            rewards.append(s.reward)
            task_rewards.append((s.task_id, s.reward))
        done = len(latencies)
        if window and (done % window == 0 or done == len(tasks)):
            now, cpu = time.monotonic(), bench.cpu()
            spent = sum(cpu[k] - mark_cpu[k] for k in cpu if k not in MOCK_PROCESSES)
            windows.append(Window(done, now - mark_t, spent, latencies[mark_i:], bench.sampler.sample(),
                                  {k: cpu[k] - mark_cpu[k] for k in cpu}).row())
            mark_t, mark_cpu, mark_i = now, cpu, done
        if on_done is not None:
            on_done(done)
    wall = time.monotonic() - t0
    after = bench.cpu()
    return Collected(run_id, len(tasks), wall, statuses, statistics.fmean(rewards) if rewards else None, latencies,
                     {k: after[k] - before[k] for k in after}, windows, task_rewards)


async def transitions_per_rollout(client: GymflowClient, run_id: str, limit: int = TRANSITIONS_SAMPLE
                                  ) -> float | None:
    counts: list[int] = []
    async for w in client.temporal.list_workflows(f"GymflowRun = '{run_id}'", limit=limit):
        counts.append(w.raw_info.state_transition_count)
    return statistics.fmean(counts) if counts else None


async def history_bytes_per_rollout(client: GymflowClient, run_id: str, limit: int = HISTORY_SAMPLE
                                    ) -> float | None:
    """Mean size of a rollout's whole workflow history as JSON (`fetch_history().to_json()`), over a sample."""
    sizes: list[int] = []
    async for w in client.temporal.list_workflows(f"GymflowRun = '{run_id}'", limit=limit):
        history = await client.temporal.get_workflow_handle(w.id, run_id=w.run_id).fetch_history()
        sizes.append(len(history.to_json().encode()))
    return statistics.fmean(sizes) if sizes else None


def summarise(c: Collected) -> dict[str, Any]:
    counted = {k: v for k, v in c.cpu_s.items() if k not in MOCK_PROCESSES}
    return {
        "run_id": c.run_id, "n": c.n, "wall_s": c.wall_s, "rollouts_per_s": c.rate, "statuses": c.statuses,
        "mean_reward": c.mean_reward,
        "p50_latency_s": percentile(c.latencies, 50), "p95_latency_s": percentile(c.latencies, 95),
        "cpu_s_per_1000": {k: 1000 * v / c.n for k, v in c.cpu_s.items()},
        "cpu_s_per_1000_total": 1000 * sum(counted.values()) / c.n,
        **({"windows": c.windows} if c.windows else {}),
    }


def dumps(obj: Any) -> str:
    return json.dumps(obj, indent=2, default=str)


def run_meta(module: str, argv: list[str] | None) -> dict[str, Any]:
    """What a benchmark's output opens with: the command, when, the cores and the load at the start."""
    import os
    import sys
    import time

    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "command": " ".join([f"python -m {module}", *(argv or sys.argv[1:])]),
            "cores": os.cpu_count(), "load_at_start": ", ".join(f"{v:.1f}" for v in os.getloadavg())}


def save_and_print(out: Path, meta: dict[str, Any], runs: list[dict[str, Any]], table: str) -> None:
    """Write the runs as JSON to `out` and print the header and `table`, as every benchmark's report does."""
    import sys

    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(dumps({"meta": meta, "runs": runs}) + "\n")
    print(f"`{meta['command']}`, {meta['date']}, {meta['cores']} cores, load at start {meta['load_at_start']}\n")
    print(table, end="")
    print(f"wrote {out}", file=sys.stderr)

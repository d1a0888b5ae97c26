"""The stack a benchmark runs on: embedded Temporal and Postgres, two mock models (no latency, and a fixed
latency for the latency curve), the three pools as `gymflow worker` processes, and per-process CPU and
memory readings (psutil)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import yaml
from gymflow.workers.local_stack import LocalStack, free_port, wait_for_port

from gymflow.client import GymflowClient
from gymflow.kernel.config import ModelConfig, Settings, load_settings

POOLS = ("workflows", "env", "generate")
FAST, SLOW = "mock", "mock_slow"  # model names in the bench config
MOCK_PROCESSES = ("mock", "mock slow")  # excluded from the CPU totals (the rule)
STARTUP_S = 60
DEFAULT_PLACEMENT = ModelConfig.model_fields["placement"].default


def tree_cpu_seconds(pid: int, descendants: bool = True) -> float:
    """CPU of a process and (unless told not to) its live descendants and those it has already reaped."""
    root = psutil.Process(pid)
    t = root.cpu_times()
    if not descendants:
        return t.user + t.system
    total = t.user + t.system + t.children_user + t.children_system
    for child in root.children(recursive=True):
        try:
            c = child.cpu_times()
            total += c.user + c.system
        except psutil.NoSuchProcess:
            pass
    return total


def _pss(p: psutil.Process) -> int:
    try:
        return p.memory_full_info().pss
    except (psutil.AccessDenied, AttributeError):  # no smaps to read: resident size instead
        return p.memory_info().rss


def tree_rss(pid: int, descendants: bool = True) -> int:
    """Memory of a process and its live descendants (Postgres backends, math-verify checkers) as PSS: resident
    bytes with shared pages split between their sharers, so Postgres' shared buffers count once, not per backend."""
    root = psutil.Process(pid)
    procs = [root, *root.children(recursive=True)] if descendants else [root]
    total = 0
    for p in procs:
        try:
            total += _pss(p)
        except psutil.NoSuchProcess:
            pass
    return total


class MemorySampler:
    """Peak RSS per named process tree, sampled every `interval_s` on a thread, with a marker to read the latest
    sample from (the scaling run reads RSS per window)."""

    def __init__(self, pids: dict[str, tuple[tuple[int, ...], bool]], interval_s: float = 0.5) -> None:
        self.pids, self.interval_s = pids, interval_s
        self.peak: dict[str, int] = {k: 0 for k in pids}
        self.latest: dict[str, int] = {k: 0 for k in pids}
        self.own_cpu_s = 0.0  # CPU this sampler's thread has used (it runs in the client's process)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="rss-sampler")

    def sample(self) -> dict[str, int]:
        for name, (pids, desc) in self.pids.items():
            try:
                rss = sum(tree_rss(pid, desc) for pid in pids)
            except psutil.NoSuchProcess:
                continue
            self.latest[name] = rss
            self.peak[name] = max(self.peak[name], rss)
        return dict(self.latest)

    def reset_peaks(self) -> None:
        self.peak = {k: 0 for k in self.pids}

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()
            self.own_cpu_s = time.thread_time()  # reading smaps is not the client's work: cpu() leaves it out

    def start(self) -> MemorySampler:
        self.sample()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


@dataclass
class BenchStack:
    """Everything started for one bench invocation; `close()` stops what it started."""

    work: Path
    settings: Settings
    client: GymflowClient
    database_url: str
    mock_urls: dict[str, str]
    pids: dict[str, tuple[tuple[int, ...], bool]]  # name -> (its processes, count descendants)
    sampler: MemorySampler
    procs: list[subprocess.Popen] = field(default_factory=list)
    stack: LocalStack | None = None
    generate: str = DEFAULT_PLACEMENT  # the models' placement
    correct_fraction: float | None = None  # the mocks' seeded share of right answers (None: no answer table)
    seed: int = 0

    def cpu(self) -> dict[str, float]:
        out = {k: sum(tree_cpu_seconds(pid, desc) for pid in pids) for k, (pids, desc) in self.pids.items()}
        out["client"] -= self.sampler.own_cpu_s  # the memory sampler's thread shares the client's process
        return out

    def mock_stats(self, model: str, reset: bool = False) -> list[dict[str, Any]]:
        root = self.mock_urls[model].removesuffix("/v1")
        r = httpx.get(f"{root}/stats", params={"reset": int(reset)}, timeout=60)
        r.raise_for_status()
        return r.json()["requests"]

    async def close(self) -> None:
        self.sampler.stop()
        await self.client.close()
        stop_processes(list(reversed(self.procs)))
        if self.stack is not None:
            self.stack.stop()


def stop_processes(procs: list[subprocess.Popen[bytes]], grace_s: float = 30.0) -> None:
    """SIGTERM each (in this order), then wait for each; one still running after `grace_s` is killed."""
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()


def _postmaster_pid(data_dir: Path) -> int:
    return int((data_dir / "postmaster.pid").read_text().split()[0])


def _mock(port: int, latency: float, answers: Path | None = None, correct_fraction: float = 0.5,
          seed: int = 0) -> subprocess.Popen:
    extra = ["--answers", str(answers), "--correct-fraction", str(correct_fraction), "--seed", str(seed)] \
        if answers else []
    return subprocess.Popen([sys.executable, "-m", "gymflow.testing.mock_openai", "--port", str(port),
                             "--latency", str(latency), *extra], stdout=subprocess.DEVNULL)


def _worker_command(install: str | None) -> list[str]:
    if install is None:
        return [sys.executable, "-m", "gymflow.cli.main"]
    module, _, function = install.partition(":")
    return [sys.executable, "-c", f"import {module}; {module}.{function}(); "
            "from gymflow.cli.main import main; main()"]


async def start_stack(*, slow_latency_s: float, concurrency: int, log_dir: Path | None = None,
                      generate: str = DEFAULT_PLACEMENT, workflow_procs: int = 1, install: str | None = None,
                      pool_env: dict[str, str] | None = None, correct_fraction: float | None = None,
                      seed: int = 0, environments: dict[str, Any] | None = None) -> BenchStack:
    """Start everything; `concurrency` bounds rollouts in flight (workflow tasks, generate slots, model calls).
    `generate`: the models' placement ('pool': the generate pool calls them; 'local': the workflow pool does).
    `workflow_procs`: processes of the workflow pool (each gets `concurrency`; the CPU and memory are summed).
    `install`: a `module:function` each pool process calls before `gymflow worker` starts (a bench environment's
    registration, bench/hostile_env.py). `pool_env`: extra environment variables for the pool processes.
    `correct_fraction`: the mocks answer the workloads' tasks right on this seeded share (`seed`) of them
    (None: the mock's answer-free behaviour, as the side by side and the noisy neighbour want). `environments`:
    the config's `environments` section (e.g. `{"nemo_gym": {"placement": "local"}}`)."""
    work = Path(tempfile.mkdtemp(prefix="gymflow-bench-"))
    os.chmod(work, 0o755)
    procs: list[subprocess.Popen] = []
    stack: LocalStack | None = None
    try:
        ports = {FAST: free_port(), SLOW: free_port()}
        table = None
        if correct_fraction is not None:
            from bench.workloads import answers  # bench.workloads imports this module

            table = work / "answers.json"
            table.write_text(json.dumps(answers()))
        procs += [_mock(ports[FAST], 0.0, table, correct_fraction or 0.0, seed),
                  _mock(ports[SLOW], slow_latency_s, table, correct_fraction or 0.0, seed)]
        stack = LocalStack(work / "state", port=free_port(), headless=True)
        addr = stack.start()
        urls = {m: f"http://127.0.0.1:{p}/v1" for m, p in ports.items()}
        config = work / "gymflow.yaml"
        config.write_text(yaml.safe_dump({
            "temporal": {"address": addr.temporal_address}, "database": {"url": addr.database_url},
            "models": {m: {"base_url": u, "model": m, "concurrency": concurrency, "placement": generate}
                       for m, u in urls.items()},
            "pools": {"generate": {"concurrency": concurrency}, "env": {"concurrency": 64},
                      "workflows": {"concurrency": concurrency}},
            **({"environments": environments} if environments else {}),
        }))
        logs = log_dir or work
        pool_pids: dict[str, list[int]] = {p: [] for p in POOLS}
        for pool in POOLS:
            for i in range(workflow_procs if pool == "workflows" else 1):
                out = (logs / f"pool-{pool}-{i}.log").open("ab")
                procs.append(subprocess.Popen([*_worker_command(install), "worker", "--pool", pool,
                                               "--config", str(config)], stdout=out, stderr=subprocess.STDOUT,
                                              env={**os.environ, **(pool_env or {})}))
                pool_pids[pool].append(procs[-1].pid)
        for port in ports.values():
            wait_for_port("127.0.0.1", port, STARTUP_S, procs[0])
        settings = load_settings(config, env={})
        client = await GymflowClient.connect(settings)
        assert stack._temporal is not None  # noqa: SLF001 - the bench owns the stack
        pids = {"temporal": ((stack._temporal.pid,), True),  # noqa: SLF001
                "postgres": ((_postmaster_pid(work / "state" / "postgres"),), True),
                **{f"pool {p}": (tuple(ps), True) for p, ps in pool_pids.items()},
                "client": ((os.getpid(),), False),
                "mock": ((procs[0].pid,), False), "mock slow": ((procs[1].pid,), False)}
        sampler = MemorySampler(pids).start()
        await asyncio.sleep(3)  # let the pools start polling, so the clocks measure steady state
        return BenchStack(work, settings, client, addr.database_url, urls, pids, sampler, procs, stack, generate,
                          correct_fraction, seed)
    except BaseException:
        for proc in procs:
            proc.terminate()
        if stack is not None:
            stack.stop()
        raise

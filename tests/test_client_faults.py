"""The client, the CLI and worker startup never die, hang or miscount: unknown names fail before anything
starts, one rejected start does not end a collection, failure types stay in the closed set, a Temporal
restart is ridden out, a worker waits for Postgres, an unexpected error exits in one line, the rate
counts only this invocation's rollouts."""

from __future__ import annotations

import asyncio
import io
import os
import socket
import subprocess
import sys
import threading
import time

import psycopg
import pytest
import yaml
from gymflow.workers.local_stack import LocalStack, free_port
from gymflow.workers.pools import build_pool
from rich.console import Console
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ApplicationError, CancelledError, TerminatedError, TimeoutError, TimeoutType
from temporalio.service import RPCError, RPCStatusCode

from gymflow.cli.collect_cmd import collect_dataset
from gymflow.cli.progress import Tally
from gymflow.client import CollectResult, GymflowClient, _summary_from_failure, is_transient
from gymflow.kernel.config import ModelConfig
from gymflow.kernel.connect import connect_temporal
from gymflow.kernel.failures import FAILURE_TYPES
from gymflow.kernel.store.db import DatabaseUnreachable, migrate_when_reachable
from gymflow.kernel.wire import RolloutInput, RolloutSummary
from gymflow.testing.scripted_openai import ScriptedOpenAI, text
from tests.conftest import ROOT
from tests.helpers import WEATHER_DATASET, user_task, weather_task

# -- units: no server ------------------------------------------------------------------------------


def _summary(outcome: str, status: str = "completed") -> CollectResult:
    s = RolloutSummary(rollout_id="r/t/0", run_id="r", task_id="t", sample_index=0, status=status,  # type: ignore[arg-type]
                       reward=1.0 if status == "completed" else None)
    return CollectResult(s, outcome)  # type: ignore[arg-type]


def test_rate_counts_only_rollouts_that_ran_now():
    tally = Tally(total=100, started_at=time.monotonic() - 10.0)
    for _ in range(90):
        tally.add(_summary("finished"))  # done before this invocation: instant, not throughput
    for outcome in ("started",) * 6 + ("attached",) * 4:
        tally.add(_summary(outcome))
    assert tally.done == 100
    assert 0.9 < tally.rate < 1.1, tally.rate  # 10 in ~10 s, not 100


@pytest.mark.parametrize(("cause", "expected"), [
    (TerminatedError("Terminated"), "workflow_terminated"),
    (CancelledError("Cancelled"), "workflow_cancelled"),
    (TimeoutError("timed out", type=TimeoutType.START_TO_CLOSE, last_heartbeat_details=[]), "workflow_timed_out"),
    (ApplicationError("boom\nTraceback (most recent call last): ...", type="KeyError"), "internal_error"),
    (ApplicationError("Postgres refused the write", type="store_unavailable"), "store_unavailable"),
])
def test_workflow_failures_map_to_the_closed_set(cause, expected):
    inp = RolloutInput(run_id="r", task=weather_task(), sample_index=0, model="policy")
    summary = _summary_from_failure(WorkflowFailureError(cause=cause), inp)
    assert summary.failure_type == expected and expected in FAILURE_TYPES
    assert "\n" not in (summary.failure_message or "") and "Traceback" not in (summary.failure_message or "")


def test_transient_rpc_errors():
    assert is_transient(RPCError("tcp connect error", RPCStatusCode.UNAVAILABLE, b""))
    assert is_transient(RPCError("transport error", RPCStatusCode.UNKNOWN, b""))
    assert not is_transient(RPCError("WorkflowId exceeds maximum allowed length", RPCStatusCode.INVALID_ARGUMENT, b""))
    assert not is_transient(RPCError("grpc: received message after decompression larger than max 4194304",
                                     RPCStatusCode.RESOURCE_EXHAUSTED, b""))


async def test_unreachable_postgres_is_retried_then_a_clear_error_without_the_password():
    notes: list[str] = []
    url = f"postgresql://gymflow:s3cret-pw@127.0.0.1:{free_port()}/gymflow"
    started = time.monotonic()
    with pytest.raises(DatabaseUnreachable) as err:
        await migrate_when_reachable(url, wait_s=1.5, on_wait=notes.append)
    assert time.monotonic() - started < 15
    assert notes and all("unreachable, retrying (since" in n for n in notes), notes
    assert "127.0.0.1" in str(err.value) and "gave up" in str(err.value)
    assert "s3cret-pw" not in str(err.value) + "".join(notes)



async def test_unreachable_temporal_is_announced_then_a_clear_error():
    from gymflow.kernel.connect import TemporalUnreachable

    notes: list[str] = []
    address = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    # Retries at ~0, 0.5, 1.5 and 3.5 s: the last is past the 2 s a starting server is given before an outage is
    # announced, and inside the bound.
    with pytest.raises(TemporalUnreachable, match=f"Temporal at {address} unreachable for . s, gave up"):
        await connect_temporal(address, wait_s=4, on_wait=notes.append)
    assert time.monotonic() - started < 4 + 1.5  # gives up at its bound, not later
    assert notes and notes[0].startswith(f"Temporal at {address} unreachable, retrying (since"), notes

# -- against the session stack ----------------------------------------------------------------------


async def test_unknown_env_or_model_fails_before_anything_starts(gf, settings, sql, run_id, tmp_path):
    console = Console(file=io.StringIO(), width=200)
    import click

    with pytest.raises(click.ClickException) as err:
        await collect_dataset(settings, str(WEATHER_DATASET), env="no_such_env", model="nope", n=1, run_id=run_id,
                              console=console)
    message = str(err.value.message)
    assert "'no_such_env'" in message and "single_tool" in message, message  # names it and what is installed
    assert "'nope'" in message and "policy" in message, message
    assert sql("SELECT count(*) FROM runs WHERE id = %s", run_id) == [(0,)]
    assert (await gf.temporal.count_workflows(f"GymflowRun = '{run_id}'")).count == 0
    with pytest.raises(Exception, match="no_such_env"):  # the library call checks too
        [r async for r in gf.collect(run_id, [weather_task().model_copy(update={"env": "no_such_env"})], n=1,
                                     model="policy")]
    assert (await gf.temporal.count_workflows(f"GymflowRun = '{run_id}'")).count == 0


@pytest.mark.parametrize("bad_run", ["r" * 201, "a/b", "run\x00x", "  "])
async def test_a_run_id_that_cannot_head_workflow_ids_is_refused_before_anything_starts(gf, settings, sql, bad_run):
    import click

    with pytest.raises(click.ClickException, match="run id"):
        await collect_dataset(settings, str(WEATHER_DATASET), env="single_tool", model="policy", n=1, run_id=bad_run,
                              console=Console(file=io.StringIO(), width=200))
    assert sql("SELECT count(*) FROM runs WHERE id = %s", bad_run.replace("\x00", "")) == [(0,)]


async def test_a_rejected_start_is_recorded_and_the_collection_goes_on(gf, sql, run_id):
    tasks = [weather_task("ok0"), weather_task("x" * 1100), weather_task("ok1")]  # Temporal caps ids at 1,000
    results = [r async for r in gf.collect(run_id, tasks, n=1, model="policy")]
    assert len(results) == 3
    by_task = {r.summary.task_id: r for r in results}
    bad = by_task["x" * 1100]
    assert bad.outcome == "rejected" and bad.summary.failure_type == "start_rejected"
    assert "INVALID_ARGUMENT" in (bad.summary.failure_message or "")
    assert {by_task["ok0"].outcome, by_task["ok1"].outcome} == {"started"}
    rows = dict(sql("SELECT task_id, failure_type FROM rollouts WHERE run_id = %s", run_id))
    assert rows == {"ok0": None, "ok1": None, "x" * 1100: "start_rejected"}


async def test_collect_reports_skipped_rows_by_line(gf, settings, run_id, tmp_path):
    good = WEATHER_DATASET.read_text().splitlines()[0]
    dataset = tmp_path / "rows.jsonl"
    dataset.write_text(f"{good}\n{{not json\n")
    out = io.StringIO()
    tally = await collect_dataset(settings, str(dataset), env="single_tool", model="policy", n=1, run_id=run_id,
                                  console=Console(file=out, width=200))
    text_out = out.getvalue()
    assert tally.skipped == 1 and tally.done == 1
    assert f"skipped {dataset}:2:" in text_out, text_out
    assert any(line.split() == ["│", "skipped", "rows", "│", "1", "│"] for line in text_out.splitlines()), text_out


async def test_unexpected_error_in_collect_exits_in_one_line(gf, config_file):
    """A bug mid-collection (here: Tally.add raises on the first result while the others are still in
    flight) ends the process promptly, non-zero, in one line."""
    script = (
        "import gymflow.cli.progress as p\n"
        "def boom(self, r):\n"
        "    raise RuntimeError('injected failure')\n"
        "p.Tally.add = boom\n"
        "import sys\n"
        "from gymflow.cli.main import main\n"
        f"sys.argv = ['gymflow', 'collect', {str(WEATHER_DATASET)!r}, '--env', 'single_tool', '-n', '3',\n"
        f"            '--run-id', 'boom-{os.getpid()}', '--config', {str(config_file)!r}]\n"
        "main()\n"
    )
    started = time.monotonic()
    proc = await asyncio.to_thread(subprocess.run, [sys.executable, "-c", script], capture_output=True, text=True,
                                   cwd=ROOT, timeout=90)
    assert time.monotonic() - started < 60
    assert proc.returncode == 1, proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
    assert errors == ["Error: unexpected RuntimeError: injected failure (set GYMFLOW_TRACEBACK=1 for the traceback)"]
    assert "Traceback" not in proc.stderr


def _forward(listen_port: int, target: tuple[str, int] | str) -> socket.socket:
    """A TCP forwarder to Postgres, started late: 'Postgres comes up' on a port the worker already polls."""
    server = socket.create_server(("127.0.0.1", listen_port))

    def pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            a.close()
            b.close()

    def accept() -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return
            if isinstance(target, str):
                upstream = socket.socket(socket.AF_UNIX)
                upstream.connect(target)
            else:
                upstream = socket.create_connection(target)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=pipe, args=(a, b), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return server


def test_worker_waits_for_postgres_then_serves(config_file, stack, tmp_path):
    info = psycopg.conninfo.conninfo_to_dict(stack.database_url)
    host, pg_port = str(info.get("host") or "127.0.0.1"), int(info.get("port") or 5432)
    target: tuple[str, int] | str = f"{host}/.s.PGSQL.{pg_port}" if host.startswith("/") else (host, pg_port)
    port = free_port()
    raw = yaml.safe_load(config_file.read_text())
    raw["database"]["url"] = f"postgresql://{info.get('user', 'postgres')}:s3cret-pw@127.0.0.1:{port}/{info['dbname']}"
    config = tmp_path / "gymflow.yaml"
    config.write_text(yaml.safe_dump(raw))
    env = {k: v for k, v in os.environ.items() if k not in ("TEMPORAL_ADDRESS", "DATABASE_URL")}
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "gymflow.cli.main", "worker", "--pool", "env", "-v",
                                 "--config", str(config)], cwd=ROOT, env={**env, "GYMFLOW_STARTUP_WAIT_S": "60"},
                                stdout=out, stderr=subprocess.STDOUT)
    forwarder = None
    try:
        deadline = time.monotonic() + 30
        while "unreachable, retrying" not in log.read_text(errors="replace"):
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.3)
        time.sleep(1.0)
        assert proc.poll() is None, "the worker must wait for Postgres, not exit"
        assert f"Postgres at 127.0.0.1:{port}/" in log.read_text()
        forwarder = _forward(port, target)  # Postgres "comes up"
        deadline = time.monotonic() + 45
        while "polling" not in log.read_text(errors="replace"):
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.3)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        if forwarder:
            forwarder.close()
    output = log.read_text(errors="replace")
    assert proc.returncode == 0, output
    assert "s3cret-pw" not in output


# -- a Temporal restart mid-collection --------------------------------------------------------------


async def test_collect_rides_out_a_temporal_restart(stack, settings, sql, run_id, tmp_path):
    """SIGKILL the Temporal server while rollouts generate, start it again on the same port and state
    file: the collection finishes, every rollout stored once, and the user was told what it waited for."""
    os.chmod(tmp_path, 0o755)
    temporal = LocalStack(tmp_path / "temporal", database_url=stack.database_url, port=free_port(), headless=True)
    addresses = temporal.start()
    model = ScriptedOpenAI(default=text("It is sunny.", delay_s=3.0)).start()
    local = settings.model_copy(update={
        "temporal": settings.temporal.model_copy(update={"address": addresses.temporal_address}),
        "models": {"policy": ModelConfig(base_url=model.base_url, model="m")}})
    worker_client = await connect_temporal(addresses.temporal_address)
    pool = build_pool(worker_client, local, "all", stack.database_url)
    runs = [asyncio.create_task(w.run()) for w in pool.workers]
    notes: list[str] = []
    gf = await GymflowClient.connect(local, on_notice=notes.append)
    gf.reconnect_wait_s = 45.0
    try:
        tasks = [user_task("weather?", f"u{i}") for i in range(4)]
        collecting = asyncio.create_task(_collect(gf, run_id, tasks))
        deadline = time.monotonic() + 20
        while len(model.requests) < 4:  # every rollout is mid-generation
            assert time.monotonic() < deadline and not collecting.done()
            await asyncio.sleep(0.1)
        temporal.kill_temporal()
        # Down until the outage has outlasted the SDK's own retries of one call (~10 s) and reached the client's
        # code, which announces it; only then does Temporal come back.
        announced = f"Temporal unreachable at {addresses.temporal_address}, retrying"
        deadline = time.monotonic() + 40
        while not any(announced in n for n in notes):
            assert time.monotonic() < deadline and not collecting.done(), notes
            await asyncio.sleep(0.1)
        temporal.restart_temporal()
        results = await asyncio.wait_for(collecting, 50)
        died = [r for r in runs if r.done()]  # a worker whose run() ended in the outage
    finally:
        await gf.close()
        for w in pool.workers:
            await asyncio.wait_for(w.shutdown(), 30)
        await asyncio.gather(*runs, return_exceptions=True)
        await pool.close()
        model.stop()
        temporal.stop()
    assert sorted(r.summary.task_id for r in results) == ["u0", "u1", "u2", "u3"]
    assert {r.summary.status for r in results} == {"completed"}, [r.summary for r in results]
    assert sql("SELECT count(*), count(DISTINCT id) FROM rollouts WHERE run_id = %s", run_id) == [(4, 4)]
    assert any(f"Temporal unreachable at {addresses.temporal_address}, retrying" in n for n in notes), notes
    assert not died, [r.exception() for r in died]


async def _collect(gf: GymflowClient, run_id: str, tasks: list) -> list[CollectResult]:
    return [r async for r in gf.collect(run_id, tasks, n=1, model="policy")]


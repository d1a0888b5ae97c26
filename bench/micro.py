"""Micro-benchmarks behind the levers in docs/benchmarks.md: what one step costs in CPU, in isolation.

    python -m bench.micro local_activity   # worker CPU per local activity (a workflow of 1 vs 5 no-op ones)
    python -m bench.micro statement        # CPU per INSERT: SQLAlchemy session, SQLAlchemy connection, psycopg_pool
    python -m bench.micro model_call       # CPU per chat completion: create() vs post(), httpx vs aiohttp transport
    python -m bench.micro temporal         # the dev server's CPU per workflow (2 local activities), file vs memory

Each prints one line per variant; run it twice, the machine is noisy (±10%).
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import psutil
from gymflow.workers.local_stack import LocalStack, free_port, temporal_binary, wait_for_port
from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker


async def _cpu_per_call(label: str, call: Callable[[int], Awaitable[Any]], n: int, concurrency: int = 50) -> None:
    slots = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with slots:
            await call(i)

    await asyncio.gather(*(one(-i - 1) for i in range(min(n, 50))))  # warm: connections, prepared statements
    started = time.process_time()
    await asyncio.gather(*(one(i) for i in range(n)))
    print(f"{label}: {1000 * (time.process_time() - started) / n:.3f} ms of CPU per call", flush=True)


@activity.defn
async def _noop(x: int) -> int:
    return x + 1


@workflow.defn(sandboxed=False)
class _LocalActivities:
    @workflow.run
    async def run(self, k: int) -> int:
        v = 0
        for _ in range(k):
            v = await workflow.execute_local_activity(_noop, v, start_to_close_timeout=timedelta(seconds=5))
        return v


def _dev_server(state: Path, in_memory: bool = False) -> tuple[subprocess.Popen, int]:
    port = free_port()
    db = [] if in_memory else ["--db-filename", str(state / "t.db"), "--sqlite-pragma", "journal_mode=wal",
                               "--sqlite-pragma", "synchronous=normal"]
    proc = subprocess.Popen([temporal_binary(), "server", "start-dev", "--ip", "127.0.0.1", "--port", str(port),
                             "--headless", "--log-level", "error", *db], stdout=subprocess.DEVNULL)
    wait_for_port("127.0.0.1", port, 30, proc)
    return proc, port


async def _workflows(client: Client, k: int, n: int) -> None:
    slots = asyncio.Semaphore(100)

    async def one() -> None:
        async with slots:
            await client.execute_workflow(_LocalActivities.run, k, id=str(uuid.uuid4()), task_queue="micro")

    await asyncio.gather(*(one() for _ in range(n)))


async def local_activity(n: int) -> None:
    proc, port = _dev_server(Path(tempfile.mkdtemp()))
    try:
        client = await Client.connect(f"127.0.0.1:{port}")
        async with Worker(client, task_queue="micro", workflows=[_LocalActivities], activities=[_noop],
                          workflow_runner=UnsandboxedWorkflowRunner(), max_concurrent_workflow_tasks=200):
            await _workflows(client, 1, 50)
            cost = {}
            for k in (1, 5, 1, 5):
                started = time.process_time()
                await _workflows(client, k, n)
                cost[k] = 1000 * (time.process_time() - started) / n
                print(f"workflow with {k} local activities: {cost[k]:.2f} ms of worker CPU each", flush=True)
            print(f"one local activity: {(cost[5] - cost[1]) / 4:.2f} ms of worker CPU", flush=True)
    finally:
        proc.kill()


async def temporal(n: int) -> None:
    for in_memory in (False, True):
        proc, port = _dev_server(Path(tempfile.mkdtemp()), in_memory)
        try:
            server = psutil.Process(proc.pid)
            client = await Client.connect(f"127.0.0.1:{port}")
            async with Worker(client, task_queue="micro", workflows=[_LocalActivities], activities=[_noop],
                              workflow_runner=UnsandboxedWorkflowRunner(), max_concurrent_workflow_tasks=200):
                await _workflows(client, 2, 100)
                for _ in range(2):
                    before = sum(server.cpu_times()[:2])
                    await _workflows(client, 2, n)
                    per = 1000 * (sum(server.cpu_times()[:2]) - before) / n
                    print(f"dev server, SQLite {'in memory' if in_memory else 'file (WAL)'}: {per:.2f} ms of CPU per "
                          "workflow (2 local activities, 3 transitions)", flush=True)
        finally:
            proc.kill()


async def statement(n: int) -> None:
    import sqlalchemy as sa
    from psycopg_pool import AsyncConnectionPool

    from gymflow.kernel.store.db import make_engine, make_sessionmaker, migrate
    from gymflow.kernel.store.urls import psycopg_url

    stack = LocalStack(Path(tempfile.mkdtemp()))
    url = stack._start_postgres()  # noqa: SLF001 - Postgres alone
    try:
        migrate(url)
        engine = make_engine(url, pre_ping=False).execution_options(isolation_level="AUTOCOMMIT")
        sessions = make_sessionmaker(engine)
        text = sa.text("INSERT INTO runs (id, env, model) VALUES (:id, 'e', 'm') ON CONFLICT DO NOTHING RETURNING id")
        raw = "INSERT INTO runs (id, env, model) VALUES (%s, 'e', 'm') ON CONFLICT DO NOTHING RETURNING id"

        async def session_call(i: int) -> None:
            async with sessions() as s:
                await s.scalar(text, {"id": f"s{i}"})

        async def connection_call(i: int) -> None:
            async with engine.connect() as c:
                await c.scalar(text, {"id": f"c{i}"})

        pool = AsyncConnectionPool(psycopg_url(url), min_size=2, max_size=10, open=False, kwargs={"autocommit": True})
        await pool.open()

        async def psycopg_call(i: int) -> None:
            async with pool.connection() as c:
                await (await c.execute(raw, (f"p{i}",))).fetchone()

        for _ in range(2):
            await _cpu_per_call("SQLAlchemy AsyncSession, autocommit", session_call, n)
            await _cpu_per_call("SQLAlchemy AsyncConnection", connection_call, n)
            await _cpu_per_call("psycopg_pool connection (prepared after 5 uses)", psycopg_call, n)
        await pool.close()
        await engine.dispose()
    finally:
        stack._stop_postgres()  # noqa: SLF001


async def model_call(n: int) -> None:
    from openai import AsyncOpenAI, DefaultAioHttpClient

    port = free_port()
    mock = subprocess.Popen([sys.executable, "-m", "gymflow.testing.mock_openai", "--port", str(port),
                             "--latency", "0"], stdout=subprocess.DEVNULL)
    try:
        wait_for_port("127.0.0.1", port, 30, mock)
        base = f"http://127.0.0.1:{port}/v1"
        body = {"model": "m", "messages": [{"role": "system", "content": "You are helpful."},
                                           {"role": "user", "content": "What is the weather in SF?"}],
                "tools": [{"type": "function", "function": {
                    "name": "get_weather", "description": "weather",
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]}
        default = AsyncOpenAI(base_url=base, api_key="x", max_retries=0)
        aio = AsyncOpenAI(base_url=base, api_key="x", max_retries=0, http_client=DefaultAioHttpClient())

        def create(client: AsyncOpenAI) -> Callable[[int], Awaitable[Any]]:
            async def call(_: int) -> Any:
                return await client.chat.completions.with_raw_response.create(**body)
            return call

        def post(client: AsyncOpenAI) -> Callable[[int], Awaitable[Any]]:
            async def call(_: int) -> Any:
                response = await client.post("/chat/completions", body=body, cast_to=httpx.Response)
                return await response.aread()
            return call

        for _ in range(2):
            await _cpu_per_call("openai create(), httpx transport", create(default), n)
            await _cpu_per_call("openai post(), httpx transport", post(default), n)
            await _cpu_per_call("openai post(), aiohttp transport (gymflow)", post(aio), n)
        await default.close()
        await aio.close()
    finally:
        mock.kill()


PARTS = {"local_activity": (local_activity, 400), "statement": (statement, 2000), "model_call": (model_call, 600),
         "temporal": (temporal, 300)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("part", choices=sorted(PARTS))
    parser.add_argument("--n", type=int, help="calls (or workflows) per measurement")
    args = parser.parse_args()
    run, n = PARTS[args.part]
    asyncio.run(run(args.n or n))


if __name__ == "__main__":
    main()

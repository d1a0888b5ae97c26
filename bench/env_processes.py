"""What a supervised environment call costs (activities/env_processes.py), against running it in-process and
against pebble's ProcessPool (the library alternative), on trivial single_tool calls:

    python -m bench.env_processes            # 10k calls per variant
    python -m bench.env_processes -n 2000

For each: the worker's CPU per call (this process: the event loop's side), the processes' CPU per call, and the
latency of one call alone (p50/p95), then throughput with 16 calls in flight. Run it twice; the box is noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psutil
from gymflow.activities.env_calls import tool_result
from gymflow.activities.env_processes import EnvProcesses, Limits
from gymflow.environments.registry import get_environment

from gymflow.kernel.wire import ChatMessage, FunctionCall, Task, ToolCall, ToolResult

TASK = Task(id="bench", env="single_tool", messages=(ChatMessage(role="user", content="weather?"),))
CALL = ToolCall(id="c", function=FunctionCall(name="get_weather", arguments='{"city": "SF"}'))


def pebble_call(task_json: str, call_json: str) -> str:
    """What a pebble worker runs per call: the same in-process tool call, the task parsed per call."""
    task, call = Task.model_validate_json(task_json), ToolCall.model_validate_json(call_json)
    env = get_environment(task.env)
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(tool_result(env, task, env.parse_task(task), {}, call)).model_dump_json()
    finally:
        loop.close()


def _children_cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


async def measure(label: str, call: Callable[[], Awaitable[Any]], n: int, pids: Callable[[], list[int]]) -> None:
    for _ in range(200):  # warm up: imports, caches, the task in each process
        await call()
    children = _children_cpu(pids())
    cpu, lat = time.process_time(), []
    for _ in range(n):
        started = time.perf_counter()
        await call()
        lat.append(time.perf_counter() - started)
    cpu, children = time.process_time() - cpu, _children_cpu(pids()) - children
    q = statistics.quantiles(lat, n=20)
    slots = asyncio.Semaphore(16)

    async def one() -> None:
        async with slots:
            await call()

    started = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(n)))
    rate = n / (time.perf_counter() - started)
    print(f"{label:<28} worker CPU {cpu / n * 1e3:6.3f} ms/call  processes CPU {children / n * 1e3:6.3f} ms/call  "
          f"latency p50 {statistics.median(lat) * 1e3:6.3f} ms p95 {q[-1] * 1e3:6.3f} ms  "
          f"{rate:7.0f} calls/s at 16 in flight")


async def main(n: int, size: int) -> None:
    env = get_environment("single_tool")
    data = env.parse_task(TASK)

    async def in_process() -> ToolResult:
        return await tool_result(env, TASK, data, {}, CALL)

    await measure("in-process (the old path)", in_process, n, lambda: [])

    procs = EnvProcesses(size)
    procs.start()
    limits = Limits()

    async def supervised() -> ToolResult:
        return await procs.tool(TASK, {}, CALL, limits)

    try:
        await measure(f"EnvProcesses ({size} procs)", supervised, n, lambda: [p.process.pid for p in procs._procs])
    finally:
        await procs.close()

    try:
        import multiprocessing as mp

        from pebble import ProcessPool
    except ImportError:
        print("pebble not installed (pip install pebble): its row skipped")
        return
    pool = ProcessPool(max_workers=size, context=mp.get_context("forkserver"))
    task_json, call_json = TASK.model_dump_json(), CALL.model_dump_json()

    async def pebble() -> str:
        return await asyncio.wrap_future(pool.schedule(pebble_call, args=(task_json, call_json), timeout=10))

    def pebble_pids() -> list[int]:
        return [c.pid for c in psutil.Process(os.getpid()).children(recursive=True)]

    try:
        await measure(f"pebble.ProcessPool ({size})", pebble, n, pebble_pids)
    finally:
        pool.stop()
        pool.join(timeout=5)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=10_000, help="calls per variant")
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args()
    asyncio.run(main(args.n, args.processes))

"""Throughput of single-turn rollouts through the whole durable path.

Starts the embedded stack, a scripted OpenAI-compatible server (own process, fixed latency) and the three
worker pools (own processes), collects N single-turn rollouts, and prints rollouts/s, Temporal state
transitions per rollout, and CPU-seconds per rollout for the Temporal server, Postgres and each pool.

    python bench/rollout_throughput.py --n 500 --latency 0 --concurrency 200 [--workflow episode]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import yaml

from gymflow.client import GymflowClient
from gymflow.kernel.config import load_settings
from gymflow.kernel.wire import ChatMessage, Task
from workers.local_stack import LocalStack, free_port, wait_for_port

POOLS = ("workflows", "env", "generate")


def cpu_seconds(pid: int, descendants: bool = True) -> float:
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


def postmaster_pid(data_dir: Path) -> int:
    return int((data_dir / "postmaster.pid").read_text().split()[0])


async def run(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="gymflow-bench-"))
    os.chmod(work, 0o755)
    model_port = free_port()
    model = subprocess.Popen([sys.executable, "-m", "gymflow.testing.scripted_openai", "--port", str(model_port),
                              "--latency", str(args.latency)], stdout=subprocess.DEVNULL)
    stack = LocalStack(work / "state", port=free_port(), headless=True)
    addr = stack.start()
    config = work / "gymflow.yaml"
    config.write_text(yaml.safe_dump({
        "temporal": {"address": addr.temporal_address}, "database": {"url": addr.database_url},
        "models": {"policy": {"base_url": f"http://127.0.0.1:{model_port}/v1", "model": "bench",
                              "concurrency": args.concurrency}},
        "pools": {"generate": {"concurrency": args.concurrency}, "env": {"concurrency": 32},
                  "workflows": {"concurrency": args.concurrency}},
        "rollout": {"workflow": args.workflow},
    }))
    workers = {p: subprocess.Popen([sys.executable, "-m", "gymflow.cli.main", "worker", "--pool", p,
                                    "--config", str(config)]) for p in POOLS}
    try:
        wait_for_port("127.0.0.1", model_port, 30)
        settings = load_settings(config, env={})
        client = await GymflowClient.connect(settings)
        await asyncio.sleep(3)  # let pools start polling, so the clock measures steady state
        pids = {"temporal": stack._temporal.pid,  # noqa: SLF001 - the bench owns the stack
                "postgres": postmaster_pid(work / "state" / "postgres"), "scripted model": model.pid,
                **{f"pool {p}": proc.pid for p, proc in workers.items()}}
        before = {k: cpu_seconds(pid) for k, pid in pids.items()} | {"client": cpu_seconds(os.getpid(), False)}
        tasks = [Task(id=f"t{i}", env="single_tool", messages=(ChatMessage(role="user", content=f"q{i}"),))
                 for i in range(args.n)]
        run_id = f"bench-{int(time.time())}"
        t0 = time.monotonic()
        statuses: dict[str, int] = {}
        async for r in client.collect(run_id, tasks, n=1, model="policy", max_in_flight=args.concurrency):
            statuses[r.summary.status] = statuses.get(r.summary.status, 0) + 1
        wall = time.monotonic() - t0
        after = {k: cpu_seconds(pid) for k, pid in pids.items()} | {"client": cpu_seconds(os.getpid(), False)}
        transitions = [w.raw_info.state_transition_count
                       async for w in client.temporal.list_workflows(f"GymflowRun = '{run_id}'")]
        await client.close()
    finally:
        for proc in workers.values():
            proc.terminate()
        for proc in workers.values():
            proc.wait(timeout=30)
        model.terminate()
        stack.stop()

    n = args.n
    print(f"N={n} latency={args.latency}s concurrency={args.concurrency} workflow={args.workflow} "
          f"cores={os.cpu_count()}")
    print(f"statuses: {statuses}")
    print(f"wall: {wall:.1f} s   rollouts/s: {n / wall:.1f}")
    if transitions:
        print(f"state transitions per rollout: {sum(transitions) / len(transitions):.1f} "
              f"(over {len(transitions)} workflows)")
    print("| process | CPU-s total | CPU-ms per rollout |")
    print("|---|---|---|")
    for k in before:
        used = after[k] - before[k]
        print(f"| {k} | {used:.1f} | {1000 * used / n:.1f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--latency", type=float, default=0.0, help="scripted model latency per call, seconds")
    ap.add_argument("--concurrency", type=int, default=200, help="rollouts in flight and generate slots")
    ap.add_argument("--workflow", choices=("classic", "episode"), default="classic",
                    help="classic: RolloutWorkflow; episode: EpisodeWorkflow (episode data by reference)")
    asyncio.run(run(ap.parse_args()))


if __name__ == "__main__":
    main()

"""Rescore throughput beside a fresh collection's verify cost, on the same rollouts and machine.

    python -m bench.rescore --workload math --n 400                  # math_with_judge: math-verify on each answer
    python -m bench.rescore --workload single_tool --n 400 --concurrency 2

Collects `--n` rollouts of the workload on the bench stack (bench/stack.py: embedded Temporal and Postgres, the
three pools, the zero-latency mock model answering right on half the tasks), then rescores the run in this process
(`gymflow.rescore.rescore_run`: each stored episode read from Postgres and verified in the supervised processes).
Reported: rollouts/s of each, CPU seconds per rollout of the collection (every pool but the mock) and of the
rescore (this process and its supervised processes), that per core, and whether every rescored reward equals the
collected one (the verifier did not change).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import resource
import subprocess
import sys
import time
from typing import Any

import psutil

from bench.stack import MOCK_PROCESSES, start_stack
from bench.workloads import collect, tasks_for
from gymflow.kernel.store.scores import version_id


async def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="math", choices=["math", "single_tool", "single_turn"])
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--concurrency", type=int, default=psutil.cpu_count() or 2, help="rescore: episodes at once")
    args = ap.parse_args(argv)
    bench = await start_stack(slow_latency_s=0.0, concurrency=64, correct_fraction=0.5)
    try:
        client = bench.client
        run_id = f"bench-rescore-{args.workload}-{int(time.time())}"
        got = await collect(bench, client, tasks_for(args.workload, args.n, run_id), run_id=run_id, model="mock",
                            in_flight=64)
        collect_cpu = sum(v for k, v in got.cpu_s.items() if k not in MOCK_PROCESSES)
        # In a process of its own: its CPU, and its supervised processes' (reaped by their forkserver, which it
        # reaps), is then this process's children's CPU over the call.
        before, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
        done = subprocess.run([sys.executable, "-m", "gymflow.cli.main", "rescore", run_id, "--name", "bench",
                               "--concurrency", str(args.concurrency), "--config", str(bench.work / "gymflow.yaml")],
                              capture_output=True, text=True, timeout=3600)
        wall, after = time.monotonic() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
        if done.returncode != 0:
            raise SystemExit(f"gymflow rescore failed:\n{done.stdout}{done.stderr}")
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        scored = int(re.search(r"(\d+) scored now", done.stdout).group(1))
        same, differing = await _same_rewards(bench.database_url, run_id)
        rows: list[tuple[str, Any, Any, Any]] = [
            ("collect (generate + tools + verify + store)", f"{got.rate:.1f}", f"{collect_cpu / got.n * 1000:.1f}",
             f"{got.n / collect_cpu:.1f}" if collect_cpu else "-"),
            (f"rescore (start, read + verify + store, --concurrency {args.concurrency})", f"{scored / wall:.1f}",
             f"{cpu / max(scored, 1) * 1000:.1f}", f"{scored / cpu:.1f}" if cpu else "-"),
        ]
        print(f"workload {args.workload}, {got.n} rollouts ({got.statuses}), {psutil.cpu_count()} cores")
        print("| | rollouts/s | CPU ms per rollout | rollouts per CPU second (per core) |")
        print("|---|---|---|---|")
        for row in rows:
            print("| " + " | ".join(str(c) for c in row) + " |")
        print(f"rescored {scored} rollouts in {wall:.1f} s; rewards equal to the collected ones: {same}")
        for row in differing:
            print("  differs:", row)
    finally:
        await bench.close()


async def _same_rewards(database_url: str, run_id: str) -> str:
    import psycopg

    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        cur = await conn.execute(
            "SELECT count(*), count(*) FILTER (WHERE r.reward IS NOT DISTINCT FROM s.reward) FROM rollout_rows r "
            "JOIN rescored s ON s.rollout_id = r.id AND s.score_version = %s WHERE r.run_id = %s",
            (version_id(run_id, "bench"), run_id))
        total, same = await cur.fetchone()
        cur = await conn.execute(
            "SELECT r.id, r.reward, s.reward, s.failure_type, left(r.score_details::text, 200), "
            "left(s.details::text, 200) FROM rollout_rows r JOIN rescored s ON s.rollout_id = r.id AND "
            "s.score_version = %s WHERE r.run_id = %s AND r.reward IS DISTINCT FROM s.reward LIMIT 5",
            (version_id(run_id, "bench"), run_id))
        differing = await cur.fetchall()
    return f"{same} of {total}", differing


if __name__ == "__main__":
    asyncio.run(main())

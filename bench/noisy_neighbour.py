"""Noisy neighbours: 200 normal single-tool rollouts alone, then the same 200 beside 5 hostile rollouts, on one
stack; the normal rollouts' p95 latency with the hostile ones over their p95 alone (target <= 1.5x).

    python -m bench.noisy_neighbour                 # one pair (alone, beside), zero-latency mock
    python -m bench.noisy_neighbour --pairs 2 --n 200

The hostile rollouts, each started first and in flight with all the normal ones (the mock model calls the first
tool offered, with the schema's default as the argument, so each episode makes the hostile call):
- regex: workplace_assistant's `company_directory_find_email_address` with `name` = `(.*)*(.*)*Q` (a catastrophic
  regex against every directory address; the tool is offered alone, with that default);
- spin, allocate, print, hang_verify: bench/hostile_env.py (a pure-Python busy loop; 3 GB written; printing
  without end; a verifier blocked in time.sleep), each holding for at most 120 s, so the run ends even where
  nothing stops them.
- brackets: issue 32's attack, `--brackets` (default 12) instruction_following rollouts whose reply is
  `"[" * 99_000` (the mock's `mock: reply [ x99000`) under a placeholder check (once a quadratic regex); verified
  on the env pool, with `--normal verify` beside normal mcqa and instruction_following rollouts verified there too.
The others run where gymflow places in-process environments by default (placement local: the workflow pool).
The stack is bench.stack's (the pools as `gymflow worker` processes with bench/hostile_env.py registered).

    python -m bench.noisy_neighbour --normal verify --hostile brackets --n 60   # issue 32's noisy neighbour
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from bench import hostile_env
from bench.runs import _tag
from bench.stack import DEFAULT_PLACEMENT, FAST, BenchStack, start_stack
from bench.workloads import collect, percentile, run_meta, save_and_print, tasks_for
from gymflow.client import GymflowClient
from gymflow.kernel.store.db import make_engine
from gymflow.kernel.wire import ChatMessage, Task, ToolSpec

ROOT = Path(__file__).resolve().parents[1]
REGEX = "(.*)*(.*)*Q"
KINDS = ("regex", "spin", "allocate", "print", "hang_verify", "brackets")
DEFAULT_KINDS = KINDS[:5]
PLACEHOLDERS = {"instruction_id_list": ["detectable_content:number_placeholders"],
                "kwargs": [{"num_placeholders": 2}], "prompt": "p"}
WARMUP = 40


def _kind(task_id: str) -> str:
    return task_id.rsplit("-hostile-", 1)[1].split("-")[0]


def verify_tasks(n: int, tag: str) -> list[Task]:
    """Normal rollouts verified on the env pool: mcqa and instruction_following in turn."""
    mcqa = {"options": [{k: f"option {k}"} for k in "ABCD"], "expected_answer": "B"}
    return [Task(id=f"{tag}-{i}", env="mcqa", messages=(ChatMessage(role="user", content=f"Q{i}?"),), data=mcqa)
            if i % 2 else Task(id=f"{tag}-{i}", env="instruction_following",
                               messages=(ChatMessage(role="user", content=f"Write [a] and [b], {i}."),),
                               data={"verifier_metadata": PLACEHOLDERS}) for i in range(n)]


def hostile_tasks(tag: str, hold_s: float, kinds: tuple[str, ...] = DEFAULT_KINDS, brackets: int = 12
                  ) -> list[Task]:
    directory = ToolSpec(name="company_directory_find_email_address",
                         description="Finds all email addresses containing the given name (case-insensitive).",
                         parameters={"type": "object", "required": ["name"], "additionalProperties": False,
                                     "properties": {"name": {"type": "string", "default": REGEX}}})
    out = [Task(id=f"{tag}-hostile-regex", env="workplace_assistant", tools=(directory,),
                messages=(ChatMessage(role="user", content=f"What is the email address of {REGEX}?"),),
                data={"ground_truth": []})]
    for kind, data in (("spin", {"kind": "spin"}), ("allocate", {"kind": "allocate"}), ("print", {"kind": "print"}),
                       ("hang_verify", {"kind": "echo", "hang_verify": True})):
        out.append(Task(id=f"{tag}-hostile-{kind}", env=hostile_env.NAME, data={**data, "hold_s": hold_s},
                        messages=(ChatMessage(role="user", content=f"please {kind}"),)))
    out += [Task(id=f"{tag}-hostile-brackets-{i}", env="instruction_following",
                 data={"verifier_metadata": PLACEHOLDERS},
                 messages=(ChatMessage(role="user", content="mock: reply [ x99000"),)) for i in range(brackets)]
    return [t for t in out if _kind(t.id) in kinds]


async def _tool_messages(database_url: str, run_id: str) -> dict[str, str]:
    """task id -> the first tool message of its rollout (what the model was told), for the hostile ones."""
    engine = make_engine(database_url, pool_size=1)
    try:
        async with engine.connect() as conn:
            rows = await conn.execute(sa.text("SELECT task_id, transcript FROM rollouts WHERE run_id = :r AND "
                                              "task_id LIKE '%-hostile-%'"), {"r": run_id})
            out = {}
            for task_id, transcript in rows:
                tool = next((m for m in transcript or [] if isinstance(m, dict) and m.get("role") == "tool"), None)
                out[task_id] = str((tool or {}).get("content", ""))[:160]
            return out
    finally:
        await engine.dispose()


def _pool_logs(bench: BenchStack) -> int:
    return sum(p.stat().st_size for p in bench.work.glob("pool-*.log"))


async def one_run(bench: BenchStack, n: int, hostile: bool, hold_s: float, kinds: tuple[str, ...],
                  normal_kind: str = "single_tool", brackets: int = 12) -> dict[str, Any]:
    client = GymflowClient(bench.client.temporal, bench.settings, bench.database_url)
    run_id = _tag("noisy" if hostile else "alone")
    normal = tasks_for("single_tool", n, run_id) if normal_kind == "single_tool" else verify_tasks(n, run_id)
    tasks = [*hostile_tasks(run_id, hold_s, kinds, brackets), *normal] if hostile else normal
    latencies: dict[str, float] = {}
    done_at: dict[str, float] = {}  # seconds from the run's start (every rollout starts at once) to its result
    outcomes: dict[str, dict[str, Any]] = {}
    logs_before = _pool_logs(bench)
    bench.sampler.reset_peaks()
    t0 = time.monotonic()
    normal_done_at = None
    try:
        async for r in client.collect(run_id, tasks, n=1, model=FAST, max_in_flight=len(tasks)):
            s = r.summary
            latencies[s.task_id] = s.latency_s
            done_at[s.task_id] = time.monotonic() - t0
            if "-hostile-" in s.task_id:
                outcomes[s.task_id.rsplit("-hostile-", 1)[1]] = {
                    "status": s.status, "failure_type": s.failure_type, "masked": s.masked, "reward": s.reward,
                    "latency_s": round(s.latency_s, 2), "done_s": round(done_at[s.task_id], 2),
                    "tool_calls": s.tool_calls, "_id": s.task_id}
            elif sum(1 for k in latencies if "-hostile-" not in k) == n:
                normal_done_at = time.monotonic() - t0
    finally:
        await client.close()
    wall = time.monotonic() - t0
    if hostile:
        told = await _tool_messages(bench.database_url, run_id)
        for o in outcomes.values():
            o["tool_message"] = told.get(o.pop("_id"), "")
    normal_lat = [v for k, v in latencies.items() if "-hostile-" not in k]
    normal_done = [v for k, v in done_at.items() if "-hostile-" not in k]
    return {"hostile": hostile, "n_normal": len(normal_lat), "wall_s": round(wall, 1),
            "normal_done_s": round(normal_done_at or wall, 1),
            "normal_p50_s": percentile(normal_done, 50), "normal_p95_s": percentile(normal_done, 95),
            "normal_max_s": max(normal_done) if normal_done else None,
            "normal_latency_p50_s": percentile(normal_lat, 50), "normal_latency_p95_s": percentile(normal_lat, 95),
            "hostile_outcomes": outcomes,
            "pool_log_bytes": _pool_logs(bench) - logs_before,
            "peak_pss_mib": {k: round(v / 2**20) for k, v in bench.sampler.peak.items() if not k.startswith("mock")}}


async def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    hostile_env.install()  # the client lists installed environments before a collection
    bench = await start_stack(slow_latency_s=1.0, concurrency=args.n + 16, generate=args.generate,
                              workflow_procs=args.workflow_procs, install="bench.hostile_env:install",
                              pool_env={"GYMFLOW_ENV_PROCESSES": str(args.env_processes)} if args.env_processes
                              else None)
    out = []
    try:
        warm = GymflowClient(bench.client.temporal, bench.settings, bench.database_url)
        try:
            tag = _tag("warmup")
            await collect(bench, warm, tasks_for("single_tool", WARMUP, tag), run_id=tag, model=FAST,
                          in_flight=WARMUP)
        finally:
            await warm.close()
        for pair in range(1, args.pairs + 1):
            for hostile in (False, True):
                print(f"pair {pair}: {args.n} normal rollouts{' + hostile' if hostile else ' alone'}",
                      file=sys.stderr, flush=True)
                out.append(await one_run(bench, args.n, hostile, args.hold_s, args.hostile, args.normal,
                                         args.brackets) | {"pair": pair})
    finally:
        await bench.close()
    return out


def _f(v: Any, digits: int = 2) -> str:
    return "-" if v is None else f"{v:,.{digits}f}" if isinstance(v, float) else str(v)


def report(runs: list[dict[str, Any]]) -> str:
    lines = ["| pair | run | normal p50 s | normal p95 s | normal max s | workflow `latency_s` p50 / p95 | wall s "
             "| pool log bytes | peak PSS MiB, workflow pool |", "|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        what = f"{r['n_normal']} + {len(r['hostile_outcomes'])} hostile" if r["hostile"] else f"{r['n_normal']} alone"
        lines.append(f"| {r['pair']} | {what} | {_f(r['normal_p50_s'])} "
                     f"| {_f(r['normal_p95_s'])} | {_f(r['normal_max_s'])} | {_f(r.get('normal_latency_p50_s'))} / "
                     f"{_f(r.get('normal_latency_p95_s'))} | {r['wall_s']} "
                     f"| {r['pool_log_bytes']:,} | {r['peak_pss_mib'].get('pool workflows')} |")
    lines += ["", "Normal p50/p95/max: seconds from the run's start (all its rollouts start at once) to each result "
                  "at the client, verification and persistence included; the workflow's own `latency_s` stops "
                  "before verification.",
              "", "| pair | hostile | status | failure / masked | reward | result at s | what the model was told |",
              "|---|---|---|---|---|---|---|"]
    for r in runs:
        for kind, o in r["hostile_outcomes"].items():
            told = o.get("tool_message", "").replace("|", "\\|").replace("\n", " ")
            at = o.get("done_s", o["latency_s"])
            lines.append(f"| {r['pair']} | {kind} | {o['status']} | {o['failure_type'] or '-'}"
                         f"{' (masked)' if o['masked'] else ''} | {_f(o['reward'], 1)} | {at} | {told} |")
    ratios = []
    for pair in sorted({r["pair"] for r in runs}):
        alone = next(r for r in runs if r["pair"] == pair and not r["hostile"])
        noisy = next(r for r in runs if r["pair"] == pair and r["hostile"])
        if alone["normal_p95_s"] and noisy["normal_p95_s"]:
            ratios.append(noisy["normal_p95_s"] / alone["normal_p95_s"])
    if ratios:
        lines += ["", f"normal rollouts' p95 latency, beside the hostile ones / alone: "
                      f"{', '.join(f'{x:.2f}x' for x in ratios)} (target <= 1.5x: "
                      f"{'met' if max(ratios) <= 1.5 else 'missed'})"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.noisy_neighbour", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=200, help="normal single-tool rollouts per run")
    ap.add_argument("--pairs", type=int, default=1, help="(alone, beside the hostile ones), this many times")
    ap.add_argument("--hold-s", type=float, default=120.0, help="the most any hostile call holds on its own")
    ap.add_argument("--generate", choices=("pool", "local"), default=DEFAULT_PLACEMENT)
    ap.add_argument("--workflow-procs", type=int, default=1)
    ap.add_argument("--hostile", type=lambda v: tuple(k for k in v.split(",") if k), default=DEFAULT_KINDS,
                    help=f"which hostile rollouts, comma-separated, of {','.join(KINDS)} (default: "
                         f"{','.join(DEFAULT_KINDS)})")
    ap.add_argument("--normal", choices=("single_tool", "verify"), default="single_tool",
                    help="the normal rollouts: single-tool episodes, or mcqa / instruction_following verified on "
                         "the env pool")
    ap.add_argument("--brackets", type=int, default=12, help="hostile rollouts of the brackets kind")
    ap.add_argument("--env-processes", type=int, help="supervised environment processes per pool process "
                    "(GYMFLOW_ENV_PROCESSES; default: gymflow's, one per core, at least 2)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if not args.hostile or set(args.hostile) - set(KINDS):
        ap.error(f"--hostile: one or more of {', '.join(KINDS)}")
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("temporalio").setLevel(logging.ERROR)
    meta = run_meta("bench.noisy_neighbour", argv)
    runs = asyncio.run(measure(args))
    out = args.json or ROOT / "bench" / "results" / f"{time.strftime('%Y%m%d-%H%M%S')}-noisy-neighbour.json"
    save_and_print(out, meta, runs, report(runs))


if __name__ == "__main__":
    main()

"""`python -m bench`: gymflow's benchmarks against the shipped mock model (gymflow/testing/mock_openai.py).

    python -m bench all [--quick] [--scale 20000] [--generate local|pool]
    python -m bench single_tool --n 300 --generate pool         # or single_turn, math
    python -m bench overhead | curve | scale                    # one part of `all`
    python -m bench compare bench/results/A.json bench/results/B.json
    python -m bench report bench/results/A.json [--out FILE]     # the markdown again, from a results file

`all` runs each workload at --n (1000; --quick 200), the low-load overhead run (20 rollouts, 1 in flight), the
latency curve (1 s model latency at 100/400/1000 in flight, N = 3x in flight capped by time) and the scaling
run (--scale, default 5000, sampled every 1000; --quick 1000 every 200). It writes markdown (--out,
docs/benchmarks-latest.md) and JSON (bench/results/, gitignored) for `compare`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import report, runs
from bench.stack import start_stack
from bench.workloads import WORKLOADS, dumps
from gymflow.kernel.config import ModelConfig

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
DEFAULT_PLACEMENT = ModelConfig.model_fields["placement"].default
COMMANDS = ("all", *WORKLOADS, "overhead", "curve", "scale", "compare", "report")


def _commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head or 'unknown'}{' (uncommitted changes)' if dirty else ''}"


def _positive_ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=COMMANDS)
    ap.add_argument("files", nargs="*", help="compare: the before and after JSON files; report: one")
    ap.add_argument("--quick", action="store_true", help="smaller N everywhere (a harness check, not a result)")
    ap.add_argument("--n", type=int, help="rollouts per workload (default 1000, --quick 200)")
    ap.add_argument("--in-flight", type=int, default=200, help="rollouts in flight for the workloads and scaling")
    ap.add_argument("--generate", choices=("pool", "local"), default=DEFAULT_PLACEMENT,
                    help="where generation runs: local activities in the workflow pool, or the generate pool "
                         f"(models.<name>.placement; default: gymflow's own default, {DEFAULT_PLACEMENT})")
    ap.add_argument("--workflow-procs", type=int, default=1, help="processes in the workflow pool")
    ap.add_argument("--correct-fraction", type=float, default=0.5,
                    help="share of tasks the mock answers right (seeded, per task); each workload asserts it")
    ap.add_argument("--seed", type=int, default=0, help="the mock's seed for which tasks are right")
    ap.add_argument("--overhead-n", type=int, default=20)
    ap.add_argument("--latency", type=float, default=1.0, help="model latency of the latency curve, s")
    ap.add_argument("--curve", type=_positive_ints, default=[100, 400, 1000], help="in-flight counts, e.g. 100,400")
    ap.add_argument("--curve-cap-s", type=float, help="time cap per curve point (default 120, --quick 30)")
    ap.add_argument("--curve-workload", choices=WORKLOADS, default="single_tool")
    ap.add_argument("--scale", type=int, help="rollouts in the scaling run (default 5000, --quick 1000)")
    ap.add_argument("--window", type=int, help="scaling sample every this many completions (1000; --quick 200)")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks-latest.md")
    ap.add_argument("--json", type=Path, help="results file (default bench/results/<time>-<command>.json)")
    args = ap.parse_args(argv)
    if args.command == "compare" and len(args.files) != 2:
        ap.error("compare needs two results files: BEFORE.json AFTER.json")
    if args.command == "report" and len(args.files) != 1:
        ap.error("report needs one results file")
    if args.command not in ("compare", "report") and args.files:
        ap.error(f"unexpected arguments {args.files} for {args.command}")
    args.n = args.n or (200 if args.quick else 1000)
    args.scale = args.scale or (1000 if args.quick else 5000)
    args.window = args.window or (200 if args.quick else 1000)
    args.curve_cap_s = args.curve_cap_s or (30.0 if args.quick else 120.0)
    for name in ("n", "in_flight", "overhead_n", "scale", "window", "workflow_procs"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if not 0.0 <= args.correct_fraction <= 1.0:
        ap.error("--correct-fraction must be in [0, 1]")
    if args.latency <= 0:
        ap.error("--latency must be > 0")
    return args


async def measure(args: argparse.Namespace, results: dict[str, Any]) -> None:
    cmd = args.command
    concurrency = max(args.in_flight, *(args.curve if cmd in ("all", "curve") else [1])) + 8
    bench = await start_stack(slow_latency_s=args.latency, concurrency=concurrency, generate=args.generate,
                              workflow_procs=args.workflow_procs, correct_fraction=args.correct_fraction,
                              seed=args.seed)
    notes = results["meta"]["notes"]
    try:
        if cmd in ("all", *WORKLOADS):
            results["workloads"] = {}
            for name in (WORKLOADS if cmd == "all" else (cmd,)):
                print(f"workload {name}: {args.n} rollouts, {args.in_flight} in flight", file=sys.stderr)
                results["workloads"][name] = await runs.workload(bench, name, n=args.n, in_flight=args.in_flight)
        if cmd in ("all", "overhead"):
            print(f"overhead: {args.overhead_n} rollouts, 1 in flight", file=sys.stderr)
            results["overhead"] = await runs.overhead(bench, n=args.overhead_n)
        if cmd in ("all", "curve"):
            measured = results.get("workloads", {}).get(args.curve_workload, {}).get("rollouts_per_s")
            if measured is None:
                notes.append("latency curve: no zero-latency rate measured first, so N was not capped by time")
            results["curve"] = await runs.latency_curve(
                bench, points=args.curve, latency_s=args.latency, name=args.curve_workload,
                capacity=measured, cap_s=args.curve_cap_s)
            if any(p["capped_by_time"] for p in results["curve"]["points"]):
                notes.append(f"latency curve: N capped so each point takes about {args.curve_cap_s:g} s at the "
                             "measured zero-latency rate (3x in flight would take longer on this machine)")
        if cmd in ("all", "scale"):
            results["scaling"] = await runs.scaling(bench, n=args.scale, window=min(args.window, args.scale),
                                                    in_flight=args.in_flight)
        results["peak_rss_mib_whole_run"] = {k: v / 2**20 for k, v in bench.sampler.peak.items()}
    finally:
        await bench.close()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.command == "compare":
        before, after = (json.loads(Path(f).read_text()) for f in args.files)
        print(report.compare(before, after), end="")
        return
    if args.command == "report":
        args.out.write_text(report.render(json.loads(Path(args.files[0]).read_text())))
        print(f"wrote {args.out}", file=sys.stderr)
        return
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("temporalio").setLevel(logging.ERROR)
    results: dict[str, Any] = {"meta": {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "command": " ".join(["python -m bench",
                                                                                        *(argv or sys.argv[1:])]),
        "cores": os.cpu_count(), "load_at_start": ", ".join(f"{v:.1f}" for v in os.getloadavg()),
        "commit": _commit(), "quick": args.quick,
        "generate": args.generate, "workflow_procs": args.workflow_procs, "notes": []}}
    if args.quick:
        results["meta"]["notes"].append("--quick: small N; a check of the harness, not a result")
    started = time.monotonic()
    asyncio.run(measure(args, results))
    results["meta"]["duration_s"] = round(time.monotonic() - started, 1)
    out_json = args.json or RESULTS / f"{time.strftime('%Y%m%d-%H%M%S')}-{args.command}.json"
    out_json.parent.mkdir(parents=True, exist_ok=True)
    out_json.write_text(dumps(results) + "\n")
    markdown = report.render(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(markdown)
    print(markdown)
    print(f"wrote {args.out} and {out_json} in {results['meta']['duration_s']:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()

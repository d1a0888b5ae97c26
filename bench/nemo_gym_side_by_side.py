"""gymflow and NeMo Gym 0.7.0 side by side on the same single-tool rows, back to back on one machine.

    python -m bench.nemo_gym_side_by_side                      # 2 pairs, 1000 rollouts, 1000 in flight
    python -m bench.nemo_gym_side_by_side --pairs 1 --n 200    # a harness check

Both sides talk to the same deterministic zero-latency mock (gymflow/testing/mock_openai.py, Chat Completions)
and run the same rows: NeMo Gym's example_single_tool_call (../shared/data/nemo_gym/), cycled up to --n.

gymflow: `bench.stack` (Temporal dev server, embedded Postgres, the three pools as `gymflow worker` processes,
one process each unless --workflow-procs; models placed as gymflow's default unless --generate) and
`bench.runs.workload` (40 unmeasured rollouts first). Counted: every process but the mock.

NeMo Gym: its own launcher with its defaults, `gym env start --resources-server example_single_tool_call
--model-type vllm_model` (the vllm_model server speaks Chat Completions to the mock), then `gym eval run
--no-serve --agent example_single_tool_call_simple_agent --concurrency IN_FLIGHT`: 40 unmeasured rollouts,
then --n measured. Every server runs from the one NeMo Gym venv (--nemo-python; `skip_venv_if_present` with
per-server `.venv` links to it: NeMo Gym would otherwise build a venv per server with uv). Counted: the
`gym env start` process tree (head server, its Ray cluster, the four servers) and the `gym eval run` process,
from its "Collecting rollouts" bar appearing to its "Finished N / N rollouts" line (imports before and the
aggregate metrics and health checks after are left out, as gymflow's client start-up is).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
from gymflow.workers.local_stack import free_port, wait_for_port

from bench import hostile_env, runs
from bench.stack import DEFAULT_PLACEMENT, start_stack
from bench.workloads import SHARED, run_meta, save_and_print

ROOT = Path(__file__).resolve().parents[1]
NEMO_PYTHON = os.environ.get("GYMFLOW_NEMO_GYM_PYTHON") or str(ROOT / ".nemo313" / "bin" / "python")
TOOL_SERVER = "example_single_tool_call"  # its rows are in ../shared/data; any other server's from NeMo Gym's wheel
SERVER_DIRS = ("responses_api_agents/simple_agent", "responses_api_models/vllm_model",
               "environment_servers/legacy_agent")
HEAD_PORT = 11000  # NeMo Gym's default head server port; `gym eval run --no-serve` finds the servers there
WARMUP = 40
START_TIMEOUT_S = 240


# ---- gymflow --------------------------------------------------------------------------------------------------


def rows_file(server: str, python: str) -> Path:
    if server == TOOL_SERVER:
        return SHARED / TOOL_SERVER / "example.jsonl"
    return _nemo_layout(python)[0] / "resources_servers" / server / "data" / "example.jsonl"


def adapter_tasks(server: str, python: str) -> Any:
    """`(n, tag) -> tasks`: the server's rows in gymflow's `nemo_gym` environment, which runs NeMo Gym's own
    server code for them (the managed server: one per env-pool process)."""
    from gymflow.data.datasets import load_jsonl

    rows = [json.loads(line) for line in rows_file(server, python).read_text().splitlines() if line.strip()]
    named = Path(tempfile.mkdtemp(prefix="adapter-rows-")) / f"{server}.jsonl"
    named.write_text("".join(json.dumps({**row, "resources_server": server}) + "\n" for row in rows))
    base, errors = load_jsonl(named, env="nemo_gym")
    if errors or not base:
        raise SystemExit(f"{server}: its rows do not load ({errors[:1]})")

    def make(n: int, tag: str) -> list[Any]:
        return [base[i % len(base)].model_copy(update={"id": f"{tag}-{i}"}) for i in range(n)]
    return make


async def gymflow_run(n: int, in_flight: int, generate: str, workflow_procs: int, direct: bool = False,
                      adapter: str | None = None, python: str = NEMO_PYTHON, env_placement: str | None = None
                      ) -> dict[str, Any]:
    """`direct`: the rows in bench/hostile_env.py's single_tool_direct (steps in the worker's loop, no supervised
    process): the baseline of what isolation costs. The pools register it either way, so both stacks match.
    `adapter`: the rows of this NeMo Gym server through the `nemo_gym` environment instead of a native one."""
    hostile_env.install()
    pool_env = {"GYMFLOW_NEMO_GYM_PYTHON": python} if adapter else None
    bench = await start_stack(slow_latency_s=1.0, concurrency=in_flight + 8, generate=generate,
                              workflow_procs=workflow_procs, install="bench.hostile_env:install", pool_env=pool_env,
                              environments={"nemo_gym": {"placement": env_placement}} if env_placement else None)
    try:
        got = await runs.workload(bench, "single_tool", n=n, in_flight=in_flight,
                                  env=hostile_env.DIRECT if direct else None,
                                  tasks_of=adapter_tasks(adapter, python) if adapter else None)
    finally:
        await bench.close()
    return got | {"system": "gymflow", "workflow_procs": workflow_procs, "direct": direct, "adapter": adapter,
                  "env_placement": env_placement}


# ---- NeMo Gym -------------------------------------------------------------------------------------------------


def _nemo_layout(python: str) -> tuple[Path, Path]:
    """(NeMo Gym's site-packages, its venv prefix)."""
    code = ("import sys, pathlib, resources_servers as r; print(pathlib.Path(list(r.__path__)[0]).parent); "
            "print(sys.prefix)")
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout
    site, prefix = out.split()
    return Path(site), Path(prefix)


def _venv_links(root: Path, prefix: Path, dirs: tuple[str, ...]) -> None:
    for d in dirs:
        (root / d).mkdir(parents=True, exist_ok=True)
        link = root / d / ".venv"
        if not link.exists():
            link.symlink_to(prefix)


def _rows(path: Path, n: int, source: Path) -> None:
    base = [line for line in source.read_text().splitlines() if line.strip()]
    path.write_text("".join(base[i % len(base)] + "\n" for i in range(n)))


class _Output(threading.Thread):
    """Reads a process's merged stdout/stderr, keeps it in a log, and timestamps the first match of each marker."""

    def __init__(self, proc: subprocess.Popen, log: Path, markers: dict[str, re.Pattern[bytes]],
                 on_mark: Any = None) -> None:
        super().__init__(daemon=True)
        self.proc, self.log, self.markers, self.on_mark = proc, log, markers, on_mark
        self.seen: dict[str, float] = {}
        self.tail = b""
        self.events = {k: threading.Event() for k in markers}

    def run(self) -> None:
        assert self.proc.stdout is not None
        with self.log.open("ab") as out:
            while chunk := self.proc.stdout.read1(65536):
                now = time.monotonic()
                out.write(chunk)
                self.tail = (self.tail + chunk)[-200_000:]
                for name, pattern in self.markers.items():
                    if name not in self.seen and pattern.search(self.tail):
                        self.seen[name] = now
                        if self.on_mark is not None:
                            self.on_mark(name)
                        self.events[name].set()


def _proc_cpu(pid: int) -> dict[int, tuple[str, float]]:
    """CPU seconds and a label for a process and each live descendant."""
    out: dict[int, tuple[str, float]] = {}
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return out
    for p in procs:
        try:
            t = p.cpu_times()
            cmd = p.cmdline()
            label = _label(cmd, p.cwd() if "app.py" in cmd else "")
            out[p.pid] = (label, t.user + t.system)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return out


def _label(cmd: list[str], cwd: str) -> str:
    if "app.py" in cmd:
        return "server " + "/".join(Path(cwd).parts[-2:])
    text = " ".join(cmd)
    if "gym env start" in text or text.endswith("env start"):
        return "head (gym env start)"
    if "eval run" in text:
        return "client (gym eval run)"
    return "ray"


class NemoGym:
    """`gym env start` and the mock, for one measured collection."""

    def __init__(self, python: str, work: Path, server: str = TOOL_SERVER) -> None:
        self.python, self.work, self.server = python, work, server
        self.gym = str(Path(python).parent / "gym")
        self.site, prefix = _nemo_layout(python)
        self.venvs = work / "venvs"
        _venv_links(self.venvs, prefix, (*SERVER_DIRS, f"resources_servers/{server}"))
        self.mock_port = free_port()
        self.mock = subprocess.Popen([sys.executable, "-m", "gymflow.testing.mock_openai", "--port",
                                      str(self.mock_port), "--latency", "0"], stdout=subprocess.DEVNULL)
        self.env: subprocess.Popen | None = None
        self.pids: set[int] = set()

    def start(self) -> None:
        wait_for_port("127.0.0.1", self.mock_port, 60, self.mock)
        if _listening(HEAD_PORT):
            raise SystemExit(f"port {HEAD_PORT} (NeMo Gym's head server) is taken: stop the other NeMo Gym first")
        self.env = subprocess.Popen(
            [self.gym, "env", "start", "--resources-server", self.server, "--model-type", "vllm_model",
             "--model", "mock", "--model-url", f"http://127.0.0.1:{self.mock_port}/v1", "--model-api-key", "dummy",
             "++skip_venv_if_present=true", f"++uv_venv_dir={self.venvs}"],
            cwd=self.work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        reader = _Output(self.env, self.work / "gym-env-start.log",
                         {"ready": re.compile(rb"All \d+ / \d+ servers ready")})
        reader.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not reader.events["ready"].wait(1):
            if self.env.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"gym env start did not get ready (see {self.work / 'gym-env-start.log'})")
        self.pids |= set(_proc_cpu(self.env.pid))

    def collect(self, n: int, in_flight: int, tag: str) -> dict[str, Any]:
        assert self.env is not None
        rows, out = self.work / f"{tag}.jsonl", self.work / f"{tag}-rollouts.jsonl"
        _rows(rows, n, rows_file(self.server, self.python))
        reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
        env_before, launched = _proc_cpu(self.env.pid), time.monotonic()
        proc = subprocess.Popen([self.gym, "eval", "run", "--no-serve", "--agent", f"{self.server}_simple_agent",
                                 "--input", str(rows),
                                 "--output", str(out), "--concurrency", str(in_flight)],
                                cwd=self.work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
        samples: dict[str, dict[int, tuple[str, float]]] = {}

        def on_mark(name: str) -> None:  # on the reader thread, right when the line arrives
            samples[name] = _proc_cpu(self.env.pid) | _proc_cpu(proc.pid)

        reader = _Output(proc, self.work / f"{tag}-eval.log", {
            "start": re.compile(rb"Collecting rollouts:"),
            "done": re.compile(rb"Finished %d / %d rollouts" % (n, n))}, on_mark)
        reader.start()
        rc = proc.wait(timeout=3600)
        whole_wall = time.monotonic() - launched
        env_after = _proc_cpu(self.env.pid)
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)  # the eval process, reaped just now (and its children)
        eval_cpu = ru.ru_utime + ru.ru_stime - reaped.ru_utime - reaped.ru_stime
        servers_cpu = sum(c - (env_before[pid][1] if pid in env_before else 0.0) for pid, (_, c) in env_after.items())
        reader.join(timeout=30)
        self.pids |= set(_proc_cpu(self.env.pid))
        if rc != 0 or "done" not in reader.seen:
            raise RuntimeError(f"gym eval run exited {rc} without finishing {n} rollouts (see {tag}-eval.log)")
        wall = reader.seen["done"] - reader.seen["start"]
        before, after = samples["start"], samples["done"]
        by: dict[str, float] = {}
        for pid, (label, cpu) in after.items():
            by[label] = by.get(label, 0.0) + cpu - (before[pid][1] if pid in before else 0.0)
        rewards, statuses = [], 0
        for line in out.read_text().splitlines():
            r = json.loads(line)
            statuses += 1
            if isinstance(r.get("reward"), (int, float)):
                rewards.append(float(r["reward"]))
        bar = re.findall(rb"\| (\d+)/(\d+) \[[^\]]*?, ([\d.]+)it/s\]", reader.tail)
        total = sum(by.values())
        return {"system": "NeMo Gym 0.7.0", "n": n, "in_flight": in_flight, "wall_s": wall,
                "rollouts_per_s": n / wall, "tqdm_rollouts_per_s": float(bar[-1][2]) if bar else None,
                "rows": statuses, "mean_reward": sum(rewards) / len(rewards) if rewards else None,
                "cpu_s_per_1000_total": 1000 * total / n,
                # The whole `gym eval run` (its imports, start-up, aggregate metrics and health checks included):
                "whole_eval_wall_s": whole_wall, "whole_eval_rollouts_per_s": n / whole_wall,
                "whole_eval_cpu_s_per_1000": 1000 * (eval_cpu + servers_cpu) / n,
                "whole_eval_client_cpu_s": eval_cpu,
                "cpu_s_per_1000": {k: round(1000 * v / n, 2) for k, v in sorted(by.items())}}

    def close(self) -> None:
        if self.env is not None and self.env.poll() is None:
            self.pids |= set(_proc_cpu(self.env.pid))
            self.env.send_signal(signal.SIGINT)  # NeMo Gym stops its servers and its Ray cluster on SIGINT
            try:
                self.env.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.env.pid, signal.SIGKILL)
                self.env.wait(timeout=10)
        for pid in self.pids:  # Ray's agents outlive the raylet (reparented to init): ours, by pid
            try:
                psutil.Process(pid).kill()
            except psutil.NoSuchProcess:
                pass
        self.mock.terminate()
        self.mock.wait(timeout=10)


def _listening(port: int) -> bool:
    try:
        httpx.get(f"http://127.0.0.1:{port}/", timeout=1)
    except httpx.HTTPError:
        return False
    return True


def nemo_run(python: str, n: int, in_flight: int, server: str = TOOL_SERVER) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="nemo-gym-bench-"))
    gym = NemoGym(python, work, server)
    try:
        gym.start()
        gym.collect(WARMUP, WARMUP, "warmup")
        return gym.collect(n, in_flight, "measured") | {"work": str(work)}
    finally:
        gym.close()


# ---- the table ------------------------------------------------------------------------------------------------


def _f(v: Any, digits: int = 1) -> str:
    return "-" if v is None else f"{v:,.{digits}f}" if isinstance(v, float) else str(v)


def table(results: list[dict[str, Any]]) -> str:
    lines = ["| pair | system | rollouts/s | CPU-s per 1000 | state transitions | p50 / p95 latency s | statuses "
             "| CPU-s per 1000 by process |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        procs = ", ".join(f"{k} {v:.1f}" for k, v in r["cpu_s_per_1000"].items()
                          if v >= 0.05 and not k.startswith("mock"))
        if r["system"] == "gymflow":
            name = f"gymflow (`placement: {r['generate']}`, {r['workflow_procs']} workflow-pool process" \
                   f"{'es' if r['workflow_procs'] > 1 else ''}" \
                   f"{'; through the nemo_gym adapter' if r.get('adapter') else ''}" \
                   f"{', adapter placement ' + r['env_placement'] if r.get('env_placement') else ''}" \
                   f"{'; steps in the loop, no isolation: `single_tool_direct`' if r.get('direct') else ''})"
            lat = f"{_f(r['p50_latency_s'], 2)} / {_f(r['p95_latency_s'], 2)}"
            st = ", ".join(f"{k} {v}" for k, v in r["statuses"].items())
            tr = _f(r["transitions_per_rollout"])
        else:
            name, lat, tr = r["system"], "-", "-"
            st = f"{r['rows']} rows, mean reward {_f(r['mean_reward'], 2)}"
        lines.append(f"| {r['pair']} | {name} | {_f(r['rollouts_per_s'])} | {_f(r['cpu_s_per_1000_total'])} | {tr} "
                     f"| {lat} | {st} | {procs} |")
    g = [r for r in results if r["system"] == "gymflow" and not r.get("direct")]
    ng = [r for r in results if r["system"] != "gymflow"]
    if g and ng:
        rate = min(r["rollouts_per_s"] for r in g) / max(r["rollouts_per_s"] for r in ng), \
            max(r["rollouts_per_s"] for r in g) / min(r["rollouts_per_s"] for r in ng)
        cpu = min(r["cpu_s_per_1000_total"] for r in g) / max(r["cpu_s_per_1000_total"] for r in ng), \
            max(r["cpu_s_per_1000_total"] for r in g) / min(r["cpu_s_per_1000_total"] for r in ng)
        lines += ["", f"gymflow / NeMo Gym: rate {rate[0]:.2f}-{rate[1]:.2f}x (target >= 0.8x), CPU per rollout "
                      f"{cpu[0]:.2f}-{cpu[1]:.2f}x (target <= 1.2x); ranges over every gymflow/NeMo Gym run pairing."]
    whole = [r for r in ng if "whole_eval_cpu_s_per_1000" in r]
    if whole:
        rates = ", ".join(f"{r['whole_eval_rollouts_per_s']:.1f}/s" for r in whole)
        cpus = ", ".join(f"{r['whole_eval_cpu_s_per_1000']:.1f}" for r in whole)
        lines += [f"NeMo Gym over the whole `gym eval run` (its start-up, aggregate metrics and health checks "
                  f"included): {rates} at {cpus} CPU-s per 1000."]
    d = [r for r in results if r.get("direct")]
    if g and d:
        lines += [f"Isolation (supervised environment processes) vs steps in the loop: rate "
                  f"{sum(r['rollouts_per_s'] for r in g) / len(g):.1f} vs "
                  f"{sum(r['rollouts_per_s'] for r in d) / len(d):.1f}/s, CPU-s per 1000 "
                  f"{sum(r['cpu_s_per_1000_total'] for r in g) / len(g):.1f} vs "
                  f"{sum(r['cpu_s_per_1000_total'] for r in d) / len(d):.1f} (means over the runs)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.nemo_gym_side_by_side", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--in-flight", type=int, default=1000)
    ap.add_argument("--pairs", type=int, default=2, help="gymflow then NeMo Gym, this many times")
    ap.add_argument("--generate", choices=("pool", "local"), default=DEFAULT_PLACEMENT)
    ap.add_argument("--workflow-procs", type=int, default=1)
    ap.add_argument("--nemo-python", default=NEMO_PYTHON)
    ap.add_argument("--only", choices=("gymflow", "nemo"), help="one side only")
    ap.add_argument("--with-direct", action="store_true",
                    help="each pair also runs gymflow with the steps in the worker's loop (what isolation costs)")
    ap.add_argument("--server", default=TOOL_SERVER,
                    help="the NeMo Gym resources server both sides run (e.g. mcqa: no tool; its example.jsonl rows)")
    ap.add_argument("--via-adapter", action="store_true",
                    help="gymflow runs the rows through its nemo_gym adapter (NeMo Gym's own server code, managed by "
                         "gymflow) instead of its native environment (required for servers other than "
                         f"{TOOL_SERVER})")
    ap.add_argument("--adapter-placement", choices=("pool", "local"),
                    help="environments.nemo_gym.placement for --via-adapter (default: the environment's own, pool)")
    ap.add_argument("--json", type=Path, help="results file (default bench/results/<time>-side-by-side.json)")
    args = ap.parse_args(argv)
    if args.server != TOOL_SERVER and not args.via_adapter and args.only != "nemo":
        ap.error(f"gymflow has no native environment for {args.server}: add --via-adapter")
    adapter = args.server if args.via_adapter else None
    if not Path(args.nemo_python).exists() and args.only != "gymflow":
        raise SystemExit(f"no NeMo Gym python at {args.nemo_python}: ~/.pyenv/versions/3.13.0/bin/python -m venv "
                         "/work/nemo313 && /work/nemo313/bin/pip install --ignore-requires-python nemo-gym==0.7.0")
    import logging
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("temporalio").setLevel(logging.ERROR)
    meta = run_meta("bench.nemo_gym_side_by_side", argv)
    results: list[dict[str, Any]] = []
    for pair in range(1, args.pairs + 1):
        if args.only != "nemo":
            print(f"pair {pair}: gymflow, {args.n} rollouts, {args.in_flight} in flight", file=sys.stderr, flush=True)
            results.append(asyncio.run(gymflow_run(args.n, args.in_flight, args.generate, args.workflow_procs,
                                                   adapter=adapter, python=args.nemo_python,
                                                   env_placement=args.adapter_placement)) | {"pair": pair})
            if args.with_direct:
                print(f"pair {pair}: gymflow, steps in the loop", file=sys.stderr, flush=True)
                results.append(asyncio.run(gymflow_run(args.n, args.in_flight, args.generate, args.workflow_procs,
                                                       direct=True)) | {"pair": pair})
        if args.only != "gymflow":
            print(f"pair {pair}: NeMo Gym, {args.n} rollouts, {args.in_flight} in flight", file=sys.stderr,
                  flush=True)
            results.append(nemo_run(args.nemo_python, args.n, args.in_flight, args.server) | {"pair": pair})
    out = args.json or ROOT / "bench" / "results" / f"{time.strftime('%Y%m%d-%H%M%S')}-side-by-side.json"
    save_and_print(out, meta, results, table(results))


if __name__ == "__main__":
    main()

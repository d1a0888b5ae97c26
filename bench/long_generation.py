"""Where the line is for a generation placed local (models.<name>.placement: local, the default): one reply that
takes `--reply-s` seconds (10 minutes by default) as a local activity in the workflow pool.

    python -m bench.long_generation                 # a 600 s reply, then a 120 s reply whose worker is killed
    python -m bench.long_generation --reply-s 60 --kill-reply-s 60

It reports what Temporal records while the reply is awaited (the SDK extends the workflow task ~every 8 s:
events and state transitions), and, with the workflow pool killed (kill -9) mid-reply, when the step resumed on
a fresh worker and how many times the model was called (the request is re-sent: its reply was never stored).
Everything real: the embedded stack, `gymflow worker --pool workflows` processes, a scripted OpenAI-compatible
server.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import yaml
from gymflow.workers.local_stack import LocalStack, free_port

from gymflow.client import GymflowClient
from gymflow.kernel.config import load_settings
from gymflow.kernel.wire import ChatMessage, Task
from gymflow.testing.scripted_openai import ScriptedOpenAI, text

ROOT = Path(__file__).resolve().parents[1]


def _worker(config: Path, log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "gymflow.cli.main", "worker", "--pool", "workflows",
                             "--config", str(config)], cwd=ROOT, stdout=log.open("ab"), stderr=subprocess.STDOUT)


async def _history(client: GymflowClient, rollout_id: str) -> tuple[int, int, int]:
    handle = client.temporal.get_workflow_handle(rollout_id)
    history = await handle.fetch_history()
    desc = await handle.describe()
    tasks = sum(1 for e in history.events if e.HasField("workflow_task_completed_event_attributes"))
    return len(history.events), tasks, desc.raw_description.workflow_execution_info.state_transition_count


async def _one(client: GymflowClient, run: str, task_id: str) -> tuple[str, float, str]:
    task = Task(id=task_id, env="single_tool", messages=(ChatMessage(role="user", content="think long"),))
    started = time.monotonic()
    summary = await client.run_rollout(client.make_input(run, task, 0, "policy"))
    return summary.status, time.monotonic() - started, f"{run}/{task_id}/0"


async def main(reply_s: float, kill_reply_s: float, kill_at_s: float) -> None:
    work = Path(tempfile.mkdtemp(prefix="gymflow-longgen-"))
    work.chmod(0o755)  # embedded Postgres runs as its own user when we are root
    with LocalStack(work / "state", port=free_port(), headless=True) as addr, ScriptedOpenAI() as model:
        config = work / "gymflow.yaml"
        longest = max(reply_s, kill_reply_s)
        limits = {"start_to_close_s": 3 * longest, "schedule_to_close_s": 6 * longest, "max_attempts": 3}
        config.write_text(yaml.safe_dump({
            "temporal": {"address": addr.temporal_address}, "database": {"url": addr.database_url},
            "models": {"policy": {"base_url": model.base_url, "model": "slow",
                                  "request_timeout_s": 3 * longest}},
            "rollout": {"max_turns": 2, "limits": {"generate": limits}}}))
        log = work / "worker.log"
        worker = _worker(config, log)
        client = await GymflowClient.connect(load_settings(config))
        run = "longgen-" + uuid.uuid4().hex[:6]
        try:
            model.script(text("done", delay_s=reply_s))
            status, took, rid = await _one(client, run, "long")
            events, tasks, transitions = await _history(client, rid)
            print(f"one {reply_s:.0f} s reply, local: {status} in {took:.0f} s; history {events} events, "
                  f"{tasks} workflow tasks, {transitions} state transitions; model calls {len(model.requests)}")

            model.reset()
            model.script(text("lost with its worker", delay_s=kill_reply_s), text("again", delay_s=kill_reply_s))
            pending = asyncio.create_task(_one(client, run, "killed"))
            await asyncio.sleep(kill_at_s)
            worker.send_signal(signal.SIGKILL)
            worker.wait()
            killed_at = time.monotonic()
            worker = _worker(config, log)
            while len(model.requests) < 2:
                await asyncio.sleep(0.2)
            resent_after = time.monotonic() - killed_at
            status, took, rid = await pending
            events, tasks, transitions = await _history(client, rid)
            print(f"a {kill_reply_s:.0f} s reply, workflow pool killed at {kill_at_s:.0f} s: request re-sent "
                  f"{resent_after:.1f} s after the kill (a fresh worker started at once), {status} in {took:.0f} s; "
                  f"model calls {len(model.requests)}; history {events} events, {transitions} state transitions")
        finally:
            await client.close()
            worker.terminate()
            worker.wait(timeout=30)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reply-s", type=float, default=600.0)
    ap.add_argument("--kill-reply-s", type=float, default=120.0)
    ap.add_argument("--kill-at-s", type=float, default=30.0)
    args = ap.parse_args()
    asyncio.run(main(args.reply_s, args.kill_reply_s, args.kill_at_s))

"""Collect two real runs on the embedded stack and render their report as docs/img/report.png (run A alone)
and docs/img/report-vs.png (A --vs B), plus the HTML files beside them.

The model is the scripted OpenAI server with a per-task difficulty: it calls the tool (reward 1) with a
task-dependent probability, answers without it (reward 0) otherwise, and sometimes fails with a context-length
or a bad-request error, so every plot and the failures table have something to show. Needs Debian `chromium`.

    python bench/report_screenshots.py --tasks 24 --n 8 --out docs/img
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import tempfile
import threading
from pathlib import Path
from typing import Any

import yaml
from gymflow.workers.local_stack import LocalStack, free_port
from gymflow.workers.pools import build_pool
from rich.console import Console

from gymflow.client import GymflowClient
from gymflow.kernel.config import load_settings
from gymflow.kernel.connect import connect_temporal
from gymflow.kernel.wire import ChatMessage, Task
from gymflow.reports.data import load_run, make_linker, store_session
from gymflow.reports.html import render_html
from gymflow.reports.stats import compare_runs
from gymflow.reports.text import render_report
from gymflow.testing.screenshot import screenshot
from gymflow.testing.scripted_openai import Reply, ScriptedOpenAI, context_length_error, http_error, text, tool_call

SKILL = {"model-a": 0.0, "model-b": 0.15}  # B calls the tool 15 points more often on every task
FAIL = {"model-a": 0.06, "model-b": 0.03}


def responder(seed: int) -> Any:
    rng, lock = random.Random(seed), threading.Lock()

    def answer(body: dict[str, Any]) -> Reply:
        messages = body["messages"]
        with lock:
            u, delay = rng.random(), rng.lognormvariate(-1.6, 0.6)
        if messages[-1]["role"] == "tool":
            return text("It is cold there.", delay_s=delay)
        task = int(messages[-1]["content"].split()[-1])
        model = body["model"]
        p = min(0.95, 0.08 + 0.035 * task + SKILL[model])
        if u < FAIL[model]:
            return context_length_error() if u < FAIL[model] / 2 else http_error(400, "temperature must be <= 2")
        if u < FAIL[model] + p:
            return tool_call("get_weather", {"city": "Oslo"}, delay_s=delay)
        return text("I cannot know the weather.", delay_s=delay)

    return answer


async def main(args: argparse.Namespace) -> None:
    logging.getLogger("temporalio").setLevel(logging.CRITICAL)  # the seeded model errors are the point
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gymflow-report-"))
    os.chmod(work, 0o755)  # embedded Postgres runs as its own user when we are root
    with ScriptedOpenAI(responder=responder(args.seed)) as model, \
            LocalStack(work / "state", port=free_port(), headless=True) as addr:
        config = work / "gymflow.yaml"
        config.write_text(yaml.safe_dump({
            "temporal": {"address": addr.temporal_address}, "database": {"url": addr.database_url},
            "models": {m: {"base_url": model.base_url, "model": m} for m in SKILL},
            "rollout": {"max_turns": 3},
        }))
        settings = load_settings(config, env={})
        temporal = await connect_temporal(addr.temporal_address)
        pools = build_pool(temporal, settings, "all", addr.database_url)
        running = [asyncio.create_task(w.run()) for w in pools.workers]
        client = await GymflowClient.connect(settings)
        tasks = [Task(id=f"task-{t:02d}", env="single_tool",
                      messages=(ChatMessage(role="user", content=f"What is the weather in Oslo? {t}"),))
                 for t in range(args.tasks)]
        runs = {"model-a": "report-demo-a", "model-b": "report-demo-b"}
        try:
            for m, run_id in runs.items():
                async for _ in client.collect(run_id, tasks, n=args.n, model=m, max_in_flight=64):
                    pass
        finally:
            await client.close()
            await asyncio.gather(*(w.shutdown() for w in pools.workers))
            await asyncio.gather(*running, return_exceptions=True)
            await pools.close()
        async with store_session(settings) as session:
            a, b = [await load_run(session, r) for r in runs.values()]
        assert a is not None and b is not None
        linker = make_linker(settings, "http://localhost:8233")
        comparison = compare_runs(a.rewards_by_task, b.rewards_by_task, label_a=a.run_id, label_b=b.run_id)
        render_report(Console(width=80), [a, b], linker, comparison)
        for name, data, cmp in (("report", [a], None), ("report-vs", [a, b], comparison)):
            page = out / f"{name}.html"
            page.write_text(render_html(data, linker, cmp), encoding="utf-8")
            screenshot(page, out / f"{name}.png", height=args.height)
            print(f"wrote {page} and {out / f'{name}.png'}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=24)
    parser.add_argument("--n", type=int, default=8, help="samples per task")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--height", type=int, default=1500, help="screenshot height in pixels")
    parser.add_argument("--out", default="docs/img")
    asyncio.run(main(parser.parse_args()))

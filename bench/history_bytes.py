"""What each workflow shape puts in Temporal history: payload bytes per event, for one single-tool episode
and for a long one with large tool outputs, classic (RolloutWorkflow) beside by-reference (EpisodeWorkflow).

Starts the embedded stack, the pools in-process and a scripted model; prints markdown tables for
docs/architecture.md.

    python bench/history_bytes.py --turns 7 --output-kb 20
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import logging
import os
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml

from gymflow.client import GymflowClient
from gymflow.kernel.config import Settings, load_settings
from gymflow.kernel.wire import ChatMessage, Task
from gymflow.testing.scripted_openai import ScriptedOpenAI, text, tool_call
from workers.connect import connect_temporal
from workers.local_stack import LocalStack, free_port
from workers.pools import build_pool

TASK = Task(id="w", env="single_tool", messages=(
    ChatMessage(role="system", content="You are a helpful assistant."),
    ChatMessage(role="user", content="What is the weather in SF?")))


def payload_bytes(event: dict[str, Any]) -> int:
    total = 0

    def walk(node: object) -> None:
        nonlocal total
        if isinstance(node, dict):
            if "metadata" in node and isinstance(node.get("data"), str):
                total += len(base64.b64decode(node["data"]))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(event)
    return total


async def measure(client: GymflowClient, scripted: ScriptedOpenAI, run: str, turns: int, output: int
                  ) -> tuple[dict[str, list[int]], int, str]:
    scripted.script(*[tool_call("get_weather", {"city": f"{i}" + "y" * output}) for i in range(turns - 1)],
                    text("cold"))
    inp = client.make_input(run, TASK, 0, "policy", max_turns=turns)
    summary = await client.run_rollout(inp)
    per_event: dict[str, list[int]] = defaultdict(list)
    total = 0
    async for wf in client.temporal.list_workflows(f"WorkflowId = '{inp.rollout_id}'"):
        history = await client.temporal.get_workflow_handle(inp.rollout_id, run_id=wf.run_id).fetch_history()
        for event in json.loads(history.to_json())["events"]:
            size = payload_bytes(event)
            per_event[event["eventType"]].append(size)
            total += size
    return per_event, total, f"{summary.status}/{summary.failure_type or '-'}"


def shape(settings: Settings, workflow: str) -> Settings:
    return settings.model_copy(update={"rollout": settings.rollout.model_copy(update={"workflow": workflow})})


async def main(args: argparse.Namespace) -> None:
    logging.getLogger("temporalio").setLevel(logging.ERROR)
    work = Path(tempfile.mkdtemp(prefix="gymflow-history-"))
    os.chmod(work, 0o755)
    with ScriptedOpenAI() as model, LocalStack(work / "state", port=free_port(), headless=True) as addr:
        config = work / "gymflow.yaml"
        config.write_text(yaml.safe_dump({
            "temporal": {"address": addr.temporal_address}, "database": {"url": addr.database_url},
            "models": {"policy": {"base_url": model.base_url, "model": "m"}}}))
        settings = load_settings(config, env={})
        temporal = await connect_temporal(addr.temporal_address)
        pools = build_pool(temporal, settings, "all", addr.database_url)
        runs = [asyncio.create_task(w.run()) for w in pools.workers]
        try:
            cases = [("single tool, tiny messages", 2, 10), (f"{args.turns} turns, {args.output_kb} KB tool calls "
                                                             "and outputs", args.turns, args.output_kb * 1000)]
            for title, turns, output in cases:
                print(f"\n### {title}\n")
                print("| event | classic: count, payload bytes | by reference: count, payload bytes |")
                print("|---|---|---|")
                results = {}
                for wf in ("classic", "episode"):
                    client = await GymflowClient.connect(shape(settings, wf))
                    results[wf] = await measure(client, model, f"{wf}-{turns}", turns, output)
                    await client.close()
                kinds = sorted(set(results["classic"][0]) | set(results["episode"][0]))
                for kind in kinds:
                    cells = []
                    for wf in ("classic", "episode"):
                        sizes = results[wf][0].get(kind, [])
                        cells.append(f"{len(sizes)}, {sum(sizes):,}" if sizes else "-")
                    if any(results[wf][0].get(kind) for wf in ("classic", "episode")):
                        print(f"| {kind.removeprefix('EVENT_TYPE_')} | {cells[0]} | {cells[1]} |")
                print(f"| **total payload bytes** | {results['classic'][1]:,} ({results['classic'][2]}) | "
                      f"{results['episode'][1]:,} ({results['episode'][2]}) |")
        finally:
            await asyncio.gather(*(w.shutdown() for w in pools.workers))
            await asyncio.gather(*runs, return_exceptions=True)
            await pools.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=int, default=7)
    ap.add_argument("--output-kb", type=int, default=20)
    asyncio.run(main(ap.parse_args()))

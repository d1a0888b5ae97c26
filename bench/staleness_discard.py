"""The share of rollout work each staleness policy throws away when the policy moves on after every group.

    python -m bench.staleness_discard --groups 16 --samples 4 --in-flight 4 --latency 0.5

A trainer's worst case for staleness: it declares a new policy version each time a group arrives (one update
per group). The same tasks (single_tool: generate, tool call, generate) run under each policy with
`max_staleness` 0 and 1 against the mock model with a fixed latency per call, on the full stack (embedded
Temporal and Postgres, the three pools). Work = model calls (the mock counts every one, cancelled or not);
kept = the turns of the members of groups handed over as trainable. Discarded = 1 - kept / work. Also: groups
withheld, restarts, wall time. Numbers go to docs/training.md.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from typing import Any

from bench.stack import SLOW, start_stack
from bench.workloads import tasks_for
from gymflow import RolloutIterator, declare_policy_version
from gymflow.training.iterator import STALE_POLICIES

VERSION_LAG_S = 0.6  # the generate pool reads the current version at most 0.5 s late


async def one(bench: Any, policy: str, bound: int, args: argparse.Namespace) -> dict[str, Any]:
    tag = f"stale-{policy}-{bound}-{uuid.uuid4().hex[:6]}"
    version = 0  # versions are per model name: the mock's, with this run's tag so that each run starts afresh
    await declare_policy_version(bench.client, SLOW, f"{tag}-v{version}")
    await asyncio.sleep(VERSION_LAG_S)
    bench.mock_stats(SLOW, reset=True)
    tasks = tasks_for("single_tool", args.groups, tag)
    it = RolloutIterator(bench.client, tag, tasks, n=args.samples, model=SLOW, max_staleness=bound, stale=policy,
                         include_withheld=True, max_groups_in_flight=args.in_flight, shuffle=False)
    kept = trainable = withheld = restarts = 0
    started = time.monotonic()
    async with it:
        async for group in it:
            if group.trainable:
                trainable += 1
                kept += sum(m.turns for m in group.members)
            else:
                withheld += 1
            restarts += group.restarts
            version += 1  # one update per group: the policy moves on
            await declare_policy_version(bench.client, SLOW, f"{tag}-v{version}")
    wall = time.monotonic() - started
    work = len(bench.mock_stats(SLOW))
    row = {"policy": policy, "K": bound, "groups": args.groups, "trainable": trainable, "withheld": withheld,
           "restarts": restarts, "model_calls": work, "kept_turns": kept,
           "discarded": round(1 - kept / work, 3) if work else None, "wall_s": round(wall, 1)}
    print(row, flush=True)
    return row


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--groups", type=int, default=16)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--in-flight", type=int, default=4, help="groups in flight")
    p.add_argument("--latency", type=float, default=0.5, help="seconds per model call")
    p.add_argument("--bounds", default="0,1", help="max_staleness values")
    args = p.parse_args(argv)

    async def run() -> list[dict[str, Any]]:
        bench = await start_stack(slow_latency_s=args.latency, concurrency=64)
        try:
            return [await one(bench, policy, int(k), args) for k in args.bounds.split(",")
                    for policy in STALE_POLICIES]
        finally:
            await bench.close()

    rows = asyncio.run(run())
    print("\n| policy | K | groups trainable / withheld | restarts | model calls | discarded | wall s |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['policy']} | {r['K']} | {r['trainable']} / {r['withheld']} | {r['restarts']} | "
              f"{r['model_calls']} | {r['discarded']:.1%} | {r['wall_s']} |")


if __name__ == "__main__":
    main()

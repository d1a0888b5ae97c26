"""A benchmark-only environment whose tools and verifier misbehave (bench/noisy_neighbour.py).

The task's `kind` picks the one tool offered (the mock model calls the first offered tool, so the episode calls
it): `spin` (a pure-Python busy loop), `allocate` (`alloc_gb` GB, every page written), `print` (prints without
end), or `echo` (a normal tool) with `hang_verify` true (a verifier that blocks in `time.sleep`). Each holds for
at most `hold_s` (default 120 s) and `print` stops at `print_cap_mb`: the bench ends even where nothing stops
them, and a hostile rollout that outlives the normal ones still shows in their latency.

`install()` registers it in this process as an entry point would (tests/faulty_env.py does the same); the bench
runs it in each pool process before `gymflow worker` starts (`bench.stack.start_stack(install=...)`).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from importlib.metadata import EntryPoint

from environments import registry
from environments.base import JSON, Environment, TaskData, ToolOutput, VerifyContext, called_tools
from gymflow.kernel.wire import ChatMessage, Score, Task, ToolSpec

NAME = "hostile_bench_env"
ENTRY_POINT = EntryPoint(name=NAME, value="bench.hostile_env:HostileEnvironment", group="gymflow.environments")
KINDS = ("spin", "allocate", "print", "echo")
_TEXT = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}


class HostileTask(TaskData):
    kind: str = "echo"
    hang_verify: bool = False
    hold_s: float = 120.0
    alloc_gb: int = 3
    print_cap_mb: int = 4096


class HostileEnvironment(Environment[HostileTask]):
    name = NAME
    task_type = HostileTask
    placement = "local"  # like single_tool: beside the normal rollouts, in the workflow pool

    def tools(self, task: Task, data: HostileTask) -> Sequence[ToolSpec]:
        return (ToolSpec(name=data.kind, description=data.kind, parameters=_TEXT),)

    async def call_tool(self, data: HostileTask, state: JSON, name: str, args: JSON) -> ToolOutput:
        end = time.monotonic() + data.hold_s
        if name == "spin":
            n = 0
            while time.monotonic() < end:
                for _ in range(10_000):
                    n += 1
            return ToolOutput(content=f"spun {n}", state=state)
        if name == "allocate":
            blocks = [b"x" * (1 << 30) for _ in range(data.alloc_gb)]  # written, so resident
            return ToolOutput(content=f"held {sum(map(len, blocks)) >> 30} GB", state=state)
        if name == "print":
            line, written = "y" * 4095, 0
            while time.monotonic() < end and written < data.print_cap_mb << 20:
                print(line, flush=False)
                written += 4096
            sys.stdout.flush()
            return ToolOutput(content=f"printed {written >> 20} MB", state=state)
        return ToolOutput(content=str(args.get("text", "")), state=state)

    async def verify(self, data: HostileTask, messages: Sequence[ChatMessage], state: JSON,
                     ctx: VerifyContext) -> Score:
        if data.hang_verify:
            time.sleep(data.hold_s)  # blocking, as a verifier stuck in a C call or a sync client would
        return Score(reward=1.0 if called_tools(messages) else 0.0)


def install() -> str:
    """Register the environment in this process for good, as an installed entry point would (the client lists
    the installed environments before a collection; the workers look it up per task)."""
    real = registry._entry_points
    if NAME not in real():
        registry._entry_points = lambda: {**real(), NAME: ENTRY_POINT}
    registry.get_environment(NAME)
    return NAME

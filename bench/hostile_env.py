"""A benchmark-only environment whose tools and verifier misbehave (bench/noisy_neighbour.py).

The task's `kind` picks the one tool offered (the mock model calls the first offered tool, so the episode calls
it): `spin` (a pure-Python busy loop), `allocate` (`alloc_gb` GB, every page written), `print` (prints without
end), or `echo` (a normal tool) with `hang_verify` true (a verifier that blocks in `time.sleep`). Each holds for
at most `hold_s` (default 120 s), so the bench ends even where nothing stops them; `print` stops at
`print_cap_mb` (64 GB), or at 2 GB where its stdout is not /dev/null (a disk safety valve for an unisolated run).

`single_tool_direct` is single_tool with its steps in the worker's event loop (`in_loop_reason`), as every
in-process environment ran before the supervised processes: the baseline of what isolation costs
(bench/nemo_gym_side_by_side.py --direct).

`install()` registers both in this process as an entry point would (tests/faulty_env.py does the same); the bench
runs it in each pool process before `gymflow worker` starts (`bench.stack.start_stack(install=...)`).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from importlib.metadata import EntryPoint

from gymflow.environments import registry
from gymflow.environments.base import JSON, Environment, TaskData, ToolOutput, VerifyContext, called_tools
from gymflow.environments.single_tool import SingleToolEnvironment

from gymflow.kernel.wire import ChatMessage, Score, Task, ToolSpec

NAME = "hostile_bench_env"
ENTRY_POINT = EntryPoint(name=NAME, value="bench.hostile_env:HostileEnvironment", group="gymflow.environments")
DIRECT = "single_tool_direct"
DIRECT_ENTRY_POINT = EntryPoint(name=DIRECT, value="bench.hostile_env:DirectSingleTool", group="gymflow.environments")
KINDS = ("spin", "allocate", "print", "echo")
UNDISCARDED_CAP_MB = 2048  # what `print` writes at most where its output lands in a file (a worker's log)
_TEXT = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}


class HostileTask(TaskData):
    kind: str = "echo"
    hang_verify: bool = False
    hold_s: float = 120.0
    alloc_gb: int = 3
    print_cap_mb: int = 64 << 10  # /dev/null takes ~3 GB/s: more than a 10 s limit's worth


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
            line, written, cap = "y" * 4095, 0, data.print_cap_mb << 20
            if not _discarded(sys.stdout):  # a disk safety valve where nothing sends it to /dev/null
                cap = min(cap, UNDISCARDED_CAP_MB << 20)
            while time.monotonic() < end and written < cap:
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


def _discarded(stream: object) -> bool:
    try:
        return os.path.samefile(f"/proc/self/fd/{stream.fileno()}", os.devnull)  # type: ignore[attr-defined]
    except (OSError, AttributeError, ValueError):
        return False


class DirectSingleTool(SingleToolEnvironment):
    name = DIRECT
    in_loop_reason = "bench only: the baseline of what isolation costs, steps in the worker's event loop"


def install() -> str:
    """Register both environments in this process for good, as installed entry points would (the client lists
    the installed environments before a collection; the workers look them up per task)."""
    real = registry._entry_points
    if NAME not in real():
        registry._entry_points = lambda: {**real(), NAME: ENTRY_POINT, DIRECT: DIRECT_ENTRY_POINT}
    registry.get_environment(NAME)
    registry.get_environment(DIRECT)
    return NAME

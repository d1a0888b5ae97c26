"""Running tool calls on a world, the way NeMo Gym's `/{tool}` route runs them."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

# Importing the tool modules registers their tools.
from gymflow.environments.workplace_assistant import (  # noqa: F401
    tools_analytics,
    tools_calendar,
    tools_crm,
    tools_directory,
    tools_email,
    tools_project,
)
from gymflow.environments.workplace_assistant.registry import TOOLS, ToolDef
from gymflow.environments.workplace_assistant.world import World, pristine

from gymflow.kernel.errors import ToolError

Call = Sequence[Any]  # [name, args]: one applied mutating call, as kept in episode state


def spec(name: str) -> ToolDef:
    found = TOOLS.get(name)
    if found is None:
        raise ToolError(f"unknown tool {name!r}; available: {', '.join(sorted(TOOLS))}")
    return found


def clean_args(tool: ToolDef, args: dict[str, Any]) -> dict[str, Any]:
    """NeMo Gym drops null arguments; an unknown one fails as Python's TypeError would there."""
    kept = {k: v for k, v in args.items() if v is not None}
    for key in kept:
        if key not in tool.params:
            raise ToolError(f"Error executing tool '{tool.name}': {tool.qualname}() got an unexpected keyword "
                            f"argument '{key}'")
    return kept


def run(world: World, name: str, args: dict[str, Any]) -> Any:
    """Run one call on `world` (changing it). Every failure, expected or not, is a `ToolError`:
    NeMo Gym returns any exception's text to the model, so a bad type is a message too."""
    tool = spec(name)
    kept = clean_args(tool, args)
    try:
        return tool.fn(world, **kept)
    except ToolError:
        raise
    except Exception as e:
        raise ToolError(f"Error executing tool '{name}': {e}") from None


def replay(calls: Iterable[Call], world: World | None = None) -> World:
    """Apply recorded calls to a fork of the pristine world; a call that fails changes nothing."""
    world = world or pristine().fork()
    for name, args in calls:
        try:
            run(world, name, args)
        except ToolError:
            continue
    return world


def parse_arguments(raw: str | dict[str, Any]) -> dict[str, Any]:
    """Ground-truth arguments are a JSON string (NeMo Gym's format); a dict is accepted too."""
    args = json.loads(raw) if isinstance(raw, str) else raw
    if not isinstance(args, dict):
        raise ValueError("arguments must be a JSON object")
    return args

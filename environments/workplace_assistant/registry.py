"""The tool table: each tool is a plain function `fn(world, **args)` registered under NeMo Gym's name."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class ToolDef:
    name: str
    fn: Callable[..., Any]
    owner: str  # NeMo Gym's tool class, so argument errors read like Python's there
    mutating: bool  # create / update / delete: the calls that go into episode state
    params: tuple[str, ...]

    @property
    def qualname(self) -> str:
        return f"{self.owner}.{self.fn.__name__}"


TOOLS: dict[str, ToolDef] = {}


def tool(name: str, owner: str, *, mutating: bool = False) -> Callable[[F], F]:
    def register(fn: F) -> F:
        params = tuple(inspect.signature(fn).parameters)[1:]  # the first is the world
        TOOLS[name] = ToolDef(name=name, fn=fn, owner=owner, mutating=mutating, params=params)
        return fn

    return register

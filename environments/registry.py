"""Discover environments through the `gymflow.environments` entry-point group, importing lazily."""

from __future__ import annotations

from functools import cache
from importlib.metadata import EntryPoint, entry_points

from gymflow.environments.base import Environment

from gymflow.kernel.errors import UNKNOWN_ENV, GymflowError

GROUP = "gymflow.environments"


def _entry_points() -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def available() -> dict[str, str]:
    """name -> `module:object`, without importing any environment."""
    return {name: ep.value for name, ep in sorted(_entry_points().items())}


@cache
def get_environment(name: str) -> Environment:
    ep = _entry_points().get(name)
    if ep is None:
        known = ", ".join(sorted(_entry_points())) or "none installed"
        raise GymflowError(f"unknown environment {name!r} (installed: {known})", failure_type=UNKNOWN_ENV)
    env = environment_at(name, ep.value)
    _VALUES[name] = ep.value
    return env


_VALUES: dict[str, str] = {}  # name -> the `module:object` get_environment built it from


def entry_point_value(name: str) -> str:
    """The `module:object` this process's `get_environment(name)` was built from: a supervised process
    (activities/env_processes.py) builds the same one, including an environment a test installed in-process."""
    get_environment(name)
    return _VALUES[name]


@cache
def environment_at(name: str, value: str) -> Environment:
    """The environment the entry point `name = value` produces (once per process)."""
    env = EntryPoint(name=name, value=value, group=GROUP).load()()
    if not isinstance(env, Environment):
        raise GymflowError(f"entry point {value} did not produce an Environment", failure_type=UNKNOWN_ENV)
    return env

"""Discover environments through the `gymflow.environments` entry-point group, importing lazily."""

from __future__ import annotations

from functools import cache
from importlib.metadata import EntryPoint, entry_points

from environments.base import Environment
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
    factory = ep.load()
    env = factory()
    if not isinstance(env, Environment):
        raise GymflowError(f"entry point {ep.value} did not produce an Environment", failure_type=UNKNOWN_ENV)
    return env

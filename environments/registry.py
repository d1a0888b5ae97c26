"""Discover environments through the `gymflow.environments` entry-point group, importing lazily."""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from gymflow.environments.base import Environment
from pydantic import ValidationError

from gymflow.kernel.errors import UNKNOWN_ENV, ConfigError, GymflowError

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


# An environment's own limits on one call (activities/env_processes.py `Limits`). Each must end before the env
# activity's start_to_close_s: a longer one is cut by Temporal instead, retried, and the rollout fails
# activity_timeout after every attempt, where it would have been masked once, typed (verifier_timeout).
CALL_LIMIT_OPTIONS = ("tool_timeout_s", "verify_timeout_s", "library_timeout_s", "setup_timeout_s")


def check_options(options: Mapping[str, Any], source: str = "the config", *,
                  activity_timeout_s: float | None = None) -> dict[str, dict[str, Any]]:
    """Every `environments.<name>` of the config against that environment's declared `Options` (types, bounds,
    names), and, given the env activity's `activity_timeout_s` (rollout.limits.env.start_to_close_s), its call
    limits against it. Returns the options as validated ("10" from a `${VAR}` becomes 10); every problem at once
    otherwise, each naming the file, the key and, for an unknown name, the known ones."""
    problems: list[str] = []
    out: dict[str, dict[str, Any]] = {}
    for name, given in options.items():
        key = f"environments.{name}"
        if not isinstance(given, Mapping):
            problems.append(f"{key}: expected a mapping of option names to values, got {type(given).__name__}")
            continue
        try:
            options_model = get_environment(name).Options
        except GymflowError:
            problems.append(f"{key}: no environment {name!r} is installed (installed: "
                            f"{', '.join(available()) or 'none'})")
            continue
        try:
            out[name] = options_model.model_validate(dict(given)).model_dump(exclude_unset=True)
        except ValidationError as err:
            known = ", ".join(sorted(options_model.model_fields))
            for e in err.errors():
                where = ".".join(str(p) for p in e["loc"])
                if e["type"] == "extra_forbidden":
                    problems.append(f"{key}.{where}: unknown option (known: {known})")
                else:
                    problems.append(f"{key}.{where}: {e['msg']} (got {repr(e.get('input'))[:80]})")
            continue
        for option in CALL_LIMIT_OPTIONS if activity_timeout_s is not None else ():
            value = out[name].get(option)
            if isinstance(value, int | float) and not isinstance(value, bool) and value >= activity_timeout_s:
                problems.append(f"{key}.{option}: {value:g} s is not below rollout.limits.env.start_to_close_s "
                                f"({activity_timeout_s:g} s): the activity would be cut first, and retried; lower "
                                "it or raise start_to_close_s")
    if problems:
        raise ConfigError(f"{source}: " + f"; {source}: ".join(problems))
    return out

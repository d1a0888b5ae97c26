"""Every number the config reaches is bounded (durations > 0, counts >= 1, ports, sampling ranges), and a bad
one is refused naming its key and the file: a negative `start_to_close_s` once made every rollout hang.

The fields are found by walking `Settings`, so a numeric field added without bounds fails here."""

from __future__ import annotations

import math
import types
import typing
from collections.abc import Iterator
from typing import Any

import pytest
from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from gymflow.kernel.config import ModelConfig, Settings, load_settings, settings_from_mapping
from gymflow.kernel.errors import ConfigError, TaskError
from gymflow.kernel.responses_format import sampling_from
from gymflow.kernel.wire import MAX_DURATION_S, RolloutLimits

SOURCE = "conf.yaml"
MODEL = "m"  # the key under `models` (and any other mapping of sections) in the paths below
SIGNED_64 = {"seed"}  # the one count that may be negative: vLLM takes any 64-bit seed


def _walk(annotation: Any, path: str, field: FieldInfo) -> Iterator[tuple[str, type, FieldInfo]]:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            yield from _walk(arg, path, field)
    elif origin is dict:
        yield from _walk(typing.get_args(annotation)[1], f"{path}.{MODEL}", field)
    elif annotation in (int, float):  # bool is its own annotation, never caught here
        yield path, annotation, field
    elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
        for name, sub in annotation.model_fields.items():
            yield from _walk(sub.annotation, f"{path}.{name}", sub)


def numeric_fields() -> list[tuple[str, type, FieldInfo]]:
    return [f for name, field in Settings.model_fields.items() for f in _walk(field.annotation, name, field)]


FIELDS = numeric_fields()
IDS = [path for path, _, _ in FIELDS]


def _valid() -> dict[str, Any]:
    """A complete, valid config: every section spelled out, so one value can be changed anywhere."""
    return Settings(models={MODEL: ModelConfig(base_url="http://u")}).model_dump(mode="json")


def _with(raw: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    *parents, last = path.split(".")
    node = raw
    for key in parents:
        node = node[key]
    node[last] = value
    return raw


def _error(path: str, value: Any) -> str:
    with pytest.raises(ConfigError) as e:
        settings_from_mapping(_with(_valid(), path, value), SOURCE, env={})
    return str(e.value)


def _shown(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() else str(bound)  # as pydantic writes it: 600, not 600.0


def _violations(kind: type, field: FieldInfo) -> Iterator[tuple[Any, str]]:
    """(a value just outside each bound, what pydantic says about it)."""
    step = 1 if kind is int else 0.5
    for m in field.metadata:
        if isinstance(m, Gt):
            yield m.gt, f"greater than {_shown(m.gt)}"
        elif isinstance(m, Ge):
            yield m.ge - step, f"greater than or equal to {_shown(m.ge)}"
        elif isinstance(m, Lt):
            yield m.lt, f"less than {_shown(m.lt)}"
        elif isinstance(m, Le):
            yield m.le + step, f"less than or equal to {_shown(m.le)}"
    if kind is float:
        yield math.inf, "a finite number"
        yield math.nan, "a finite number"


def test_the_walk_finds_every_section():
    assert {"temporal.port", "temporal.ui_port", f"models.{MODEL}.request_timeout_s", f"models.{MODEL}.concurrency",
            "pools.env.concurrency", "pools.generate.rate_limit_per_s", "rollout.max_turns", "rollout.turns_per_run",
            "rollout.sampling.temperature", "rollout.sampling.top_p", "rollout.sampling.max_tokens",
            "rollout.sampling.seed", "rollout.limits.generate.start_to_close_s",
            "rollout.limits.persist.max_backoff_s", "rollout.limits.max_episode_bytes",
            "rollout.limits.max_reply_chars", "rollout.limits.max_tool_calls_per_turn"} <= set(IDS)


@pytest.mark.parametrize(("path", "kind", "field"), FIELDS, ids=IDS)
def test_every_number_has_the_bounds_of_its_kind(path, kind, field):
    lower = [m for m in field.metadata if isinstance(m, Gt | Ge)]
    upper = [m for m in field.metadata if isinstance(m, Lt | Le)]
    name = path.rsplit(".", 1)[-1]
    assert lower, f"{path}: no lower bound"
    if name.endswith("port"):
        assert (lower[0], upper) == (Ge(1), [Le(65535)])
    elif name.endswith("_s") and not name.endswith("_per_s"):  # a duration: > 0 and short of a unit slip
        assert (lower[0], upper) == (Gt(0), [Le(MAX_DURATION_S)])
    elif kind is int and name not in SIGNED_64:  # a count
        assert lower[0] == Ge(1)
    elif kind is float:
        assert isinstance(lower[0], Gt) and lower[0].gt >= 0 or isinstance(lower[0], Ge) and lower[0].ge >= 0


@pytest.mark.parametrize(("path", "kind", "field"), FIELDS, ids=IDS)
def test_every_bound_refuses_naming_the_key_and_file(path, kind, field):
    violations = list(_violations(kind, field))
    assert violations
    for value, says in violations:
        message = _error(path, value)
        assert message.startswith(f"invalid config in {SOURCE}:"), message
        assert f"\n  {path}: Input should be {says}" in message, (value, message)


def test_the_issue_case_from_a_file(tmp_path):
    path = tmp_path / "g.yaml"
    path.write_text("rollout:\n  limits:\n    generate: {start_to_close_s: -5, schedule_to_close_s: 60}\n")
    with pytest.raises(ConfigError) as e:
        load_settings(path, env={})
    assert str(e.value) == (f"invalid config in {path}:\n"
                            "  rollout.limits.generate.start_to_close_s: Input should be greater than 0")


@pytest.mark.parametrize(("limits", "says"), [
    ({"start_to_close_s": 600, "schedule_to_close_s": 60},
     "schedule_to_close_s (60) must be at least start_to_close_s (600)"),
    ({"start_to_close_s": 10, "schedule_to_close_s": 60, "heartbeat_s": 30},
     "heartbeat_s (30) must be at most start_to_close_s (10)"),
    ({"start_to_close_s": 10, "schedule_to_close_s": 60, "initial_backoff_s": 5, "max_backoff_s": 2},
     "max_backoff_s (2) must be at least initial_backoff_s (5)"),
])
def test_activity_limits_agree_with_each_other(limits, says):
    with pytest.raises(ConfigError) as e:
        settings_from_mapping({"rollout": {"limits": {"env": limits}}}, SOURCE, env={})
    assert f"  rollout.limits.env: Value error, {says}" in str(e.value)


def test_embedded_temporal_needs_two_ports():
    with pytest.raises(ConfigError, match=r"temporal: Value error, port and ui_port are both 7000"):
        settings_from_mapping({"temporal": {"port": 7000, "ui_port": 7000}}, env={})
    s = settings_from_mapping({"temporal": {"address": "t:7233", "port": 7000, "ui_port": 7000}}, env={})
    assert s.temporal.port == s.temporal.ui_port  # a remote server: the ports are not bound here


def test_values_at_the_bounds_load():
    raw = _valid()
    raw["temporal"].update(port=65535, ui_port=1)
    raw["rollout"]["sampling"] = {"temperature": 0, "top_p": 1, "max_tokens": 1, "seed": -(1 << 63)}
    raw["rollout"]["limits"]["env"] = {"start_to_close_s": MAX_DURATION_S, "schedule_to_close_s": MAX_DURATION_S,
                                       "heartbeat_s": MAX_DURATION_S, "max_attempts": 1,
                                       "initial_backoff_s": 0.001, "max_backoff_s": 0.001}
    raw["rollout"]["limits"].update(max_reply_chars=1, max_tool_calls_per_turn=1)
    s = settings_from_mapping(raw, env={})
    assert (s.rollout.sampling.temperature, s.rollout.limits.env.max_attempts, s.rollout.limits.max_reply_chars,
            s.rollout.limits.max_tool_calls_per_turn) == (0, 1, 1, 1)
    interpolated = settings_from_mapping({"rollout": {"sampling": {"temperature": "2"}}}, env={})
    assert interpolated.rollout.sampling.temperature == 2


def test_interpolated_numbers_are_bounded_too():
    with pytest.raises(ConfigError, match=r"pools.env.concurrency: Input should be greater than or equal to 1"):
        settings_from_mapping({"pools": {"env": {"concurrency": "${ENV_CONCURRENCY}"}}}, env={"ENV_CONCURRENCY": "0"})


def test_new_reply_limits_default_and_old_payloads_still_load():
    limits = RolloutLimits()
    assert (limits.max_reply_chars, limits.max_tool_calls_per_turn) == (1_000_000, 64)
    old = limits.model_dump(exclude={"max_reply_chars", "max_tool_calls_per_turn"})  # a payload from before them
    assert RolloutLimits.model_validate(old) == limits


def test_a_dataset_rows_sampling_is_bounded_naming_the_field():
    with pytest.raises(TaskError, match=r"^responses_create_params.temperature: Input should be less than or equal"):
        sampling_from({"temperature": 2.5})
    with pytest.raises(TaskError, match=r"^responses_create_params.max_output_tokens: Input should be greater than"):
        sampling_from({"max_output_tokens": -1})

"""One YAML file, `${VAR}` / `${VAR:-default}` interpolation, validated by pydantic.

Errors name the key (`models.policy.base_url: Field required`) and the file.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gymflow.kernel.errors import ConfigError
from gymflow.kernel.safe_yaml import load_file
from gymflow.kernel.wire import MAX_DURATION_S, RolloutLimits, SamplingParams

DEFAULT_CONFIG_PATHS = ("gymflow.yaml", "gymflow.yml")
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class _Section(BaseModel):
    # NaN and infinity are never a setting: `.inf` would pass every lower bound.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class ModelConfig(_Section):
    base_url: str | None = Field(None, description="OpenAI-compatible endpoint, e.g. http://vllm:8000/v1")
    recorded: str | None = Field(None, description="A NeMo Gym rollouts JSONL whose model outputs are replayed")
    model: str = Field("recorded", description="Model id sent to the endpoint")
    api_key_env: str | None = Field(None, description="Name of the env var holding the key; never the key")
    request_timeout_s: float = Field(600.0, gt=0, le=MAX_DURATION_S)
    concurrency: int = Field(64, ge=1, description="Requests in flight per worker process")
    logprobs: bool = False
    return_token_ids: bool = Field(False, description="vLLM: ask for prompt and generation token ids")
    extra_body: dict[str, Any] = Field(default_factory=dict)
    placement: Literal["pool", "local"] = Field(
        "local", description="Where the episode's generate step runs: 'local' (default), a local activity in the "
                             "workflow pool, which calls the endpoint itself (fewer state transitions, no queue hop "
                             "per turn; docs/architecture.md measures replies of up to 10 minutes); 'pool', an "
                             "activity on the model's generate queue (the generate pool: its own hosts and "
                             "concurrency, heartbeats, any duration)")

    @field_validator("api_key_env")
    @classmethod
    def _looks_like_a_name(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", v):
            raise ValueError("must be the NAME of an environment variable, not the key itself")
        return v

    @model_validator(mode="after")
    def _one_backend(self) -> ModelConfig:
        if (self.base_url is None) == (self.recorded is None):
            raise ValueError("set exactly one of base_url (a live endpoint) or recorded (a rollouts file)")
        return self


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class TemporalTLSConfig(_Section):
    """TLS to Temporal (Temporal Cloud, an mTLS cluster). Paths are files on the worker's host, read at connect."""

    enabled: bool = Field(True, description="false: plaintext even with an API key (a proxy that terminates TLS)")
    ca_cert: Path | None = Field(None, description="PEM CA that signed the server's cert; default: system roots")
    client_cert: Path | None = Field(None, description="PEM client certificate, for mTLS")
    client_key: Path | None = Field(None, description="PEM private key of client_cert")
    server_name: str | None = Field(None, description="Name to verify the server's cert against (SNI override)")

    @model_validator(mode="after")
    def _cert_with_key(self) -> TemporalTLSConfig:
        if (self.client_cert is None) != (self.client_key is None):
            raise ValueError("set both client_cert and client_key (mTLS), or neither")
        return self


class TemporalConfig(_Section):
    address: str | None = Field(None, description="host:port; empty starts the embedded dev server")
    namespace: str = "default"
    ui_port: int = Field(8233, ge=1, le=65535)
    port: int = Field(7233, ge=1, le=65535)
    tls: TemporalTLSConfig | None = Field(None, description="Connect over TLS; an API key alone also turns TLS on")
    api_key_env: str | None = Field(None, description="Name of the env var holding the Temporal API key; never the key")
    env_config: bool = Field(
        True, description="Fill what this section leaves unset from Temporal's own environment configuration "
                          "(TEMPORAL_NAMESPACE, TEMPORAL_API_KEY, TEMPORAL_TLS_*, the TOML profile)")

    @field_validator("api_key_env")
    @classmethod
    def _api_key_is_a_name(cls, v: str | None) -> str | None:
        if v is not None and not _ENV_NAME.fullmatch(v):
            raise ValueError("must be the NAME of an environment variable, not the key itself")
        return v

    @model_validator(mode="after")
    def _two_ports(self) -> TemporalConfig:
        if self.address is None and self.port == self.ui_port:  # the embedded server binds both
            raise ValueError(f"port and ui_port are both {self.port}: the embedded dev server needs two ports")
        return self


class DatabaseConfig(_Section):
    url: str | None = Field(None, description="Postgres URL; empty starts embedded Postgres")


class PoolConfig(_Section):
    concurrency: int = Field(ge=1)
    rate_limit_per_s: float | None = Field(
        None, gt=0, description="Activities started per second across the whole pool (server-enforced), "
                                "e.g. to stay under a hosted API's rate limit")


class PoolsConfig(_Section):
    workflows: PoolConfig = PoolConfig(concurrency=500)
    env: PoolConfig = PoolConfig(concurrency=32)
    generate: PoolConfig = PoolConfig(concurrency=256)


class RolloutDefaults(_Section):
    max_turns: int = Field(8, ge=1)
    turns_per_run: int | None = Field(
        None, ge=1, description="Continue a long episode as a new workflow run after this many turns")
    sampling: SamplingParams = SamplingParams()
    limits: RolloutLimits = RolloutLimits()


class Settings(_Section):
    temporal: TemporalConfig = TemporalConfig()
    database: DatabaseConfig = DatabaseConfig()
    state_dir: Path = Path(".gymflow")
    models: dict[str, ModelConfig] = Field(default_factory=dict)
    pools: PoolsConfig = PoolsConfig()
    rollout: RolloutDefaults = RolloutDefaults()
    environments: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="Per-environment verifier options, e.g. math_with_judge.judge_model")

    def model_config_for(self, name: str) -> ModelConfig:
        try:
            return self.models[name]
        except KeyError:
            raise ConfigError(unconfigured_model(name, self.models)) from None


def unconfigured_model(name: str, models: Iterable[str]) -> str:
    """That model `name` is not configured, and how to configure one (a newcomer has no gymflow.yaml yet)."""
    known = ", ".join(sorted(models))
    if known:
        return f"model {name!r} is not configured (models: {known}); add models.{name} to the config or use one"
    return (f"model {name!r} is not configured (models: none); copy gymflow.example.yaml to gymflow.yaml and set "
            f"models.{name}, or run `gymflow demo`, which serves a local model")


def interpolate(value: Any, env: dict[str, str], path: str = "") -> Any:
    """Replace `${VAR}` and `${VAR:-default}` in every string; a missing VAR without default is an error."""
    if isinstance(value, dict):
        return {k: interpolate(v, env, f"{path}.{k}" if path else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env, f"{path}[{i}]") for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match[str]) -> str:
        name, default = m.group(1), m.group(2)
        if name in env:
            return env[name]
        if default is not None:
            return default
        raise ConfigError(f"{path}: environment variable ${{{name}}} is not set and has no default")

    out = _VAR.sub(sub, value)
    return None if out == "" and _VAR.fullmatch(value) else out


def _format_validation(err: ValidationError, source: str) -> str:
    lines = [f"invalid config in {source}:"]
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "<root>"
        lines.append(f"  {key}: {e['msg']}")
    return "\n".join(lines)


def settings_from_mapping(raw: dict[str, Any], source: str = "<config>", env: dict[str, str] | None = None
                          ) -> Settings:
    data = interpolate(raw, dict(os.environ) if env is None else env)
    # The process environment overrides the file for the two addresses that pick the stack.
    environ = os.environ if env is None else env
    if environ.get("TEMPORAL_ADDRESS"):
        data.setdefault("temporal", {})["address"] = environ["TEMPORAL_ADDRESS"]
    if environ.get("DATABASE_URL"):
        data.setdefault("database", {})["url"] = environ["DATABASE_URL"]
    try:
        return Settings.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_validation(err, source)) from None


def config_path(path: str | Path | None = None, env: dict[str, str] | None = None) -> str | Path | None:
    """The config file `load_settings` reads: `path`, `$GYMFLOW_CONFIG`, else the first default that exists."""
    environ = os.environ if env is None else env
    candidate = path or environ.get("GYMFLOW_CONFIG") or None  # set but empty (`GYMFLOW_CONFIG=`): unset
    return candidate if candidate is not None else next((p for p in DEFAULT_CONFIG_PATHS if Path(p).exists()), None)


def load_settings(path: str | Path | None = None, env: dict[str, str] | None = None) -> Settings:
    """Load settings from `path`, `$GYMFLOW_CONFIG`, or ./gymflow.yaml; defaults when none exists."""
    environ = dict(os.environ) if env is None else env
    candidate = config_path(path, environ)
    if candidate is None:
        return settings_from_mapping({}, "<defaults>", environ)
    p = Path(candidate)
    if not p.exists():
        raise ConfigError(f"config file {p} does not exist")
    raw = load_file(p) or {}  # no aliases, at most 1 MiB: errors name the file and line
    if not isinstance(raw, dict):
        raise ConfigError(f"{p}: top level must be a mapping")
    return settings_from_mapping(raw, str(p), environ)

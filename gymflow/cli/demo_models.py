"""The model behind `policy` for `gymflow demo` and `gymflow up`: a built-in scripted server (`--scripted`), the
local SmolLM2-135M server on CPU (`--local-model`; the demo's default when no model is configured), or the config's.

A server started here lives as long as the command and is stopped when it ends; `models.policy` pointing at it is
written to `<state_dir>/<command>-config.yaml`, which the pools the command spawns read, and so can other
commands while it runs (`gymflow collect ... --config .gymflow/up-config.yaml`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import click

from gymflow.embedded import EmbeddedError, local_policy, start_local_model, with_policy
from gymflow.kernel.config import Settings

# Short replies keep a CPU rollout to seconds a turn; the single-tool call fits in far fewer tokens.
LOCAL_MAX_TOKENS = 64
SCRIPTED_MODEL = "scripted-weather"

F = TypeVar("F", bound=Callable[..., Any])


def model_options(f: F) -> F:
    """--scripted and --local-model, as `demo` and `up` both take them."""
    f = click.option("--local-model", "local_model", is_flag=True,
                     help="Serve SmolLM2-135M-Instruct on CPU on 127.0.0.1 as model `policy` (needs the `local` "
                          f"extra; ~20 s to load; replies of at most {LOCAL_MAX_TOKENS} tokens).")(f)
    return click.option("--scripted", is_flag=True,
                        help="Serve a built-in scripted OpenAI-compatible server as model `policy` (it calls "
                             "get_weather once, then answers from the result).")(f)


@dataclass
class Policy:
    """What serves model `policy`: `source` is 'scripted', 'local' or 'config'; `config_path` the config every
    process of the command (and any other command meanwhile) reads; `base_url` the endpoint."""

    settings: Settings
    config_path: str | None
    source: str
    base_url: str

    @property
    def flag(self) -> str:
        """The option that serves the same model again (`gymflow up --scripted`), '' for the config's."""
        return {"scripted": "--scripted", "local": "--local-model"}.get(self.source, "")


def generated_config(settings: Settings, command: str) -> str:
    return str(Path(settings.state_dir) / f"{command}-config.yaml")


@contextmanager
def policy_model(settings: Settings, config_path: str | None, command: str, *, scripted: bool = False,
                 local: bool = False, local_by_default: bool = False) -> Iterator[Policy]:
    """Model `policy` for the duration of the block: the scripted server, the local model (also when
    `local_by_default` and no models.policy is configured), else the config's. An EmbeddedError (the local model
    cannot start, nor the stack) leaves as a ClickException saying what to do; a server started here is stopped."""
    if scripted and local:
        raise click.UsageError("--scripted and --local-model each pick the model: give one")
    server: Any = None
    try:
        if scripted:
            from gymflow.testing.scripted_openai import ScriptedOpenAI, weather_responder

            server = ScriptedOpenAI(responder=weather_responder).start()
            config_path = generated_config(settings, command)
            settings = with_policy(settings, {"base_url": server.base_url, "model": SCRIPTED_MODEL},
                                   Path(config_path))
            source = "scripted"
        elif local or (local_by_default and "policy" not in settings.models):
            from gymflow.localmodel.resolve import DEFAULT_NAME

            why = "" if local else "no model configured: "
            click.echo(f"{why}starting the local model (SmolLM2-135M-Instruct on CPU; ~20 s to load)")
            server = start_local_model(state_dir=settings.state_dir)
            config_path = generated_config(settings, command)
            settings = with_policy(settings, local_policy(server.base_url, DEFAULT_NAME), Path(config_path),
                                   {"max_tokens": LOCAL_MAX_TOKENS})
            source = "local"
        else:
            source = "config"
        base_url = settings.models["policy"].base_url if "policy" in settings.models else ""
        if server is not None:
            click.echo(f"model policy: {'scripted server' if scripted else 'local model'} at {base_url} "
                       f"(in {config_path}, which other commands take as --config)")
        yield Policy(settings, config_path, source, base_url)
    except EmbeddedError as e:
        raise click.ClickException(str(e)) from None
    finally:
        if server is not None:
            server.stop()


__all__ = ["LOCAL_MAX_TOKENS", "Policy", "generated_config", "model_options", "policy_model"]

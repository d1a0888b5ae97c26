"""Shared CLI plumbing: loading settings with readable errors, running coroutines."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

import click

from gymflow.kernel.config import Settings, config_path, load_settings
from gymflow.kernel.errors import GymflowError
from gymflow.kernel.logfilter import quiet_expected_failures

T = TypeVar("T")

config_option = click.option("--config", "-c", "config_path", type=click.Path(dir_okay=False), default=None,
                             help="gymflow YAML config (default: $GYMFLOW_CONFIG or ./gymflow.yaml)")


def settings_or_exit(path: str | None) -> Settings:
    """The settings, their environment options checked against each environment's declared ones."""
    from gymflow.environments.registry import check_options  # imports only the environments configured

    try:
        settings = load_settings(path)
        source = str(config_path(path) or "the default settings")
        checked = check_options(settings.environments, source,
                                activity_timeout_s=settings.rollout.limits.env.start_to_close_s)
        return settings.model_copy(update={"environments": checked})
    except GymflowError as e:
        raise click.ClickException(str(e)) from None


def run(coro: Coroutine[Any, Any, T]) -> T:
    try:
        return asyncio.run(coro)
    except GymflowError as e:
        raise click.ClickException(str(e)) from None


def setup_logging(verbose: bool) -> None:
    """WARNING (INFO with `verbose`) to stderr, one line per expected activity failure."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # httpx logs every request URL at INFO; keep it quiet so logs stay about rollouts.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    # An expected, typed activity failure (a model 400, a bad task) logs one line, not a traceback.
    quiet_expected_failures()

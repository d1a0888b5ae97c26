"""`gymflow show ROLLOUT`: one rollout's transcript, per-turn generations, score details and failure."""

from __future__ import annotations

from typing import Any

import click
from rich.console import Console

from gymflow.cli.common import config_option, run, settings_or_exit
from gymflow.cli.report_cmd import ui_url_option
from gymflow.kernel.store.reports import rollout_detail, similar_rollout_ids
from gymflow.reports.data import Linker, make_linker, store_session
from gymflow.reports.text import render_rollout


async def _load(config_path: str | None, rollout_id: str, ui_url: str | None) -> tuple[dict[str, Any], Linker]:
    settings = settings_or_exit(config_path)
    async with store_session(settings, on_wait=lambda m: click.echo(m, err=True)) as session:
        detail = await rollout_detail(session, rollout_id)
        if detail is None:
            near = await similar_rollout_ids(session, rollout_id)
            hint = (f"; rollouts of run {rollout_id.split('/', 1)[0]!r} include {', '.join(near)}" if near else
                    "; ids look like RUN/TASK/SAMPLE, and `gymflow report RUN` lists failed ones")
            raise click.ClickException(f"no rollout {rollout_id!r}{hint}")
    return detail, make_linker(settings, ui_url)


@click.command()
@click.argument("rollout_id")
@click.option("--full", is_flag=True, help="Print long texts (messages, tool arguments, score details) in full")
@ui_url_option
@config_option
def show(rollout_id: str, full: bool, ui_url: str | None, config_path: str | None) -> None:
    """Print rollout ROLLOUT_ID (RUN/TASK/SAMPLE): transcript, tool calls and outputs, per-turn tokens,
    score details and its failure."""
    detail, linker = run(_load(config_path, rollout_id, ui_url))
    render_rollout(Console(), detail, linker, full=full)

"""`gymflow report RUN`: mean reward, pass@k, failures by type and latency, from the SQL views."""

from __future__ import annotations

from typing import Any

import click
from rich.console import Console
from rich.table import Table

from gymflow.cli.common import config_option, run, settings_or_exit
from gymflow.client import GymflowClient


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)


async def _report(config_path: str | None, run_id: str) -> dict[str, list[dict[str, Any]]]:
    client = await GymflowClient.connect(settings_or_exit(config_path))
    try:
        return await client.report(run_id)
    finally:
        await client.close()


@click.command()
@click.argument("run_id")
@config_option
def report(run_id: str, config_path: str | None) -> None:
    """Summarise RUN from Postgres (views run_scores, failure_counts, latency_percentiles)."""
    views = run(_report(config_path, run_id))
    if not views["run_scores"]:
        raise click.ClickException(f"no rollouts recorded for run {run_id!r}")
    console = Console()
    for name, rows in views.items():
        if not rows:
            continue
        cols = [c for c in rows[0] if c != "run_id"]
        table = Table(*cols, title=name)
        for row in rows:
            table.add_row(*(_fmt(row[c]) for c in cols))
        console.print(table)

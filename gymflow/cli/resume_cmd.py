"""`gymflow resume RUN`: continue failed rollouts from just before the step that failed them."""

from __future__ import annotations

import asyncio

import click
from rich.console import Console
from rich.table import Table
from temporalio.client import WorkflowFailureError

from gymflow.cli.common import config_option, run, settings_or_exit
from gymflow.kernel.config import Settings
from gymflow.kernel.connect import connect_configured, quiet_runtime
from gymflow.resume import Resumed, resume_run

WAIT_LIMIT_S = 24 * 3600  # the same bound as a rollout's execution timeout


async def _resume(settings: Settings, run_id: str, wait: bool) -> tuple[list[Resumed], dict[str, str]]:
    client = await connect_configured(settings, runtime=quiet_runtime())
    resumed = await resume_run(client, run_id, reason=f"gymflow resume {run_id}")
    outcomes: dict[str, str] = {}
    if wait:
        async def outcome(r: Resumed) -> None:
            try:
                await client.get_workflow_handle(r.workflow_id, run_id=r.new_run_id).result()
                outcomes[r.workflow_id] = "completed"
            except WorkflowFailureError as e:
                outcomes[r.workflow_id] = f"failed again: {e.cause}"

        await asyncio.wait_for(asyncio.gather(*(outcome(r) for r in resumed if r.new_run_id)), WAIT_LIMIT_S)
    return resumed, outcomes


@click.command()
@click.argument("run_id")
@click.option("--wait", is_flag=True, help="Wait for the resumed rollouts and show how they ended.")
@config_option
def resume(run_id: str, wait: bool, config_path: str | None) -> None:
    """Start RUN's failed rollouts again from the last step they stored (after you fixed what failed them)."""
    resumed, outcomes = run(_resume(settings_or_exit(config_path), run_id, wait))
    if not resumed:
        click.echo(f"run {run_id}: no failed rollouts")
        return
    table = Table("rollout", "from turn", "result")
    for r in resumed:
        table.add_row(r.workflow_id, "-" if r.from_turn is None else str(r.from_turn),
                      outcomes.get(r.workflow_id, r.note))
    Console().print(table)

"""`gymflow env list`: which environment plug-ins are installed."""

from __future__ import annotations

import click
from rich.console import Console
from rich.table import Table


@click.group()
def env() -> None:
    """Environment plug-ins."""


@env.command("list")
def list_envs() -> None:
    """List installed environments (entry-point group `gymflow.environments`)."""
    from environments.registry import available

    table = Table("name", "implementation")
    for name, target in available().items():
        table.add_row(name, target)
    Console().print(table)

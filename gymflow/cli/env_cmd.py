"""`gymflow env list|new|check`: installed environment plug-ins, a new plug-in's skeleton, a dataset's check."""

from __future__ import annotations

import asyncio
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gymflow.kernel.errors import GymflowError


@click.group()
def env() -> None:
    """Environment plug-ins."""


def describe(target: str) -> tuple[str, str]:
    """(placement, what it needs) from the environment class's declarations, imported but not built."""
    from importlib.metadata import EntryPoint

    try:
        cls = EntryPoint(name="", value=target, group="").load()
    except Exception as e:  # a plug-in whose own imports fail is still listed, with why
        return "?", f"cannot import {target}: {type(e).__name__}: {e}"
    return str(getattr(cls, "placement", "?")), "; ".join(getattr(cls, "needs", ())) or "-"


@env.command("list")
@click.option("--paths", is_flag=True, help="Also show each implementation's `module:object`.")
def list_envs(paths: bool) -> None:
    """List installed environments (entry-point group `gymflow.environments`): where each runs (placement) and
    what it needs beyond gymflow (a sandbox binary, a judge model, data, a server)."""
    from gymflow.environments.registry import available

    table = Table("name", "placement", "needs", *(["implementation"] if paths else []))
    for name, target in available().items():
        table.add_row(name, *map(escape, describe(target)), *([escape(target)] if paths else []))
    Console().print(table)


@env.command("new")
@click.argument("name")
@click.option("--dir", "parent", type=click.Path(file_okay=False, path_type=Path), default=Path("."),
              show_default=True, help="Folder to create the package in (as DIR/NAME).")
def new_env(name: str, parent: Path) -> None:
    """Write a working environment plug-in package NAME: its module, entry point, tests and example data."""
    from gymflow.authoring.scaffold import new_environment
    from gymflow.environments.registry import available

    try:
        target = new_environment(name, parent, set(available()))
    except GymflowError as e:
        raise click.ClickException(str(e)) from None
    except OSError as e:
        raise click.ClickException(f"{parent / name}: {e.strerror or e}") from None
    click.echo(f"wrote {target}; next:\n"
               f"  cd {target} && python -m pytest -q    (its tests)\n"
               f"  pip install -e {target}    (then `gymflow env list` shows {name})\n"
               f"  gymflow env check {name} {target / 'data' / 'example.jsonl'}")


@env.command("check")
@click.argument("name")
@click.argument("data", type=click.Path(exists=True, dir_okay=False))
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0.1), default=60.0, show_default=True,
              help="Seconds allowed for each environment call (validate, a tool call, verify).")
def check_env(name: str, data: str, timeout_s: float) -> None:
    """Check every row of DATA against environment NAME: parse, validate (the gold answer scores 1), a scripted
    episode through the real tool and verify code, and a hostile reply. Reports by line; exit 1 if any fails."""
    from gymflow.authoring.checker import check_file
    from gymflow.environments.registry import get_environment

    try:
        environment = get_environment(name)
    except GymflowError as e:
        raise click.ClickException(str(e)) from None
    try:
        report = asyncio.run(check_file(environment, data, timeout_s=timeout_s))
    finally:
        close = getattr(environment, "close", None)
        if callable(close):
            close()  # e.g. math_with_judge's checker processes
    for line in report.lines():
        click.echo(line)
    ok = len(report.results) - report.failed
    click.echo(f"{len(report.results)} lines: {ok} ok, {report.failed} failed")
    if report.failed:
        raise SystemExit(1)

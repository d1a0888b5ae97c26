"""`gymflow data prepare`: validate rows against an environment, report by line and field, write the rest."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gymflow.kernel.errors import GymflowError


@click.group()
def data() -> None:
    """Dataset preparation."""


def _stats(values: list[float]) -> str:
    if not values:
        return "-"
    return f"min {min(values):g}  mean {sum(values) / len(values):.1f}  max {max(values):g}"


@data.command("prepare")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--env", "env_name", required=True, help="Environment whose task type every row must fit.")
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="Where the valid rows go (default: <file stem>.<env>.jsonl in the current directory).")
def prepare_cmd(file: str, env_name: str, out: str | None) -> None:
    """Validate FILE (JSONL; NeMo Gym rows load unchanged) for ENV and write the rows that pass."""
    from gymflow.data.datasets import grouped
    from gymflow.data.prepare import prepare

    target = Path(out or f"{Path(file).stem}.{env_name}.jsonl")
    try:
        report = prepare(file, env_name, target)
    except GymflowError as e:
        raise click.ClickException(str(e)) from None
    except OSError as e:  # the output's folder is missing, or --out is a folder
        raise click.ClickException(f"{target}: {e.strerror or e}") from None
    console = Console()
    for line in grouped(report.errors):
        console.print(f"[red]error[/red] {escape(line)}")  # row values are in messages: never markup
    table = Table("field", "rows", "types", "size (len or value)",
                  title=escape(f"{report.written} rows -> {target}"))
    for key, st in sorted(report.fields.items()):
        table.add_row(escape(key[:80]), str(st.present), ", ".join(f"{t}:{n}" for t, n in st.types.items()),
                      _stats(st.sizes))
    table.add_row("(prompt messages)", str(len(report.turns)), "", _stats([float(x) for x in report.turns]))
    table.add_row("(tools)", str(len(report.tools)), "", _stats([float(x) for x in report.tools]))
    console.print(table)
    console.print(f"rows: {report.total}  valid: {report.written}  invalid: {report.invalid}")
    if report.errors:
        raise SystemExit(1)


@data.command("join")
@click.argument("rollouts", type=click.Path(exists=True, dir_okay=False))
@click.option("--tasks", type=click.Path(exists=True, dir_okay=False), default=None,
              help="The task file the rollouts were made from (its fields the rollout rows lack are added).")
@click.option("--out", type=click.Path(dir_okay=False), required=True)
def join_cmd(rollouts: str, tasks: str | None, out: str) -> None:
    """Make a NeMo Gym rollout file replayable and scorable: each row gets its task's fields (matched by
    conversation, with --tasks) and what the replay needs, and the samples of one task are numbered so they load as
    its recorded samples. Bad lines of either file are reported and skipped; the exit status is then 1."""
    from gymflow.data.datasets import grouped
    from gymflow.data.prepare import join

    try:
        report = join(rollouts, tasks, out)
    except GymflowError as e:
        raise click.ClickException(str(e)) from None
    except OSError as e:
        raise click.ClickException(f"{out}: {e.strerror or e}") from None
    for text in grouped(report.errors):
        click.echo(f"error {text}", err=True)
    for line in report.unmatched:
        click.echo(f"{rollouts}:{line}: no task in {tasks} has this conversation", err=True)
    if report.renumbered:
        click.echo(f"{rollouts}: lines {_lines(report.renumbered)} repeat a sample of their task: numbered as its "
                   "next samples", err=True)
    if report.renamed:
        click.echo(f"{rollouts}: lines {_lines(report.renamed)} reuse a task id for another prompt: each given "
                   "its own id (<id>-line<N>)", err=True)
    joined = report.written - len(report.unmatched)
    how = f"{joined} joined" if tasks else "no --tasks: fields as recorded"
    click.echo(f"{report.written} rows -> {out} ({how}, {report.bad_lines} bad lines skipped)")
    if report.errors:
        raise SystemExit(1)


def _lines(numbers: list[int], most: int = 10) -> str:
    shown = ", ".join(map(str, numbers[:most]))
    return shown + (f" (and {len(numbers) - most} more)" if len(numbers) > most else "")

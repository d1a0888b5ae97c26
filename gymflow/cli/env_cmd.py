"""`gymflow env list|new|check|nemo-gym-install`: installed environment plug-ins, a new plug-in's skeleton, a
dataset's check, NeMo Gym servers' own packages."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
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
@click.option("--nemo-gym", "nemo_gym", is_flag=True,
              help="Also list NeMo Gym's resources servers (the `nemo_gym` environment's catalogue): which this "
                   "installation can run, why the others cannot, and what each needs.")
def list_envs(paths: bool, nemo_gym: bool) -> None:
    """List installed environments (entry-point group `gymflow.environments`): where each runs (placement) and
    what it needs beyond gymflow (a sandbox binary, a judge model, data, a server)."""
    from gymflow.environments.registry import available

    table = Table("name", "placement", "needs", *(["implementation"] if paths else []))
    for name, target in available().items():
        table.add_row(name, *map(escape, describe(target)), *([escape(target)] if paths else []))
    Console().print(table)
    if nemo_gym:
        _list_nemo_gym()


def _list_nemo_gym() -> None:
    from gymflow.environments import nemo_gym_catalogue as catalogue

    try:
        servers = catalogue.catalogue(catalogue.python())
    except GymflowError as e:
        raise click.ClickException(f"NeMo Gym's catalogue: {e}") from None
    table = Table("NeMo Gym server", "runs here", "needs", "why not", title=f"NeMo Gym ({catalogue.python()})")
    runnable = 0
    for name, info in servers.items():
        runnable += info.refusal is None
        needs = "; ".join([*(f"pip {r}" for r in info.requirements[:3]), *info.needs]) or "-"
        table.add_row(name, "yes" if info.refusal is None else "no", escape(needs), escape(info.refusal or ""))
    Console(width=200).print(table)
    click.echo(f"{len(servers)} NeMo Gym servers: {runnable} can run here; "
               "`gymflow env check nemo_gym --server NAME` runs one's example rows")


@env.command("nemo-gym-install")
@click.argument("servers", nargs=-1, metavar="[SERVER]...")
@click.option("--python", "python", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="NeMo Gym's interpreter (default: $GYMFLOW_NEMO_GYM_PYTHON, else .nemo313/bin/python); a venv is "
                   "made there from pyenv's Python 3.13 if it does not exist.")
def nemo_gym_install(servers: tuple[str, ...], python: Path | None) -> None:
    """Make NeMo Gym's venv where it is missing and install each SERVER's own requirements.txt into it, from the
    package index (lines from git, a URL or a path are refused by name)."""
    from gymflow.environments.nemo_gym_install import install_servers

    try:
        py = install_servers(servers, python, say=click.echo)
    except GymflowError as e:
        raise click.ClickException(str(e)) from None
    click.echo(f"done: {py}; `gymflow env list --nemo-gym` shows what runs now")


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
@click.argument("data", type=click.Path(exists=True, dir_okay=False), required=False)
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0.1), default=60.0, show_default=True,
              help="Seconds allowed for each environment call (validate, a tool call, verify).")
@click.option("--server", "nemo_server", default=None, metavar="NAME",
              help="nemo_gym only: a NeMo Gym resources server; DATA defaults to its data/example.jsonl, each row "
                   "sent to it (gymflow starts it unless $GYMFLOW_NEMO_GYM_<NAME>_URL is set).")
def check_env(name: str, data: str | None, timeout_s: float, nemo_server: str | None) -> None:
    """Check every row of DATA against environment NAME: parse, validate (the gold answer scores 1), a scripted
    episode through the real tool and verify code, and a hostile reply. Reports by line; exit 1 if any fails."""
    if nemo_server is not None:
        if name != "nemo_gym":
            raise click.UsageError("--server is for `gymflow env check nemo_gym`")
        with _nemo_gym_rows(nemo_server, data) as rows:
            _check(name, str(rows), timeout_s)
        return
    if data is None:
        raise click.UsageError("missing argument DATA (or, for nemo_gym, --server NAME)")
    _check(name, data, timeout_s)


@contextlib.contextmanager
def _nemo_gym_rows(server: str, data: str | None) -> Iterator[Path]:
    """DATA (default: the server's example.jsonl) with `resources_server` set on every row, in a temporary file."""
    from gymflow.environments import nemo_gym_catalogue as catalogue
    from gymflow.environments.nemo_gym_http import url_env_var

    source = Path(data) if data else None
    if source is None:
        try:
            info = catalogue.server(server)
        except GymflowError as e:
            raise click.ClickException(f"{e}; or give DATA and set {url_env_var(server)}") from None
        if info.refusal and not os.environ.get(url_env_var(server)):
            raise click.ClickException(f"NeMo Gym server {server} cannot run here: {info.refusal}")
        source = info.examples
        if not source.exists():
            raise click.ClickException(f"{server} ships no {source}: give DATA")
    with tempfile.TemporaryDirectory(prefix="gymflow-check-") as tmp:
        out = Path(tmp) / f"{server}.jsonl"
        lines = []
        for n, line in enumerate(source.read_text().splitlines(), 1):
            if not line.strip():
                lines.append(line)
                continue
            try:
                row = json.loads(line)
            except ValueError as e:
                raise click.ClickException(f"{source}:{n}: not JSON ({e})") from None
            lines.append(json.dumps({**row, "resources_server": server}) if isinstance(row, dict) else line)
        out.write_text("\n".join(lines) + "\n")
        click.echo(f"checking {source} on NeMo Gym server {server}")
        yield out


def _check(name: str, data: str, timeout_s: float) -> None:
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

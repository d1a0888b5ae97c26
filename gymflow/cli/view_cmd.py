"""`gymflow view`: serve a read-only web view of the run store (runs, a run's plots, checks and rollout table,
a rollout's conversation) until Ctrl-C."""

from __future__ import annotations

import asyncio

import click

from gymflow.cli.common import config_option, run, settings_or_exit
from gymflow.cli.report_cmd import ui_url_option
from gymflow.kernel.config import Settings
from gymflow.kernel.connect import resolve_addresses, startup_wait_s
from gymflow.kernel.errors import ConfigError
from gymflow.kernel.store.db import database_location, migrate_when_reachable
from gymflow.reports.data import make_linker


def _database_url(settings: Settings) -> str:
    # As `gymflow report` finds it: only Postgres is needed, Temporal may be down.
    try:
        return resolve_addresses(settings)[1]
    except ConfigError:
        if not settings.database.url:
            raise
        return settings.database.url


async def _serve(database_url: str, settings: Settings, host: str, port: int, ui_url: str | None) -> None:
    from aiohttp import web

    from gymflow.view.app import make_app

    # Idempotent; makes the views exist on a database no worker has touched yet (as `gymflow report` does).
    await migrate_when_reachable(database_url, wait_s=startup_wait_s(), on_wait=lambda m: click.echo(m, err=True))
    runner = web.AppRunner(make_app(database_url, make_linker(settings, ui_url)), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        shown = f"[{host}]" if ":" in host else host
        click.echo(f"gymflow view of {database_location(database_url)} at http://{shown}:{port}/ (Ctrl-C stops)")
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


@click.command()
@click.option("--port", default=8321, show_default=True, type=click.IntRange(0, 65535))
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; the view has no login, so keep it on localhost unless the network is trusted")
@ui_url_option
@config_option
def view(port: int, host: str, ui_url: str | None, config_path: str | None) -> None:
    """Serve a read-only web view of the runs in Postgres: runs, a run's plots, checks, task profile and a
    filterable rollout table, each rollout's conversation, verifier details and tokens."""
    settings = settings_or_exit(config_path)
    try:
        database_url = _database_url(settings)
    except ConfigError as e:
        raise click.ClickException(str(e)) from None
    try:
        run(_serve(database_url, settings, host, port, ui_url))
    except KeyboardInterrupt:
        pass
    except OSError as e:
        raise click.ClickException(f"cannot listen on {host}:{port}: {e.strerror or e}") from None

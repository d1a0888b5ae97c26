"""`gymflow codec`: the codec server for the Temporal UI and CLI (gymflow/codec/), in the foreground."""

from __future__ import annotations

import json
import signal

import click

from gymflow.cli.common import config_option, settings_or_exit, setup_logging
from gymflow.kernel.config import Settings

DEFAULT_ORIGINS = "http://localhost:8233,http://127.0.0.1:8233"  # the dev server's UI (`gymflow up`'s default)


def codec_database_url(settings: Settings) -> str:
    """The results database: DATABASE_URL / database.url, else the one a running `gymflow up` started."""
    from gymflow.kernel.connect import stack_file

    if settings.database.url:
        return settings.database.url
    path = stack_file(settings)
    if path.exists():
        return json.loads(path.read_text())["database_url"]
    raise click.ClickException(f"no database: set DATABASE_URL (or database.url), or start `gymflow up` "
                               f"(it writes {path})")


def origins_list(raw: str) -> tuple[str, ...]:
    origins = tuple(o.strip().rstrip("/") for o in raw.split(",") if o.strip())
    if not origins:
        raise click.BadParameter("name at least one origin, or '*' for any", param_hint="--cors-origins")
    return origins


@click.command()
@click.option("--port", type=click.IntRange(0, 65535), default=8234, show_default=True, envvar="GYMFLOW_CODEC_PORT",
              help="Port to listen on (0: a free one, printed at start).")
@click.option("--bind", default="127.0.0.1", show_default=True, envvar="GYMFLOW_CODEC_BIND",
              help="Address to listen on; 0.0.0.0 only inside a container or behind a proxy.")
@click.option("--cors-origins", default=DEFAULT_ORIGINS, show_default=True, envvar="GYMFLOW_CODEC_CORS_ORIGINS",
              help="Comma-separated origins of the Temporal UI that may call this server from a browser; "
                   "'*' allows any web page to read transcripts, so name the UI's origin instead.")
@config_option
@click.option("-v", "--verbose", is_flag=True)
def codec(port: int, bind: str, cors_origins: str, config_path: str | None, verbose: bool) -> None:
    """Serve Temporal's codec server protocol (POST /decode, /encode) so the Temporal UI and
    `temporal workflow show --codec-endpoint` show the messages behind the episode workflow's message ids.

    Point the UI at it with its codec endpoint setting (`gymflow up` does this for its own UI)."""
    from gymflow.codec.server import make_server
    from gymflow.kernel.store.db import database_location

    setup_logging(verbose)
    settings = settings_or_exit(config_path)
    url = codec_database_url(settings)
    try:
        server = make_server(url, port, bind=bind, origins=origins_list(cors_origins))
    except OSError as e:
        raise click.ClickException(f"cannot listen on {bind}:{port}: {e.strerror or e}") from None

    def _stop(*_: object) -> None:
        raise SystemExit(0)  # out of serve_forever, in the main thread

    signal.signal(signal.SIGTERM, _stop)
    click.echo(f"codec server: {server.url}   messages from {database_location(url)}   "
               f"CORS origins: {', '.join(server.origins)}", nl=True)
    try:
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()

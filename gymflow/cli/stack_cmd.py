"""`gymflow worker` (one pool) and `gymflow up` (the embedded stack plus every pool, in the foreground)."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import click

from gymflow.cli.common import config_option, run, settings_or_exit, setup_logging
from gymflow.cli.demo_models import model_options, policy_model
from gymflow.cli.probe import pool_models, probe_models
from gymflow.embedded import ENDPOINTS_PROBED_ENV, spawn_pool, start_stack, stop_all
from gymflow.kernel.config import Settings


@click.command()
@click.option("--pool", type=click.Choice(["workflows", "env", "generate", "all"]), required=True)
@config_option
@click.option("--metrics", "metrics_bind", default=None, envvar="GYMFLOW_METRICS_BIND", metavar="HOST:PORT",
              help="Serve Prometheus metrics (rollouts, rewards, generation latency, tool calls; the SDK's task slots, "
                   "schedule-to-start latency, pollers) at HOST:PORT/metrics, unauthenticated: `:PORT` is "
                   "127.0.0.1 only; name 0.0.0.0 to serve every interface. See docs/metrics.md.")
@click.option("--models", "models", default=None, envvar="GYMFLOW_MODELS", metavar="A,B",
              help="Generate pool: serve only these models (names under `models:`), polling only their task "
                   "queues. Default: every configured model.")
@click.option("-v", "--verbose", is_flag=True)
def worker(pool: str, config_path: str | None, metrics_bind: str | None, models: str | None, verbose: bool) -> None:
    """Run one worker pool until SIGTERM (in-flight work finishes first).

    At start it waits for Postgres and Temporal, up to $GYMFLOW_STARTUP_WAIT_S (default 300 s; 30 s when run at a
    terminal, where a person reads the one line that names the fix)."""
    from gymflow.activities.model_client import quiet_repeated_failures
    from gymflow.workers.run_pool import run_pool

    setup_logging(verbose)
    quiet_repeated_failures()  # an endpoint that is down: one warning per model and cause a minute, with a count
    served = models.split(",") if models is not None else None
    try:  # a Ctrl-C before the pool polls: one line, not click's "Aborted!" or a traceback
        settings = settings_or_exit(config_path)
        if not os.environ.get(ENDPOINTS_PROBED_ENV):  # under `gymflow up`, which said it once for all pools
            warn_about_endpoints(settings, pool_models(settings, pool, served))  # only the models this pool calls
    except KeyboardInterrupt:
        click.echo(f"pool {pool}: stopped before it started; nothing was running here", err=True)
        raise SystemExit(130) from None
    run(run_pool(settings, pool, metrics_bind, served, say=lambda line: click.echo(line, err=True)))  # type: ignore[arg-type]


def warn_about_endpoints(settings: Settings, names: list[str] | None = None) -> None:
    """One warning line per model endpoint that fails its probe; the endpoint may still come up later."""
    for line in asyncio.run(probe_models(settings, names)):
        click.echo(f"warning: {line} (rollouts of it fail until it answers)", err=True)


def _store_starting(ids: object) -> dict:
    from gymflow.codec.messages import StoreUnavailable

    raise StoreUnavailable("message store starting")


@click.command()
@config_option
@click.option("--pools", default="workflows,env,generate", show_default=True,
              help="Comma-separated pools to run as worker processes ('' for none).")
@click.option("--codec-port", type=click.IntRange(0, 65535), default=0,
              help="Port of the codec server the Temporal UI decodes payloads through (default: a free one).")
@model_options
def up(config_path: str | None, pools: str, codec_port: int, scripted: bool, local_model: bool) -> None:
    """Start the embedded stack (Temporal dev server, Postgres), the codec server its UI reads messages
    through (`gymflow codec`), and the worker pools; Ctrl-C stops all.

    --scripted / --local-model also serve model `policy` (as `gymflow demo` does), written with the config to
    <state_dir>/up-config.yaml: other commands reach it with `--config` that file."""
    setup_logging(False)
    settings = settings_or_exit(config_path)
    with policy_model(settings, config_path, "up", scripted=scripted, local=local_model) as policy:
        _up(policy.settings, policy.config_path, pools, codec_port)


def _up(settings: Settings, config_path: str | None, pools: str, codec_port: int) -> None:
    from gymflow.codec.messages import MessageLookup
    from gymflow.codec.server import CodecServer, serve_in_thread, ui_origins

    try:  # bound before the dev server starts, so the endpoint it is given is ours
        codec = CodecServer(("127.0.0.1", codec_port), _store_starting, ui_origins(settings.temporal.ui_port))
    except OSError as e:
        raise click.ClickException(f"codec server: cannot listen on 127.0.0.1:{codec_port}: {e.strerror or e}") \
            from None
    try:
        stack = start_stack(settings, codec_endpoint=codec.url)
    except BaseException:
        codec.server_close()
        raise
    addr = stack.addresses
    assert addr is not None
    codec.fetch = MessageLookup(addr.database_url).fetch
    serve_in_thread(codec)
    env = {**os.environ, "TEMPORAL_ADDRESS": addr.temporal_address, "DATABASE_URL": addr.database_url,
           ENDPOINTS_PROBED_ENV: "1"}
    names = [p for p in pools.split(",") if p]
    procs = {p: spawn_pool(p, env, config_path) for p in names}
    click.echo(f"Temporal: {addr.temporal_address}   Postgres: {addr.database_url}")
    if addr.ui_url:
        click.echo(f"Temporal UI: {addr.ui_url}")
    click.echo(f"Codec server: {codec.url}   (the UI shows the messages behind message ids through it)")
    click.echo(f"pools: {', '.join(names) or 'none'}   (Ctrl-C to stop)")
    warn_about_endpoints(settings)
    stopping = False

    def _stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # SIGHUP: the terminal closed
        signal.signal(sig, _stop)
    restarts = {p: 0 for p in names}
    try:
        while not stopping:
            time.sleep(0.5)
            for p, proc in list(procs.items()):
                if proc.poll() is not None and not stopping:
                    restarts[p] += 1
                    if restarts[p] > 5:
                        raise click.ClickException(f"pool {p} keeps exiting (code {proc.returncode}); see its log")
                    click.echo(f"pool {p} exited with {proc.returncode}; restarting", err=True)
                    procs[p] = spawn_pool(p, env, config_path)
    finally:
        if stopping:
            click.echo("stopping: the pools finish their in-flight calls first, then Temporal and Postgres")
        codec.shutdown()
        codec.server_close()
        stop_all(list(procs.values()), stack, settings)
        click.echo(f"stopped. Rollouts still running are kept in {settings.state_dir} and go on where they were "
                   "when `gymflow up` starts again.")

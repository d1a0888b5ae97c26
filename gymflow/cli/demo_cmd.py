"""`gymflow demo`: start the embedded stack and every pool, collect the single-tool example, stop.

The model is, in order: the scripted server (`--scripted`), `models.policy` from the config, or else the local
SmolLM2-135M server (gymflow.localmodel) started for the run on 127.0.0.1 and stopped after it."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Sequence
from pathlib import Path

import click
import httpx
from rich.console import Console

from gymflow.cli.collect_cmd import collect_dataset
from gymflow.cli.common import config_option, settings_or_exit, setup_logging
from gymflow.cli.progress import Tally
from gymflow.embedded import EmbeddedError, embedded_pools, local_policy, start_local_model, wait_for_pools, with_policy
from gymflow.kernel.config import ModelConfig, Settings

EXAMPLE = Path(__file__).resolve().parents[2].parent / "shared/data/nemo_gym/example_single_tool_call/example.jsonl"
# Short replies keep a CPU rollout to seconds a turn; the single-tool call fits in far fewer tokens.
LOCAL_MAX_TOKENS = 64


def _preflight(cfg: ModelConfig) -> None:
    """Fail in seconds with a clear message, rather than after a minute of retries."""
    try:
        httpx.get(cfg.base_url.rstrip("/") + "/models", timeout=5.0)
    except httpx.HTTPError as e:
        raise click.ClickException(f"model endpoint {cfg.base_url} is not reachable ({type(e).__name__}); "
                                   "start it, fix models.policy.base_url, or use --scripted") from None


@click.command()
@config_option
@click.option("--scripted", is_flag=True, help="Use a built-in scripted OpenAI-compatible server as the model.")
@click.option("--dataset", type=click.Path(dir_okay=False), default=str(EXAMPLE), show_default=True)
@click.option("--env", "env_name", default="single_tool", show_default=True)
@click.option("-n", "--samples", "n", default=2, show_default=True)
def demo(config_path: str | None, scripted: bool, dataset: str, env_name: str, n: int) -> None:
    """Run a small collection end to end on the embedded defaults, then stop everything."""
    setup_logging(False)
    settings = settings_or_exit(config_path)
    if not Path(dataset).exists():
        raise click.ClickException(f"dataset {dataset} not found")
    server = None
    try:  # whatever fails from here on, a model server this command started is stopped
        if scripted:
            from gymflow.testing.scripted_openai import ScriptedOpenAI, weather_responder

            server = ScriptedOpenAI(responder=weather_responder).start()
            config_path = str(Path(settings.state_dir) / "demo-config.yaml")
            settings = with_policy(settings, {"base_url": server.base_url, "model": "scripted-weather"},
                                   Path(config_path))
        elif "policy" not in settings.models:
            from gymflow.localmodel.resolve import DEFAULT_NAME

            click.echo("no model configured: starting the local model (SmolLM2-135M-Instruct on CPU; ~20 s to "
                       "load)")
            server = start_local_model(state_dir=settings.state_dir)
            click.echo(f"local model: {server.base_url}")
            config_path = str(Path(settings.state_dir) / "demo-config.yaml")
            settings = with_policy(settings, local_policy(server.base_url, DEFAULT_NAME), Path(config_path),
                                   {"max_tokens": LOCAL_MAX_TOKENS})
        else:
            _preflight(settings.models["policy"])
        _run_demo(settings, config_path, dataset, env_name, n)
    except EmbeddedError as e:
        raise click.ClickException(str(e)) from None
    finally:
        if server:
            server.stop()


async def _collect_when_polled(settings: Settings, procs: Sequence[subprocess.Popen], dataset: str, env_name: str,
                               n: int, console: Console) -> Tally:
    console.print("waiting for the worker pools to start polling")
    await wait_for_pools(settings, procs, "policy")
    tally = await collect_dataset(settings, dataset, env=env_name, model="policy", n=n, run_id=f"demo-{env_name}",
                                  console=console)
    await _afterword(settings, f"demo-{env_name}", console)
    return tally


async def _afterword(settings: Settings, run_id: str, console: Console) -> None:
    """The run's best and worst rollout, its report, while the stack is still up to read them from."""
    import sqlalchemy as sa

    from gymflow.kernel.store.reports import rollout_detail
    from gymflow.reports.data import load_run, make_linker, store_session
    from gymflow.reports.text import render_report, render_rollout

    linker = make_linker(settings, None)
    async with store_session(settings, on_wait=console.print) as session:
        ranked = (await session.execute(sa.text(
            "SELECT id FROM rollouts WHERE run_id = :r ORDER BY reward DESC NULLS LAST, id"), {"r": run_id})).scalars()
        ids = list(ranked)
        for label, rid in (("best", ids[0]), ("worst", ids[-1])) if ids else ():
            if (detail := await rollout_detail(session, rid)) is not None:
                console.rule(f"{label} rollout of the run: {rid}")
                render_rollout(console, detail, linker)
            if len(ids) == 1:
                break
        if (data := await load_run(session, run_id, per_type=3, examples=3)) is not None:
            console.rule("report")
            render_report(console, [data], linker)


def next_steps(env_name: str) -> str:
    """Where to go from the demo (the stack it started is stopped: `up` starts one that stays)."""
    return (f"next:\n"
            f"  gymflow up                       # the stack and pools in the foreground (model: gymflow.yaml, "
            f"see gymflow.example.yaml)\n"
            f"  gymflow report demo-{env_name}        # this run again, from a stack that is up\n"
            f"  gymflow collect your.jsonl --env {env_name} -n 8   # your own data (in another shell)")


def _run_demo(settings: Settings, config_path: str | None, dataset: str, env_name: str, n: int) -> None:
    console = Console()
    with embedded_pools(settings, config_path) as (settings, procs, addr):
        console.print(f"Temporal UI: {addr.ui_url}" if addr.ui_url else f"Temporal: {addr.temporal_address}")
        tally = asyncio.run(_collect_when_polled(settings, procs, dataset, env_name, n, console))
        console.print(f"results are in Postgres: {addr.database_url} (runs, rollouts, generations; "
                      "views run_scores, failure_counts, latency_percentiles)")
    console.print(next_steps(env_name))
    if tally.failed:
        raise SystemExit(1)

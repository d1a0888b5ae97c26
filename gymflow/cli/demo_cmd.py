"""`gymflow demo`: start the embedded stack and every pool, collect the single-tool example, stop."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import click
import httpx
import yaml
from rich.console import Console

from gymflow.cli.collect_cmd import collect_dataset
from gymflow.cli.common import config_option, settings_or_exit, setup_logging
from gymflow.cli.progress import Tally
from gymflow.cli.stack_cmd import spawn_pool, start_stack, stop_all
from gymflow.kernel.config import ModelConfig, Settings

POOLS_START_S = 120.0  # a cold start (imports, migrations) takes seconds; a pool that cannot start exits
EXAMPLE = Path(__file__).resolve().parents[2].parent / "shared/data/nemo_gym/example_single_tool_call/example.jsonl"
NO_MODEL = (
    "no model endpoint configured under models.{model}. Either run `gymflow demo --scripted` (a scripted "
    "OpenAI-compatible server stands in for the model), or copy gymflow.example.yaml to gymflow.yaml and set "
    "models.policy.base_url (any OpenAI-compatible endpoint: vLLM, OpenAI, Azure) and, if it needs a key, "
    "api_key_env (the NAME of the variable that holds it)."
)


def _preflight(cfg: ModelConfig) -> None:
    """Fail in seconds with a clear message, rather than after a minute of retries."""
    try:
        httpx.get(cfg.base_url.rstrip("/") + "/models", timeout=5.0)
    except httpx.HTTPError as e:
        raise click.ClickException(f"model endpoint {cfg.base_url} is not reachable ({type(e).__name__}); "
                                   "start it, fix models.policy.base_url, or use --scripted") from None


def _with_scripted_model(settings: Settings, base_url: str, config_out: Path) -> Settings:
    raw = settings.model_dump(mode="json", exclude_none=True)
    raw["models"] = {**raw.get("models", {}), "policy": {"base_url": base_url, "model": "scripted-weather"}}
    config_out.parent.mkdir(parents=True, exist_ok=True)
    config_out.write_text(yaml.safe_dump(raw))
    return Settings.model_validate(raw)


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
    if scripted:
        from gymflow.testing.scripted_openai import ScriptedOpenAI, weather_responder

        server = ScriptedOpenAI(responder=weather_responder).start()
        config_path = str(Path(settings.state_dir) / "demo-config.yaml")
        settings = _with_scripted_model(settings, server.base_url, Path(config_path))
    elif "policy" not in settings.models:
        raise click.ClickException(NO_MODEL.format(model="policy"))
    else:
        _preflight(settings.models["policy"])
    try:
        _run_demo(settings, config_path, dataset, env_name, n)
    finally:
        if server:
            server.stop()


async def _wait_for_pools(settings: Settings, procs: Sequence[subprocess.Popen], model: str,
                          timeout_s: float = POOLS_START_S) -> None:
    """Return once every queue the collection needs is polled. collect warns about a queue nobody polls,
    and here that would only mean that the pools this command just spawned are still starting."""
    from workers.connect import connect_configured
    from workers.health import idle_pools

    client = await connect_configured(settings, wait_s=timeout_s)
    deadline = time.monotonic() + timeout_s
    while idle := await idle_pools(client, [model]):
        if dead := [p for p in procs if p.poll() is not None]:
            raise click.ClickException(f"a worker pool exited with code {dead[0].returncode} while starting "
                                       "(its log is above)")
        if time.monotonic() > deadline:
            raise click.ClickException(f"no worker polled {', '.join(idle)} within {timeout_s:.0f} s of starting")
        await asyncio.sleep(0.25)


async def _collect_when_polled(settings: Settings, procs: Sequence[subprocess.Popen], dataset: str, env_name: str,
                               n: int, console: Console) -> Tally:
    console.print("waiting for the worker pools to start polling")
    await _wait_for_pools(settings, procs, "policy")
    return await collect_dataset(settings, dataset, env=env_name, model="policy", n=n, run_id=f"demo-{env_name}",
                                 console=console)


def _run_demo(settings: Settings, config_path: str | None, dataset: str, env_name: str, n: int) -> None:
    console = Console()
    stack = start_stack(settings)
    addr = stack.addresses
    assert addr is not None
    env = {**os.environ, "TEMPORAL_ADDRESS": addr.temporal_address, "DATABASE_URL": addr.database_url}
    procs = [spawn_pool(p, env, config_path) for p in ("workflows", "env", "generate")]
    console.print(f"Temporal UI: {addr.ui_url}" if addr.ui_url else f"Temporal: {addr.temporal_address}")
    try:
        settings = settings.model_copy(update={
            "temporal": settings.temporal.model_copy(update={"address": addr.temporal_address}),
            "database": settings.database.model_copy(update={"url": addr.database_url})})
        tally = asyncio.run(_collect_when_polled(settings, procs, dataset, env_name, n, console))
        console.print(f"results are in Postgres: {addr.database_url} (tables runs, rollouts, generations; "
                      "views run_scores, failure_counts, latency_percentiles)")
    finally:
        stop_all(procs, stack, settings)
    if tally.failed:
        raise SystemExit(1)

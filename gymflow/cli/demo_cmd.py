"""`gymflow demo`: start the embedded stack and every pool, collect the single-tool example, stop."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import click
from rich.console import Console

from gymflow.cli.collect_cmd import collect_dataset
from gymflow.cli.common import config_option, settings_or_exit, setup_logging
from gymflow.cli.stack_cmd import spawn_pool, start_stack
from gymflow.kernel.config import Settings
from workers.connect import stack_file

EXAMPLE = Path("../shared/data/nemo_gym/example_single_tool_call/example.jsonl")


async def _wait_for_workers(settings: Settings) -> None:
    await asyncio.sleep(2.0)  # pools connect and start polling; work queued before that simply waits


@click.command()
@config_option
@click.option("--dataset", type=click.Path(dir_okay=False), default=str(EXAMPLE), show_default=True)
@click.option("--env", "env_name", default="single_tool", show_default=True)
@click.option("--model", default="policy", show_default=True)
@click.option("-n", "--samples", "n", default=2, show_default=True)
def demo(config_path: str | None, dataset: str, env_name: str, model: str, n: int) -> None:
    """Run a small collection end to end on the embedded defaults against the configured model."""
    setup_logging(False)
    settings = settings_or_exit(config_path)
    if model not in settings.models:
        raise click.ClickException(
            f"no model endpoint configured under models.{model}. Copy gymflow.example.yaml to gymflow.yaml and "
            "set models.policy.base_url (any OpenAI-compatible endpoint: vLLM, OpenAI, Azure) and, if it "
            "needs one, api_key_env (the NAME of the variable that holds the key).")
    if not Path(dataset).exists():
        raise click.ClickException(f"dataset {dataset} not found")
    console = Console()
    stack = start_stack(settings)
    addr = stack.addresses
    assert addr is not None
    env = {**os.environ, "TEMPORAL_ADDRESS": addr.temporal_address, "DATABASE_URL": addr.database_url}
    procs = [spawn_pool(p, env, config_path) for p in ("workflows", "env", "generate")]
    console.print(f"Temporal UI: {addr.ui_url}" if addr.ui_url else f"Temporal: {addr.temporal_address}")
    try:
        settings = settings.model_copy(update={"temporal": settings.temporal.model_copy(
            update={"address": addr.temporal_address}), "database": settings.database.model_copy(
            update={"url": addr.database_url})})
        tally = asyncio.run(collect_dataset(settings, dataset, env=env_name, model=model, n=n,
                                            run_id=f"demo-{env_name}-{model}", console=console))
        console.print(f"results are in Postgres: {addr.database_url} (table rollouts)")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=40)
        stack_file(settings).unlink(missing_ok=True)
        stack.stop()
    if tally.failed:
        raise SystemExit(1)

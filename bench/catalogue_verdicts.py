"""The catalogue bench's two verdicts on a server's rows: NeMo Gym's own server code driven as its agents drive it, and
gymflow's full stack replaying the recordings; and their comparison (bench/nemo_gym_catalogue.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa
import yaml
from gymflow.environments import nemo_gym_catalogue as catalogue
from gymflow.environments import nemo_gym_server as managed
from gymflow.workers.local_stack import LocalStack, free_port

from bench.catalogue_plan import MAX_TURNS, REQUEST_TIMEOUT_S, START_TIMEOUT_S, TOL, Plan, input_row
from bench.stack import stop_processes
from gymflow.client import GymflowClient
from gymflow.data.datasets import load_jsonl
from gymflow.kernel.config import load_settings
from gymflow.kernel.recorded_ids import default_task_id, recorded_sample
from gymflow.kernel.store.db import make_engine

# ---- NeMo Gym's own verdict -----------------------------------------------------------------------------------


def _last_exception(log: str) -> str:
    """The last exception line of a server's log (a 500's body is only 'Internal Server Error')."""
    lines = [ln.strip() for ln in log.splitlines()
             if re.match(r"^\s*([\w.]+(Error|Exception|Exit)|AssertionError|KeyError|ValidationError)\b", ln)
             or re.match(r"^\s*[\w.]+Error:", ln)]
    return lines[-1][:400] if lines else ""


async def _tool_calls(client: httpx.AsyncClient, response: dict[str, Any], cookies: httpx.Cookies) -> int:
    """The recorded function calls posted to the server in order, as the simple agent posts them (a stateful
    server's verify reads the state they leave); their replies are not compared (the recorded response is)."""
    calls = 0
    for item in response.get("output") or []:
        if not isinstance(item, dict) or item.get("type") != "function_call":
            continue
        try:
            args = json.loads(item.get("arguments") or "")
        except (ValueError, TypeError):
            continue  # the agent answers invalid arguments itself, without the server
        reply = await client.post(f"/{item.get('name')}", json=args, cookies=cookies)
        cookies.update(reply.cookies)
        calls += 1
    return calls


async def _nemo_one(client: httpx.AsyncClient, srv: managed.ManagedServer, body: dict[str, Any],
                    response: dict[str, Any]) -> dict[str, Any]:
    client.cookies.clear()  # each row its own session, as each rollout is
    log_before = len(srv.log.read_text(errors="replace")) if srv.log.exists() else 0

    def log() -> str:
        return _last_exception(srv.log.read_text(errors="replace")[log_before:])
    try:
        seed = await client.post("/seed_session", json=body)
        if seed.status_code >= 300:
            return {"error": f"/seed_session HTTP {seed.status_code}: {seed.text[:300]}", "log": log()}
        cookies = httpx.Cookies(seed.cookies)
        calls = await _tool_calls(client, response, cookies)
        verify = await client.post("/verify", json={**body, "response": response}, cookies=cookies)
    except httpx.HTTPError as e:
        return {"error": f"{type(e).__name__}: {e}"[:300]}
    if verify.status_code >= 300:
        return {"error": f"/verify HTTP {verify.status_code}: {verify.text[:300]}", "log": log()}
    try:
        out = verify.json()
        reward = out["reward"]
    except (ValueError, KeyError, TypeError):
        return {"error": f"/verify answered no reward: {verify.text[:300]}"}
    return {"reward": reward, "masked": out.get("mask_sample") is True, "tool_calls": calls}


GYMNASIUM_OUTCOME = ("terminated", "truncated", "info")  # GymnasiumRunResponse's own fields: the reply's, not the row's


def _model_turns(output: list[Any]) -> list[list[dict[str, Any]]]:
    """The recorded output items, one list per model turn: a turn ends at the environment's items (tool outputs,
    a user message: its observation), which the gymnasium agent appended, not the model."""
    turns: list[list[dict[str, Any]]] = [[]]
    for item in output:
        if not isinstance(item, dict):
            continue
        ours = item.get("type") == "function_call_output" or (item.get("type") == "message"
                                                                and item.get("role", "assistant") != "assistant")
        if ours:
            if turns[-1]:
                turns.append([])
        else:
            turns[-1].append(item)
    return [t for t in turns if t]


async def _nemo_gymnasium(client: httpx.AsyncClient, srv: managed.ManagedServer, body: dict[str, Any],
                          response: dict[str, Any], max_steps: int) -> dict[str, Any]:
    """The server driven as NeMo Gym's gymnasium agent drives it (responses_api_agents/gymnasium_agent/app.py):
    /reset with the row, each recorded model turn's output to /step in the session, the steps' rewards summed,
    until terminated, truncated or max_steps."""
    client.cookies.clear()
    body = {k: v for k, v in body.items() if k not in GYMNASIUM_OUTCOME}
    log_before = len(srv.log.read_text(errors="replace")) if srv.log.exists() else 0

    def log() -> str:
        return _last_exception(srv.log.read_text(errors="replace")[log_before:])
    total, steps = 0.0, 0
    try:
        reset = await client.post("/reset", json=body)
        if reset.status_code >= 300:
            return {"error": f"/reset HTTP {reset.status_code}: {reset.text[:300]}", "log": log()}
        cookies = httpx.Cookies(reset.cookies)
        for turn in _model_turns(response.get("output") or [])[:max_steps]:
            step = await client.post("/step", json={**body, "response": {**response, "output": turn}},
                                     cookies=cookies)
            if step.status_code >= 300:
                return {"error": f"/step HTTP {step.status_code}: {step.text[:300]}", "log": log()}
            cookies.update(step.cookies)
            out = step.json()
            total, steps = total + float(out.get("reward") or 0.0), steps + 1
            if out.get("terminated") or out.get("truncated"):
                break
    except httpx.HTTPError as e:
        return {"error": f"{type(e).__name__}: {e}"[:300]}
    except (ValueError, TypeError) as e:
        return {"error": f"/step answered no step: {e}"[:300]}
    return {"reward": total, "masked": False, "tool_calls": steps}


async def _reply_only(client: httpx.AsyncClient) -> frozenset[str]:
    """The server's /verify reply fields that its request model lacks, from its OpenAPI schema (empty if none)."""
    try:
        spec = (await client.get("/openapi.json")).json()
        post, models = spec["paths"]["/verify"]["post"], spec["components"]["schemas"]

        def fields(schema: dict[str, Any]) -> set[str]:
            return set(models[schema["$ref"].rsplit("/", 1)[-1]].get("properties") or {})
        return frozenset(fields(post["responses"]["200"]["content"]["application/json"]["schema"])
                         - fields(post["requestBody"]["content"]["application/json"]["schema"]))
    except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError):
        return frozenset()


async def nemo_verdicts(p: Plan) -> dict[str, Any]:
    """NeMo Gym's reward for each row, from its own server code, or why it could not give one."""
    spec = managed.Spec.of(p.server, None, p.overrides)
    srv = managed.ManagedServer(spec)
    try:
        try:
            url, _ = await srv.ensure()
        except Exception as e:  # noqa: BLE001 - any start failure is the row's verdict
            log = srv.log.read_text(errors="replace") if srv.log.exists() else ""
            why = _last_exception(log) or re.sub(r"; fix: .*", "", str(e), flags=re.S)
            return {"start_error": f"did not start: {why}"[:600], "start_log_tail": log[-1500:], "rows": []}
        agent = catalogue.agent(catalogue.server(p.server))
        async with httpx.AsyncClient(base_url=url, timeout=REQUEST_TIMEOUT_S, trust_env=False) as client:
            reply_only = await _reply_only(client)
            rows = []
            for joined, rec, task in zip(p.rows, p.recorded, p.tasks, strict=True):
                body = input_row(joined, rec, task, reply_only)
                if agent.name == "gymnasium_agent":  # /reset and /step, not /seed_session and /verify
                    rows.append(await _nemo_gymnasium(client, srv, body, rec["response"], agent.max_steps or 10))
                else:
                    rows.append(await _nemo_one(client, srv, body, rec["response"]))
        return {"rows": rows, "reply_only": sorted(reply_only)}
    finally:
        srv.stop()


# ---- gymflow's verdict ----------------------------------------------------------------------------------------


class Stack:
    """Temporal dev server, embedded Postgres and the three pools, with one recorded model per server."""

    def __init__(self, work: Path, models: dict[str, Path]) -> None:
        self.work, self.models = work, models
        self.local: LocalStack | None = None
        self.procs: list[subprocess.Popen[bytes]] = []
        self.client: GymflowClient | None = None

    async def start(self) -> GymflowClient:
        self.work.mkdir(parents=True, exist_ok=True)
        self.local = LocalStack(self.work / "state", port=free_port(), headless=True)
        addr = self.local.start()
        config = self.work / "gymflow.yaml"
        config.write_text(yaml.safe_dump({
            "temporal": {"address": addr.temporal_address}, "database": {"url": addr.database_url},
            "models": {name: {"recorded": str(path)} for name, path in self.models.items()},
            "pools": {"generate": {"concurrency": 16}, "env": {"concurrency": 16}, "workflows": {"concurrency": 32}},
            "rollout": {"max_turns": MAX_TURNS},
        }))
        env = {**os.environ, catalogue.PYTHON_ENV: str(catalogue.python()),
               managed.START_TIMEOUT_ENV: START_TIMEOUT_S, "GYMFLOW_NEMO_GYM_TIMEOUT_S": str(REQUEST_TIMEOUT_S)}
        for pool in ("workflows", "env", "generate"):
            out = (self.work / f"pool-{pool}.log").open("ab")
            self.procs.append(subprocess.Popen([sys.executable, "-m", "gymflow.cli.main", "worker", "--pool", pool,
                                                "--config", str(config)], stdout=out, stderr=subprocess.STDOUT,
                                               env=env))
        settings = load_settings(config, env={})
        self.client = await GymflowClient.connect(settings)
        await asyncio.sleep(3)  # the pools start polling
        return self.client

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()
        stop_processes(self.procs)
        if self.local is not None:
            self.local.stop()


def _row_keys(p: Plan) -> list[tuple[str, int]]:
    """(task id, sample index) of each row, as the dataset loader and the recorded model name it."""
    assert p.file is not None
    stem = p.file.stem
    by_task: dict[str, list[tuple[int, int]]] = {}
    for i, row in enumerate(p.rows):
        task_id = str(row.get("id", default_task_id(stem, i + 1, row)))
        by_task.setdefault(task_id, []).append((recorded_sample(row) or 0, i))
    keys: list[tuple[str, int]] = [("", 0)] * len(p.rows)
    for task_id, items in by_task.items():
        for k, (_, i) in enumerate(sorted(items, key=lambda it: it[0])):
            keys[i] = (task_id, k)
    return keys


async def _add_details(client: GymflowClient, run_id: str, got: dict[tuple[str, int], dict[str, Any]]) -> None:
    """The stored failure message and score details of each rollout (a summary's message can be empty)."""
    engine = make_engine(client.settings.database.url, pool_size=1)
    try:
        async with engine.connect() as conn:
            rows = await conn.execute(sa.text("SELECT task_id, sample_index, failure_message, score_details "
                                              "FROM rollouts WHERE run_id = :r"), {"r": run_id})
            for task_id, sample, message, details in rows:
                if (task_id, sample) in got:
                    got[(task_id, sample)]["failure"] = (got[(task_id, sample)]["failure"] or "") + \
                        (f" | {message[:600]}" if message else "")
                    got[(task_id, sample)]["details"] = json.loads(json.dumps(details, default=str)[:2000]) \
                        if len(json.dumps(details, default=str)) <= 2000 else str(details)[:2000]
    finally:
        await engine.dispose()


async def gymflow_verdicts(client: GymflowClient, p: Plan, model: str) -> dict[str, Any]:
    """gymflow's reward (or failure) for each row, from one collect on the stack."""
    assert p.file is not None
    counts: dict[str, int] = {}
    tasks, errors = load_jsonl(p.file, env="nemo_gym", samples=counts)
    keys = _row_keys(p)
    got: dict[tuple[str, int], dict[str, Any]] = {}
    by_n: dict[int, list[Any]] = {}
    for t in tasks:
        by_n.setdefault(counts.get(t.id, 1), []).append(t)
    run = f"catalogue-{p.server}-{time.strftime('%H%M%S')}"
    for n, group in sorted(by_n.items()):
        async with contextlib.aclosing(client.collect(f"{run}-n{n}", group, n=n, model=model,
                                                      max_turns=MAX_TURNS, max_in_flight=8)) as results:
            async for r in results:
                s = r.summary
                got[(s.task_id, s.sample_index)] = {
                    "status": str(s.status), "reward": s.reward, "masked": s.masked,
                    "failure": f"{s.failure_type}: {s.failure_message}"[:600] if s.failure_type else None}
        await _add_details(client, f"{run}-n{n}", got)
    load_errors = {e.line: str(e) for e in errors}
    rows = []
    for i, key in enumerate(keys):
        if i + 1 in load_errors:
            rows.append({"status": "not loaded", "reward": None, "failure": load_errors[i + 1][:600]})
        else:
            rows.append(got.get(key, {"status": "missing", "reward": None, "failure": "no result for this row"}))
    return {"rows": rows}


# ---- comparing ------------------------------------------------------------------------------------------------


def _same(a: Any, b: Any) -> bool:
    return isinstance(a, (int, float)) and isinstance(b, (int, float)) and abs(float(a) - float(b)) <= TOL


def compare(p: Plan, nemo: dict[str, Any], gym: dict[str, Any]) -> dict[str, Any]:
    """Per row: NeMo Gym's verdict, gymflow's, the recorded reward, and whether gymflow agrees with NeMo Gym."""
    out = []
    for i, row in enumerate(p.rows):
        n = nemo["rows"][i] if i < len(nemo.get("rows", [])) else {"error": nemo.get("start_error", "not run")}
        g = gym["rows"][i] if i < len(gym.get("rows", [])) else {"status": "not run", "reward": None}
        if "error" in n:
            verdict = "not runnable"
        elif n.get("masked"):
            verdict = "agree" if g.get("masked") else "disagree"
        else:
            verdict = "agree" if _same(n["reward"], g.get("reward")) and not g.get("masked") else "disagree"
        out.append({"row": i, "recorded": row.get("reward"), "nemo_gym": n, "gymflow": g, "verdict": verdict,
                    "nemo_matches_recorded": _same(n.get("reward"), row.get("reward"))})
    return {"rows": out}



"""Measured coverage of NeMo Gym 0.7.0's catalogue: every installed resources server's recorded rollouts, scored by
NeMo Gym's own server code and by gymflow's full stack, row by row.

    python -m bench.nemo_gym_catalogue                                  # every server (~25 min on 2 cores)
    python -m bench.nemo_gym_catalogue --servers xlam_fc,math_with_judge
    python -m bench.nemo_gym_catalogue --resume                         # skip servers already done

For each server of the catalogue (environments/nemo_gym_catalogue.py) with a `data/example_rollouts.jsonl`:

NeMo Gym's verdict: the server started by NeMo Gym's own code (`python app.py` under NeMo Gym's Python with the
config `ng_run` hands its children: environments/nemo_gym_launch.py), driven as NeMo Gym's simple agent drives it
(responses_api_agents/simple_agent/app.py `run`): POST /seed_session with the row, each recorded function call to
POST /<tool> in the session (a stateful server's verify reads what they did), then POST /verify with the row and its
recorded `response` (every output item), with the session's cookies; `reward` of the reply.

gymflow's verdict: the same rows through gymflow's stack (Temporal dev server, embedded Postgres, the three pools as
`gymflow worker` processes) on the `nemo_gym` environment, whose env pool starts its own copy of the server; the
model is a recorded one (`recorded: FILE`), which replays the row's `response.output` turn by turn, so the tool calls
run on the server again and the verify request is built by gymflow from its own transcript.

gymflow's rows are the rollout file joined with the server's `example.jsonl`, as `gymflow data join` writes them
(gymflow.data.prepare.join: task fields the rollout rows omit, sample numbering, replay fields). NeMo Gym's row is
the request its agent sent, as its own `reverify` rebuilds it: the rollout row (the verify reply, which echoes the
request) less the reply's own fields and the nulls of its `responses_create_params` dump, over the same task. A
recording that ends on a tool call (a single-step agent) is replayed with that many turns.

Servers whose config calls a model (a judge) get the same fake judge on both sides, through the overrides
(`gymflow_model_urls`): an OpenAI-compatible Responses/Chat server answering every request with one fixed verdict
(JUDGE_VERDICT). Results go to one JSON file per server under --work as they finish (`--resume` skips those);
docs/nemo-gym-catalogue.md is written from them (`--render-only`: from those there are).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa
import yaml
from gymflow.activities.recorded import split_turns
from gymflow.environments import nemo_gym_catalogue as catalogue
from gymflow.environments import nemo_gym_server as managed
from gymflow.workers.local_stack import LocalStack, free_port

from gymflow.client import GymflowClient
from gymflow.data.datasets import load_jsonl
from gymflow.data.prepare import conversation_key, join, match_task, tasks_by_position
from gymflow.kernel.config import load_settings
from gymflow.kernel.recorded_ids import default_task_id, recorded_sample
from gymflow.kernel.store.db import make_engine

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "bench" / "results" / "nemo-gym-catalogue"
DOC = ROOT / "docs" / "nemo-gym-catalogue.md"
NEMO_PYTHON = ROOT / ".nemo313" / "bin" / "python"
SERVER_TIMEOUT_S = 180.0  # per side, per server
REQUEST_TIMEOUT_S = 110.0  # one NeMo Gym request (the env activity's 120 s bounds gymflow's)
START_TIMEOUT_S = "150"  # a cold NeMo Gym import next to another server's on 2 cores
BATCH = 12  # servers per stack: the env pool keeps each server it started until it stops
MAX_TURNS = 200  # no recorded rollout is cut short by gymflow's default turn limit
OURS = ("resources_server", "resources_server_config", "resources_server_overrides", "env")
# NeMo Gym's verify-response fields: a rollout row's outcome, never part of a request.
OUTCOME = ("reward", "response", "mask_sample", "failure_kind", "failure_reason")
JUDGE_VERDICT = "[[A=B]]"  # one fixed answer to every judge prompt, the same on both sides
TOL = 1e-6


# ---- the fake judge -------------------------------------------------------------------------------------------


def _judge_reply(path: str, model: str) -> dict[str, Any]:
    if path.endswith("/chat/completions"):
        return {"id": "chatcmpl-judge", "object": "chat.completion", "created": 0, "model": model,
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": JUDGE_VERDICT}}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
    return {"id": "resp_judge", "object": "response", "created_at": 0.0, "model": model, "status": "completed",
            "output": [{"type": "message", "id": "msg_judge", "role": "assistant", "status": "completed",
                        "content": [{"type": "output_text", "text": JUDGE_VERDICT, "annotations": []}]}],
            "tools": [], "tool_choice": "auto", "parallel_tool_calls": True, "incomplete_details": None,
            "error": None, "metadata": {},
            "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2,
                      "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}}}


class _JudgeHandler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        try:
            model = str(json.loads(body or b"{}").get("model") or "judge")
        except ValueError:
            model = "judge"
        out = json.dumps(_judge_reply(self.path, model)).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def do_GET(self) -> None:  # noqa: N802
        self.send_response(200)
        self.end_headers()

    def log_message(self, *_: Any) -> None:
        pass


def start_judge() -> tuple[ThreadingHTTPServer, str]:
    """The fake judge on a thread of this process: (server, its base URL)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _JudgeHandler)
    threading.Thread(target=server.serve_forever, daemon=True, name="fake-judge").start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


# ---- what each server gets ------------------------------------------------------------------------------------


@dataclass
class Plan:
    server: str
    rows: list[dict[str, Any]] = field(default_factory=list)  # joined rows: gymflow's dataset and recorded model
    recorded: list[dict[str, Any]] = field(default_factory=list)  # the rollout rows as shipped
    tasks: list[dict[str, Any] | None] = field(default_factory=list)  # each one's example.jsonl task, if any
    agents: list[str] = field(default_factory=list)  # the config's allowed_agents (empty: any)
    file: Path | None = None  # the rows as gymflow's dataset and recorded model
    overrides: dict[str, Any] = field(default_factory=dict)
    not_runnable: str | None = None
    judge: list[str] = field(default_factory=list)  # model servers the config calls (given the fake judge)
    notes: list[str] = field(default_factory=list)


def _judge_names(info: catalogue.ServerInfo) -> list[str]:
    if not info.configs:
        return []
    path = catalogue.default_config(info)
    top = catalogue.load_config(path)
    _, cfg = catalogue.resources_entry(top, info.name, path)
    names: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            if value.get("type") == "responses_api_models" and isinstance(value.get("name"), str):
                name = value["name"]
                ref = re.fullmatch(r"\$\{([^}]+)\}", name)
                names.append(str(top.get(ref.group(1), name)) if ref else name)
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)
    walk(cfg)
    return sorted(set(names))


def _allowed_agents(info: catalogue.ServerInfo) -> list[str]:
    if not info.configs:
        return []
    path = catalogue.default_config(info)
    _, cfg = catalogue.resources_entry(catalogue.load_config(path), info.name, path)
    agents = cfg.get("allowed_agents") or []
    return [str(a) for a in agents] if isinstance(agents, list) else [str(agents)]


def _read_rollouts(path: Path) -> tuple[list[dict[str, Any]], str | None]:
    try:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except ValueError:
        head = path.read_text()[:40].splitlines()[0] if path.stat().st_size else ""
        return [], f"data not shipped: example_rollouts.jsonl is not JSON (its rows read {head!r})"
    if not rows:
        return [], "data not shipped: example_rollouts.jsonl is empty"
    if any(not isinstance(r, dict) or not isinstance(r.get("response"), dict) for r in rows):
        return [], "data not shipped: its rollout rows carry no recorded `response` (nothing to replay or verify)"
    return rows, None


def _prompt_key(row: dict[str, Any]) -> str:
    return conversation_key((row.get("responses_create_params") or {}).get("input") or [])


def _tasks_of(recorded: list[dict[str, Any]], tasks: Path | None) -> list[dict[str, Any] | None]:
    """Each recording's example.jsonl task, as `gymflow data join` matches them (by `_ng_task_index` where the
    prompts agree: tasks a seed apart share a prompt)."""
    if tasks is None:
        return [None] * len(recorded)
    at = tasks_by_position(tasks)
    index = {key: (position, row) for position, (key, row) in at.items()}
    return [(match_task(r, _prompt_key(r), at, index)[1] or (None, None))[1] for r in recorded]


def _pruned(value: Any) -> Any:
    """A recorded `responses_create_params` without its nulls (the rollout file echoes every unset field as null,
    which NeMo Gym's own request model then rejects: `parallel_tool_calls: null`)."""
    if isinstance(value, dict):
        return {k: _pruned(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_pruned(v) for v in value]
    return value


def _input_row(joined: dict[str, Any], recorded: dict[str, Any], task: dict[str, Any] | None,
               reply_only: frozenset[str]) -> dict[str, Any]:
    """What NeMo Gym's agent sent for this rollout, as its own `reverify` rebuilds it from the materialized input
    row. A rollout row is the verify reply, which echoes the request: less the reply's own fields (OUTCOME and
    `reply_only`, the server's reply fields its request model lacks, from its OpenAPI schema) and the nulls its
    dump adds to `responses_create_params`, it is that request. Over the example.jsonl task with the same prompt
    (fields the echo drops, e.g. a seed's), with the replay fields `join` adds (the judge off, a completion tool)."""
    added = {k: v for k, v in joined.items() if k not in recorded and (task is None or k not in task)}
    echo = {k: v for k, v in recorded.items() if k not in OUTCOME and k not in reply_only}
    echo["responses_create_params"] = _pruned(echo.get("responses_create_params") or {})
    return {**(task or {}), **echo, **added}


def _turn_limit(row: dict[str, Any]) -> dict[str, Any]:
    """`max_turns` for a recording that ends on a tool call or its output (circle_click): NeMo Gym's agent stopped
    there (a single-step agent, its max_steps), which it keeps in its config, not the row; the replay stops there
    too, not asking for a turn the recording does not have (recording_exhausted)."""
    output = [o for o in (row.get("response") or {}).get("output") or [] if isinstance(o, dict)]
    last = next((o for o in reversed(output) if o.get("type") != "reasoning"), None)
    if last is None or last.get("type") not in ("function_call", "function_call_output") or "max_turns" in row:
        return {}
    return {"max_turns": len(split_turns(output))}


# Config values a server refuses to start without, for a part of it that cannot run offline anyway: given on both
# sides (as row overrides), so that what runs offline (its verify) is compared. google_search: the search API's
# credentials (its search tool then fails as it would without network; /verify reads only the answer).
OFFLINE_PLACEHOLDERS: dict[str, dict[str, str]] = {
    "google_search": {"google_api_key": "offline-placeholder", "google_cx": "offline-placeholder"}}


def plan(info: catalogue.ServerInfo, work: Path, judge_url: str, limit: int | None) -> Plan:
    """The joined rows of one server, or why it cannot run."""
    p = Plan(info.name)
    rollouts = info.folder / "data" / "example_rollouts.jsonl"
    placeholders = OFFLINE_PLACEHOLDERS.get(info.name, {})
    if placeholders and info.refusal and info.refusal.startswith("its config needs values nobody set"):
        p.overrides = dict(placeholders)
        p.notes.append(f"given placeholder config values ({', '.join(placeholders)}): {info.refusal}")
    elif info.refusal:
        p.not_runnable = f"refused by gymflow's catalogue: {info.refusal}"
        return p
    if not rollouts.exists():
        p.not_runnable = "data not shipped: no data/example_rollouts.jsonl"
        return p
    _, problem = _read_rollouts(rollouts)
    if problem:
        p.not_runnable = problem
        return p
    p.judge = _judge_names(info)
    if p.judge:
        p.overrides["gymflow_model_urls"] = {name: judge_url for name in p.judge}
    rows_dir = work / "rows"
    rows_dir.mkdir(parents=True, exist_ok=True)
    joined = rows_dir / f"{info.name}.joined.jsonl"
    tasks = info.examples if info.examples.exists() else None
    report = join(rollouts, tasks, joined)
    if report.errors:
        p.notes.append(f"join: {len(report.errors)} bad line(s), first: {report.errors[0]}")
    if report.unmatched:
        p.notes.append(f"join: rollout line(s) {report.unmatched} match no task of example.jsonl (kept as recorded)")
    rows = [json.loads(line) for line in joined.read_text().splitlines() if line.strip()]
    recorded, _ = _read_rollouts(rollouts)
    if len(rows) != len(recorded):  # rows the join refused cannot be lined up with their recordings
        p.not_runnable = (f"rows gymflow cannot load: {len(recorded) - len(rows)} of {len(recorded)} rollout "
                          f"line(s) cannot be joined ({report.errors[0] if report.errors else 'dropped'})")
        agent = (recorded[0].get("agent_ref") or {}).get("name") if recorded else None
        if isinstance(agent, str) and agent.endswith("_agent") and "simple" not in agent:
            p.not_runnable = (f"another agent's protocol: NeMo Gym drives it with its own {agent}, which builds the "
                              f"prompt (the rows' `input` is empty); {p.not_runnable}")
        return p
    rows, recorded = (rows[:limit], recorded[:limit]) if limit else (rows, recorded)
    p.recorded, p.tasks = recorded, _tasks_of(recorded, tasks)
    p.agents = _allowed_agents(info)
    extra = {"resources_server": info.name, **({"resources_server_overrides": p.overrides} if p.overrides else {})}
    p.rows = [{**r, **extra, **_turn_limit(r)} for r in rows]
    p.file = rows_dir / f"{info.name}.jsonl"
    p.file.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in p.rows))
    return p


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
                body = _input_row(joined, rec, task, reply_only)
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
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
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


# ---- one server -----------------------------------------------------------------------------------------------


async def _bounded(what: str, coro: Any, timeout: float) -> dict[str, Any]:
    try:
        return await asyncio.wait_for(coro, timeout)
    except TimeoutError:
        return {"start_error": f"{what}: no verdict within {timeout:g} s (--timeout)", "rows": []}


async def run_server(p: Plan, client: GymflowClient | None, model: str, timeout: float) -> dict[str, Any]:
    t0 = time.monotonic()
    result: dict[str, Any] = {"server": p.server, "judge": p.judge, "notes": p.notes, "agents": p.agents,
                              "not_runnable": p.not_runnable, "rows": []}
    if p.not_runnable is None:
        nemo = await _bounded("NeMo Gym", nemo_verdicts(p), timeout)
        result["reply_only"] = nemo.get("reply_only", [])
        if nemo.get("start_error"):
            result["not_runnable"] = f"NeMo Gym's own server: {nemo['start_error']}"
        if nemo.get("rows") and any("error" not in r for r in nemo["rows"]) and client is not None:
            gym = await _bounded("gymflow", gymflow_verdicts(client, p, model), timeout)
            if gym.get("start_error"):
                result["gymflow_error"] = gym["start_error"]
        else:
            gym = {"rows": []}
        result["rows"] = compare(p, nemo, gym)["rows"]
        if result["rows"] and all(r["verdict"] == "not runnable" for r in result["rows"]):
            result["not_runnable"] = result["not_runnable"] or "NeMo Gym's own server fails every row"
    result["wall_s"] = round(time.monotonic() - t0, 1)
    return result


def _save(work: Path, result: dict[str, Any]) -> None:
    out = work / "results" / f"{result['server']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1, default=str))
    tmp.replace(out)


def _done(work: Path) -> set[str]:
    return {f.stem for f in (work / "results").glob("*.json")}


async def run_batch(plans: list[Plan], work: Path, parallel: int, timeout: float) -> None:
    runnable = [p for p in plans if p.not_runnable is None]
    for p in plans:
        if p.not_runnable is not None:
            _save(work, await run_server(p, None, "", timeout))
    if not runnable:
        return
    models = {f"rec_{p.server}": p.file for p in runnable if p.file is not None}
    stack = Stack(work / "stacks" / time.strftime("%H%M%S"), models)
    client = await stack.start()
    slots = asyncio.Semaphore(parallel)

    async def one(p: Plan) -> None:
        async with slots:
            print(f"  {p.server}: {len(p.rows)} rows{' (judge)' if p.judge else ''}", file=sys.stderr, flush=True)
            result = await run_server(p, client, f"rec_{p.server}", timeout)
            _save(work, result)
            print(f"  {p.server}: {Counter(r['verdict'] for r in result['rows'])} {result['wall_s']} s"
                  f"{' - ' + result['not_runnable'][:120] if result['not_runnable'] else ''}", file=sys.stderr,
                  flush=True)
    try:
        await asyncio.gather(*(one(p) for p in runnable))
    finally:
        await stack.close()


# ---- the document ---------------------------------------------------------------------------------------------

# Why each disagreement or not-runnable server is what it is, from reading its rows, log and code (the bench's
# own evidence is appended: the NeMo Gym error, gymflow's failure, the rewards).
EXPLAINED: dict[str, str] = {
    "example_tool_call_multireward": (
        "gymflow by design: NeMo Gym's reward is 2.0 (a sum of reward components, = recorded); gymflow records "
        "rewards in [0, 1] and masks one outside (environments/nemo_gym.py `_score`, verifier_failed)"),
    "generative_reward_model": (
        "gymflow by design: NeMo Gym's reward is -1 on 4 rows (= recorded; its scale is [-1, 1]); gymflow records "
        "rewards in [0, 1] and masks one outside (environments/nemo_gym.py `_score`, verifier_failed); the row "
        "scored 1 agrees"),
}
EXPLAINED |= {
    "competitive_coding_challenges": (
        "data not shipped: at start-up it pre-loads ~27 GB of test metadata it does not ship; /health did not answer "
        "within 150 s"),
    "critpt": (
        "needs the network: it scores by calling the Artificial Analysis API (`api_key` unset: its config fails "
        "validation); its own critpt_agent, not the simple agent, drives it"),
    "osworld": "needs $OSWORLD_RESOURCES_TOKEN and the OSWorld desktop VMs it drives (start-up fails without it)",
    "vibench": ("data not shipped: /seed_session reads PRDs from $VIBENCH_REPO_ROOT (`/nonexistent/set-VIBENCH_REPO_"
                "ROOT/prds/...`: FileNotFoundError)"),
    "vlm_eval_kit": "needs the network: at start-up it `git clone`s VLMEvalKit into its venv",
    "bigcodebench": "needs the network: at start-up it builds a venv of its own with uv (not installed) from PyPI",
    "legal_agent_bench": ("needs the network: at start-up it downloads harvey-labs from GitHub; its example.jsonl "
                          "rows have an empty `input`"),
    "image_tools": (
        "NeMo Gym's own schema rejects the rollout file: its recorded `response` objects lack `created_at`, which "
        "NeMo Gym's `NeMoGymResponse` requires (/verify 422 on every row)"),
    "workplace_assistant": (
        "data not shipped: the rollouts are of tasks example.jsonl does not hold and carry no `ground_truth`, "
        "which /verify requires (422); gymflow's tests/workplace_gold.py writes those five by hand"),
}
# Where NeMo Gym's own verdict is not its recording (both sides agree): the recording is what is off.
EXPLAINED |= {
    "lc_niah": (
        "NeMo Gym's recording is off, not its code: the rows were recorded with the LCS overlap metric "
        "(`reasoning_overlap` = `overlap_lcs`, reward = answer_score × (1 − 0.012...)); the shipped config selects "
        "16-gram overlap (`overlap_metric_rule: ngram16`, 0.0 on these rows), so NeMo Gym 0.7.0 scores "
        "answer_score itself, and gymflow with it"),
    "math_with_code": (
        "row 4: NeMo Gym's recording is off: it recorded `extracted_answer: \\sqrt{2` (cut at the nested brace "
        "of the final `\\boxed{\\sqrt{2}}`) and reward 0; NeMo Gym 0.7.0 extracts `\\sqrt{2}` and scores 1, and "
        "gymflow with it"),
}
# NeMo Gym runs these with its gymnasium agent (/reset, /step): both sides drive that protocol (the bench's
# `_nemo_gymnasium`, gymflow's environments/nemo_gym_gymnasium.py). example_multi_turn_gymnasium agrees on every row.
EXPLAINED |= {
    "wordle": ("data not shipped: /reset reads data/guesses.txt, which the wheel lacks (its generate_data.py "
               "writes it): HTTP 500 on every row"),
    "indian_banking": ("data not shipped: /reset reads data/db.json and kb.json, from the Hugging Face dataset "
                       "NPCI/nemo-gym-indian-banking, which the wheel lacks: HTTP 500 on every row"),
    "openair_congestion": (
        "gymflow by design: the step rewards are negative (congestion penalties); gymflow's reward is NeMo Gym's "
        "to the last digit (its masked detail says it) and masked as outside [0, 1]. NeMo Gym 0.7.0's own verdict "
        "is not its recording (about half of it: the recording's reward terms are not the shipped code's)"),
    "grl_sokoban": (
        "gymflow by design: the rewards are Sokoban's (-0.1 a move, +10 solved); gymflow's reward is NeMo Gym's to "
        "the last digit on every row (its masked detail says it) and masked as outside [0, 1]. The five tasks share "
        "one prompt and differ only in `seed`: matched by prompt, every rollout got one task's seed and another "
        "board (found here; `gymflow data join` now matches by `_ng_task_index` and takes the task's prompt where "
        "the recording holds /reset's observation)"),
    "grl_tetris": (
        "gymflow by design: rewards outside [0, 1] (masked), as grl_sokoban; gymflow's reward equals the recorded "
        "one on every row. Not reproducible in general: the seed covers /reset only; the pieces after the first "
        "are drawn from the server process's unseeded global `random` (tetris_env.py:134-147), so a replay gets "
        "its recording's pieces by chance (NeMo Gym's own verdict is not its recording on three rows)"),
    "blackjack": (
        "not reproducible: /reset deals from an unseeded `random.Random()`, so each side plays another hand with "
        "the recorded actions (NeMo Gym's own verdict is not its recording on every row either); a loss (-1) is "
        "outside [0, 1], which gymflow masks by design"),
}
EXPLAINED["example_mcp_weather"] = (
    "tools over MCP: the rows offer none (`tools: []`); the server's config sets `expose_tools_over_mcp`, so "
    "gymflow seeds at setup and offers what the endpoint /seed_session announces lists (`get_weather`), as NeMo "
    "Gym's MCP agents list it")
# Image prompts (`input_image` parts) load as Chat Completions image parts and go back to /verify as recorded.
for _name in ("circle_click", "circle_count", "gui_coordinate"):
    EXPLAINED[_name] = "image prompts (`input_image` parts), sent back to /verify as recorded"
# What the table shows, in short (written from the results; keep it true when they change).
FINDINGS = [
    "What it shows:",
    "",
    "- Every disagreement is a gymflow choice, none a wrong score: rewards outside [0, 1] "
    "(example_tool_call_multireward 2.0, generative_reward_model -1, the gymnasium servers' penalties: gymflow "
    "masks them by design) and unseeded environments (blackjack). Image prompts (circle_click, circle_count, "
    "gui_coordinate: `input_image` parts) and tools listed over MCP (example_mcp_weather: the rows offer none, the "
    "server's endpoint lists `get_weather`) were gymflow gaps until the loader took image parts and the adapter "
    "listed MCP tools; they agree on every row.",
    "- NeMo Gym's gymnasium agent (`/reset`, `/step`) is spoken by the adapter: example_multi_turn_gymnasium "
    "agrees on every row; grl_sokoban, grl_tetris and openair_congestion give NeMo Gym's reward to the digit, "
    "masked as outside [0, 1]; blackjack deals unseeded hands; wordle and indian_banking lack their data.",
    "- Sandboxes (the issue's item 7): a server whose config configures its provider in place (litmus_agent: "
    "opensandbox, for its code-exec tool) gets gymflow's sandbox in its place (environments/"
    "nemo_gym_sandbox_provider.py, registered with NeMo Gym's provider registry: each exec in bubblewrap, no "
    "network, the host's /usr; plain Python images only; tests/test_nemo_gym_sandbox.py) and agrees on every row. "
    "The other twelve name a provider by reference and run every row in its own prebuilt image (the SWE and "
    "terminal servers: one docker.io image per row), a node image driven by a harness agent (workspace_bench) or "
    "a Lean server (math_formal_lean): no local stand-in holds those offline, so they stay refused (0 more).",
    "- NeMo Gym under load: math_with_judge's library verifier runs in a forked child with a 10 s deadline; in a "
    "full run beside other benches on the same 2 cores its row 1 scored 0 on NeMo Gym's side (recorded 1, gymflow "
    "1); rerun on a quiet machine it agrees (the table's run).",
    "- Adapter bugs this bench found, fixed with tests: a replayed rollout row sent its recorded outcome "
    "(`reward`, `judge_evaluations`, ...) back to /verify, which servers that build their reply as "
    "`Reply(**body.model_dump(), reward=r)` answered with HTTP 500 (equivalence_llm_judge; "
    "tests/test_nemo_gym_recorded_rows.py); a judge model could not be given to a managed server (now "
    "`gymflow_model_urls` in `resources_server_overrides`; tests/test_nemo_gym_launch_models.py); a config file "
    "with a top-level list (critpt's `config_paths`) stopped the launcher; rollouts of tasks that share a "
    "prompt (grl_*: a seed apart) were matched to one such task (tests/test_recorded_samples.py).",
    "- Where NeMo Gym is wrong: its rollout files are not re-verifiable as shipped: every row echoes "
    "`responses_create_params` with its unset fields as null (`parallel_tool_calls: null`), which NeMo Gym's own "
    "request model rejects (422), so the bench prunes the nulls, as NeMo Gym's `reverify` avoids them by reading the "
    "materialized inputs instead; image_tools' recorded responses lack `created_at` (422 on every row); four servers "
    "ship rollouts of tasks their example.jsonl does not hold, without the fields /verify needs; four ship "
    "placeholder rollout files (`<PLACEHOLDER ROW>`); four ship rows without a `response`; lc_niah and "
    "math_with_code row 4 were recorded with scoring that NeMo Gym 0.7.0 no longer does (see their rows).",
    "- Servers' own packages: with `gymflow env nemo-gym-install` run on the 26 servers in INSTALLED (index "
    "packages only, nothing from git, no torch), 16 more servers agree on every row (48 before). The other ten then "
    "stop for reasons beyond packages: start-up downloads (evalplus and ether0 fetch data, newton_bench `git "
    "clone`s), rewards outside [0, 1] (grl_sokoban and grl_tetris, since the adapter speaks gymnasium_agent), "
    "another agent's protocol (scicode, gdpval, toolsandbox: their own agents build the prompt, the rows' `input` "
    "is empty), NeMo Gym's own request model "
    "rejecting its recorded `usage` (mrcr, ruler2), rollouts of tasks example.jsonl lacks (structured_outputs).",
    "- Rollout files concatenated from several collections (graphwalks repeats task 11's sample 0; iheval gives "
    "`id: 1` to two prompts) were refused by gymflow's loader as duplicates; `gymflow data join` now numbers a "
    "repeated sample as the task's next one and gives a reused id its own (`<id>-line<N>`), and both agree.",
    "- Reproducible: a second full run (17 minutes on this 2-core machine) gave the same verdict, the same NeMo Gym "
    "reward and the same gymflow reward on every row of every server.",
    "- The bench replays a recording that ends on a tool call or its output (a single-step agent) with that many "
    "turns, as NeMo Gym's agent stopped there (single_step_tool_use_with_argument_comparison row 1, circle_click).",
]
# Servers whose own requirements.txt the measured venv holds (`--install`, or `gymflow env nemo-gym-install` on
# them): every server whose packages come from the index and are light (no torch, no browser download), and whose
# config asks for no sandbox or credentials.
INSTALLED = (
    "arena", "asr_with_pc", "assaybench", "evalplus", "fukuyamabench", "graphwalks", "grl_sokoban", "grl_tetris",
    "iheval", "labbench2_vlm", "mcqa", "moldetox", "mrcr", "newton_bench", "reasoning_gym", "ruler2", "scicode",
    "structeval", "structured_outputs", "terminal_multi_harness", "terminus_judge", "toolsandbox", "widesearch",
    "gdp_pdf", "ether0", "gdpval", "google_search")
# The class of why a server is not runnable, where the refusal or the error does not say it (see `reason`).
REASONS: dict[str, str] = {
    "competitive_coding_challenges": "data not shipped", "critpt": "needs the network", "vibench": "data not shipped",
    "osworld": "config values nobody set", "vlm_eval_kit": "needs the network", "bigcodebench": "needs the network",
}


def _num(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _short(text: str, n: int = 220) -> str:
    text = re.sub(r"\s+", " ", text or "").strip()
    text = re.sub(r"/\S*?/site-packages/", "", text)  # the venv's paths say nothing the server's name does not
    text = re.sub(r"/\S*?/rows/(\S+?\.jsonl)", r"\1", text)
    return text if len(text) <= n else text[: n - 1] + "…"


def _why(result: dict[str, Any]) -> str:
    parts = []
    if result["server"] in EXPLAINED:
        parts.append(EXPLAINED[result["server"]])
    if result.get("not_runnable") and result["server"] not in EXPLAINED:
        parts.append(_short(result["not_runnable"], 300))
    rows = result["rows"]
    bad = [r for r in rows if r["verdict"] == "not runnable"]
    agents = result.get("agents") or []
    if bad and agents and "simple_agent" not in agents and result["server"] not in EXPLAINED:
        parts.append(f"its config allows only the agent(s) {', '.join(agents)}, not the simple agent whose "
                     "seed/verify protocol both sides speak")
    if bad:
        parts += [_short(n, 160) for n in result.get("notes") or []]
    if bad and not result.get("not_runnable"):
        n = bad[0]["nemo_gym"]
        parts.append(f"NeMo Gym fails {len(bad)} row(s): {_short(n.get('log') or n.get('error', ''), 200)}")
    elif bad and result["server"] not in EXPLAINED and bad[0]["nemo_gym"].get("error", "")[:60] not in \
            (result.get("not_runnable") or ""):
        n = bad[0]["nemo_gym"]
        parts.append(f"NeMo Gym: {_short(n.get('log') or n.get('error', ''), 200)}")
    groups: dict[str, list[str]] = {}
    for r in rows:
        if r["verdict"] == "disagree":
            g, n = r["gymflow"], r["nemo_gym"]
            failure = _short((g.get("details") or {}).get("error") or g.get("failure") or "", 160)
            key = f"gymflow {g.get('reward')} ({g.get('status')}{'; ' + failure if failure else ''})"
            groups.setdefault(key, []).append(f"{r['row']} (NeMo Gym {_num(n.get('reward'))}, recorded "
                                              f"{_num(r['recorded'])})")
    parts += [f"row {', '.join(v)}: {k}" for k, v in groups.items()]
    off = [f"{r['row']} ({_num(r['nemo_gym']['reward'])} vs {_num(r['recorded'])})" for r in rows
           if r["verdict"] != "not runnable" and not r["nemo_matches_recorded"]]
    if off and not result.get("judge"):
        parts.append(f"NeMo Gym's own verdict differs from the recorded reward on row {', '.join(off)}")
    if result.get("judge") and not parts:
        parts.append(f"fake judge for {', '.join(result['judge'])}")
    return "; ".join(parts).replace("|", "\\|")


def _shipped_rows(server: str) -> int:
    """Lines of the server's example_rollouts.jsonl (a refused server's rows are never read)."""
    path = catalogue.server(server).folder / "data" / "example_rollouts.jsonl"
    return sum(1 for line in path.read_text(errors="replace").splitlines() if line.strip()) if path.exists() else 0


def _first_error(result: dict[str, Any]) -> str:
    for row in result["rows"]:
        n = row["nemo_gym"]
        if "error" in n:
            return f"{n.get('error', '')} {n.get('log', '')}"
    return ""


def reason(result: dict[str, Any]) -> str:
    """The class of why a server is not runnable here: REASONS, else read off the refusal or NeMo Gym's error."""
    if result["server"] in REASONS:
        return REASONS[result["server"]]
    text = f"{result.get('not_runnable') or ''} {_first_error(result)}"
    agents = result.get("agents") or []
    found = []  # (where in the text, label): the reason named first is the one given
    for key, label in (("sandbox provider", "needs a sandbox provider"),
                       ("URL or path", "needs packages from git or a URL"),
                       ("not installed", "needs packages not installed here"),
                       ("No module named", "needs packages not installed here"), ("network", "needs the network"),
                       ("URLError", "needs the network"), ("Name or service not known", "needs the network"),
                       ("uv is required", "needs packages not installed here"),
                       ("data not shipped", "data not shipped"),
                       ("rows gymflow cannot load", "rows gymflow cannot load"),
                       ("another agent's protocol", "another agent's protocol (not seed/verify)"),
                       ("values nobody set", "config values nobody set"),
                       ("no verdict within", "no verdict within the time limit"),
                       ("no answer on /health", "no verdict within the time limit")):
        if key in text:
            found.append((text.index(key), label))
    if found:
        return min(found)[1]
    if "/seed_session HTTP 404" in text and agents and "simple_agent" not in agents:
        return "another agent's protocol (not seed/verify)"
    unmatched = any("match no task" in n for n in result.get("notes") or [])
    if "HTTP 422" in text and "Field required" in text and unmatched:
        return "data not shipped (the rollouts' own tasks)"
    if "HTTP 422" in text:
        return "NeMo Gym's own schema rejects the rollout file"
    return "fails inside NeMo Gym"


def _tally(results: dict[str, dict[str, Any]]) -> tuple[Counter[str], Counter[str]]:
    totals: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    for r in results.values():
        c = Counter(row["verdict"] for row in r["rows"])
        totals.update({f"rows {k}": v for k, v in c.items()})
        if r.get("not_runnable") or not c["agree"] + c["disagree"]:
            totals["servers not runnable"] += 1
            reasons[reason(r)] += 1
        elif c["disagree"]:
            totals["servers with a disagreement"] += 1
        else:
            totals["servers agreeing on every row NeMo Gym verifies"] += 1
            totals["... of them on every row"] += not c["not runnable"]
    return totals, reasons


def render(work: Path, servers: list[str], command: str) -> str:
    results = {n: json.loads(f.read_text()) for n in servers if (f := work / "results" / f"{n}.json").exists()}
    lines = []
    for name in servers:
        r = results.get(name)
        if r is None:
            lines.append(f"| {name} | - | - | - | - | not reached yet |")
            continue
        c = Counter(row["verdict"] for row in r["rows"])
        runnable = not r.get("not_runnable") and c["agree"] + c["disagree"]
        nr = c["not runnable"] if runnable else f"all ({reason(r)})"
        rows = len(r["rows"]) or _shipped_rows(name)
        lines.append(f"| {name} | {rows} | {c['agree']} | {c['disagree']} | {nr} | {_why(r)} |")
    totals, reasons = _tally(results)
    order = ("servers agreeing on every row NeMo Gym verifies", "... of them on every row",
             "servers with a disagreement", "servers not runnable", "rows agree", "rows disagree", "rows not runnable")
    missing = len(servers) - len(results)
    head = [
        "# NeMo Gym's catalogue, measured",
        "",
        "Every NeMo Gym 0.7.0 resources server installed here, its recorded rollouts (`data/example_rollouts.jsonl`)",
        "scored twice: by NeMo Gym's own server code (started as `ng_run` starts it, driven as its simple agent",
        "drives it: `/seed_session` with the row, the recorded tool calls, `/verify` with the row and the recorded",
        "`response`) and by gymflow's full stack (Temporal, Postgres, the three pools; the `nemo_gym` environment",
        "with a recorded model replaying the row's model turns, its tool calls run on the server again, the verify",
        "request built from gymflow's transcript). `agree`/`disagree` compare gymflow's reward with NeMo Gym's own",
        "verdict; `not runnable` counts rows NeMo Gym itself cannot verify here (`all (reason)`: the whole server).",
        f"Servers whose config calls a model get the same fake judge on both sides (every answer `{JUDGE_VERDICT}`),",
        "so their rewards test the plumbing, not the recorded judge's verdicts.",
        "",
        f"- command: `.venv/bin/python -m bench.nemo_gym_catalogue` (bench/nemo_gym_catalogue.py; this file was last "
        f"written by `{command}`; `--servers a,b` reruns some, `--resume` skips those done, results per server under "
        "bench/results/nemo-gym-catalogue/results/)",
        f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; machine: {platform.machine()}, "
        f"{os.cpu_count()} cores, gymflow on Python {platform.python_version()}, NeMo Gym 0.7.0 on its own "
        "Python 3.13 (`.nemo313`) holding nemo-gym, math-verify and the own requirements of "
        f"{len(INSTALLED)} servers (`--install`: {', '.join(INSTALLED)})",
        f"- servers: {len(servers)}" + (f" ({missing} not reached yet)" if missing else "") + "; "
        + "; ".join(f"{k}: {totals[k]}" for k in order),
        "- not runnable, by reason: " + "; ".join(f"{k}: {v}" for k, v in reasons.most_common()),
        "",
        *FINDINGS,
        "",
        "| server | rows | agree | disagree | not runnable | why |",
        "|---|---|---|---|---|---|",
    ]
    return "\n".join(head + lines) + "\n"


# ---- main -----------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.nemo_gym_catalogue", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--servers", help="comma-separated server names (default: every installed one)")
    ap.add_argument("--limit", type=int, help="at most this many servers (after --servers and --resume)")
    ap.add_argument("--rows", type=int, help="at most this many rows per server")
    ap.add_argument("--resume", action="store_true", help="skip servers with a result under --work")
    ap.add_argument("--parallel", type=int, default=2, help="servers at once (the machine has 2 cores)")
    ap.add_argument("--timeout", type=float, default=SERVER_TIMEOUT_S, help="seconds per side per server")
    ap.add_argument("--work", type=Path, default=WORK)
    ap.add_argument("--doc", type=Path, default=DOC)
    ap.add_argument("--render-only", action="store_true", help="write the document from the results there are")
    ap.add_argument("--install", action="store_true",
                    help="first install INSTALLED's own requirements into the NeMo Gym venv (gymflow env "
                         "nemo-gym-install)")
    args = ap.parse_args(argv)
    os.environ.setdefault(catalogue.PYTHON_ENV, str(NEMO_PYTHON))
    if args.install:
        from gymflow.environments.nemo_gym_install import install_servers

        install_servers(INSTALLED, Path(os.environ[catalogue.PYTHON_ENV]))
    os.environ[managed.START_TIMEOUT_ENV] = START_TIMEOUT_S
    import logging
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("temporalio").setLevel(logging.ERROR)
    servers = catalogue.catalogue(catalogue.python())
    names = list(servers) if not args.servers else [s.strip() for s in args.servers.split(",") if s.strip()]
    unknown = [n for n in names if n not in servers]
    if unknown:
        raise SystemExit(f"not installed NeMo Gym servers: {', '.join(unknown)}")
    command = "python -m bench.nemo_gym_catalogue" + (" " + " ".join(argv if argv is not None else sys.argv[1:])
                                                      if (argv if argv is not None else sys.argv[1:]) else "")
    if not args.render_only:
        todo = [n for n in names if not (args.resume and n in _done(args.work))]
        todo = todo[: args.limit] if args.limit else todo
        judge, judge_url = start_judge()
        try:
            plans = [plan(servers[n], args.work, judge_url, args.rows) for n in todo]
            asyncio.run(run_batch([p for p in plans if p.not_runnable], args.work, args.parallel, args.timeout))
            plans = [p for p in plans if not p.not_runnable]
            for i in range(0, len(plans), BATCH):
                batch = plans[i:i + BATCH]
                print(f"batch {i // BATCH + 1}: {', '.join(p.server for p in batch)}", file=sys.stderr, flush=True)
                asyncio.run(run_batch(batch, args.work, args.parallel, args.timeout))
                args.doc.write_text(render(args.work, list(servers), command))
        finally:
            judge.shutdown()
    args.doc.write_text(render(args.work, list(servers), command))
    print(f"wrote {args.doc}", file=sys.stderr)


if __name__ == "__main__":
    main()

"""The catalogue bench's inputs: the fake judge both sides share, and what each server gets (Plan: its rows, the
recordings, their tasks, the overrides) (bench/nemo_gym_catalogue.py)."""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from gymflow.activities.recorded import split_turns
from gymflow.environments import nemo_gym_catalogue as catalogue

from gymflow.data.prepare import conversation_key, join, match_task, tasks_by_position

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


def input_row(joined: dict[str, Any], recorded: dict[str, Any], task: dict[str, Any] | None,
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


# Servers whose own requirements.txt the measured venv holds (`--install`, or `gymflow env nemo-gym-install` on
# them): every server whose packages come from the index and are light (no torch, no browser download), and whose
# config asks for no sandbox or credentials.
INSTALLED = (
    "arena", "asr_with_pc", "assaybench", "evalplus", "fukuyamabench", "graphwalks", "grl_sokoban", "grl_tetris",
    "iheval", "labbench2_vlm", "mcqa", "moldetox", "mrcr", "newton_bench", "reasoning_gym", "ruler2", "scicode",
    "structeval", "structured_outputs", "terminal_multi_harness", "terminus_judge", "toolsandbox", "widesearch",
    "gdp_pdf", "ether0", "gdpval", "google_search")

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



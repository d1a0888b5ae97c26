"""The benchmark mock: a deterministic OpenAI-compatible Chat Completions server that needs no script.

Each reply is a function of the request alone: when tools are offered and the conversation has no tool
message yet, one call to the first offered tool with arguments built from its JSON schema; otherwise a text
answer, with a `\\boxed{}` number taken from the prompt for math-like prompts. Replies wait `latency_s` first.

Given an answer table (`--answers FILE`: JSON, a task's first user message -> its gold answer, or null for a
tool task), the mock is right on a seeded fraction of those tasks (`--correct-fraction`, default 0.5; `--seed`)
and surely wrong on the others (issue 20). The choice is per task: a hash of the seed and the task key (the
`x-gymflow-rollout` header without its sample index, else the first user message), so every sample of a task
agrees and `is_right` tells a benchmark which tasks were right. Right: `\\boxed{gold}`, or the offered tool
called. Wrong: a numeric gold plus one (else -1), or a call to a tool that was not offered (the same
generate, tool, generate shape; the unknown-tool error path runs). Prompts not in the table: as above.

Every request is recorded (arrival and reply-sent times, monotonic and wall clock, a conversation key and the
turn) and served at `GET /stats` (`GET /stats?reset=1` clears them), so a benchmark can measure the
orchestration overhead between one reply and the next request of the same rollout.

A user message `mock: reply <char> x<count>` is answered with `<char>` repeated `count` times (up to 10,000,000):
a hostile reply for benchmarks (bench/noisy_neighbour.py) without sending it in the prompt.

    python -m gymflow.testing.mock_openai --port 8000 --latency 1.0
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import re
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

from aiohttp import web

# The completion body shape is the scripted server's: one place decides what a completion looks like.
from gymflow.http_service import ThreadedHTTPService, json_app, read_body
from gymflow.testing.scripted_openai import Reply, _completion, text, tool_call

ROLLOUT_HEADER = "x-gymflow-rollout"  # a per-rollout id, when the caller sends one (better than a prompt hash)
MAX_BODY_BYTES = 64 * 1024 * 1024
MAX_RECORDS = 500_000  # oldest dropped past this: a 20k-rollout scaling run makes ~40k
_SCHEMA_DEPTH = 8
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_MATH_HINTS = ("\\boxed", "math", "solve", "compute", "calculate", "answer")


# ---- replies -------------------------------------------------------------------------------------


def _string_for(key: str, schema: dict[str, Any]) -> str:
    lowered = key.lower()
    if any(w in lowered for w in ("city", "location", "place", "town")):
        return "SF"
    if "date" in lowered:
        return "2024-01-01"
    if "email" in lowered:
        return "user@example.com"
    return f"{key or 'value'}-1"


def value_from_schema(schema: Any, key: str = "", depth: int = 0) -> Any:
    """A deterministic value that fits `schema` (the usual JSON Schema keywords; anything odd gives None)."""
    if not isinstance(schema, dict) or depth > _SCHEMA_DEPTH:
        return None
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    if "default" in schema:
        return schema["default"]
    for combo in ("anyOf", "oneOf", "allOf"):
        options = schema.get(combo)
        if isinstance(options, list) and options:
            non_null = [o for o in options if not (isinstance(o, dict) and o.get("type") == "null")]
            return value_from_schema((non_null or options)[0], key, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object" or (kind is None and "properties" in schema):
        return args_from_schema(schema, depth + 1)
    if kind == "array":
        count = schema.get("minItems", 0)
        count = count if isinstance(count, int) and 0 <= count <= 8 else 0
        return [value_from_schema(schema.get("items"), key, depth + 1) for _ in range(count)]
    if kind in ("integer", "number"):
        low = schema.get("minimum", schema.get("exclusiveMinimum"))
        start = low if isinstance(low, (int, float)) and not isinstance(low, bool) else 0
        return int(start) + 1 if kind == "integer" else float(start) + 1.0
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    return _string_for(key, schema)


def args_from_schema(schema: Any, depth: int = 0) -> dict[str, Any]:
    """Arguments for a tool: every required property (all of them when none is marked required)."""
    if not isinstance(schema, dict):
        return {}
    props = schema.get("properties")
    if not isinstance(props, dict):
        return {}
    required = schema.get("required")
    names = [k for k in required if k in props] if isinstance(required, list) else list(props)
    return {k: value_from_schema(props[k], k, depth) for k in names}


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    raw = body.get("messages")
    return [m for m in raw if isinstance(m, dict)] if isinstance(raw, list) else []


def _first_tool(body: dict[str, Any]) -> tuple[str, Any] | None:
    tools = body.get("tools")
    if not isinstance(tools, list):
        return None
    for t in tools:
        fn = t.get("function") if isinstance(t, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            return fn["name"], fn.get("parameters")
    return None


def _content(message: dict[str, Any]) -> str:
    value = message.get("content")
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # content parts
        return " ".join(p.get("text", "") for p in value if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def first_user_text(body: dict[str, Any]) -> str:
    return next((_content(m) for m in _messages(body) if m.get("role") == "user"), "")


def is_right(key: str, fraction: float, seed: int = 0) -> bool:
    """Whether the mock answers the task with this key right: a seeded hash below `fraction`."""
    digest = hashlib.blake2b(f"{seed}\x00{key}".encode("utf-8", "replace"), digest_size=8).digest()
    return int.from_bytes(digest, "big") < fraction * 2**64


def task_key(headers: dict[str, str], body: dict[str, Any]) -> str:
    """`<run>/<task>` from the rollout header `<run>/<task>/<sample>`, else the first user message."""
    rollout = next((v for k, v in headers.items() if k.lower() == ROLLOUT_HEADER), None)
    return rollout.rsplit("/", 1)[0] if rollout else first_user_text(body)


def _wrong(gold: str) -> str:
    try:
        value = float(gold)
    except ValueError:
        return "-1"
    return str(int(value) + 1) if value.is_integer() else str(value + 1)


def _strip_delimiters(gold: str) -> str:
    g = gold.strip()
    if g.startswith("\\(") and g.endswith("\\)"):
        return g[2:-2].strip()
    if len(g) > 1 and g.startswith("$") and g.endswith("$"):
        return g.strip("$").strip()
    return g


_REPEAT = re.compile(r"mock: reply (\S) x(\d{1,8})")


def respond(body: dict[str, Any], answers: dict[str, str | None] | None = None, right: bool = False) -> Reply:
    """The mock policy: a pure function of the request (and, for a task in `answers`, whether to be `right`)."""
    messages = _messages(body)
    tool = _first_tool(body)
    prompt = first_user_text(body)
    if (repeat := _REPEAT.fullmatch(prompt.strip())) and int(repeat.group(2)) <= 10_000_000:
        return text(repeat.group(1) * int(repeat.group(2)))
    known = answers is not None and prompt in answers
    if tool is not None and not any(m.get("role") == "tool" for m in messages):
        name, params = tool
        if known and not right:
            return tool_call(f"not_{name}", args_from_schema(params))
        return tool_call(name, args_from_schema(params))
    if known and answers is not None and answers[prompt] is not None and not any(
            m.get("role") == "tool" for m in messages):
        gold = str(answers[prompt])
        answer = _strip_delimiters(gold) if right else _wrong(gold)
        return text(f"The answer is \\boxed{{{answer}}}.")
    last_tool = next((m for m in reversed(messages) if m.get("role") == "tool"), None)
    if last_tool is not None:
        return text(f"Here is what I found: {_content(last_tool)[:2000]}")
    prompt = next((_content(m) for m in reversed(messages) if m.get("role") == "user"), "")
    if any(h in prompt.lower() for h in _MATH_HINTS) or _NUMBER.search(prompt):
        numbers = _NUMBER.findall(prompt)
        digest = int(hashlib.sha256(prompt.encode("utf-8", "replace")).hexdigest(), 16)
        answer = numbers[digest % len(numbers)] if numbers else str(digest % 100)
        return text(f"<answer>{answer}</answer> The answer is \\boxed{{{answer}}}.")
    return text("Done.")


# ---- request records -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Record:
    key: str  # the rollout header, else a hash of the first user message (equal for every sample of a task)
    turn: int  # assistant messages already in the conversation: 0 for a rollout's first request
    arrived: float  # time.monotonic()
    sent: float
    arrived_wall: float  # time.time(), to compare with timestamps other processes wrote (rollouts.finished_at)
    sent_wall: float
    tool_call: bool


def conversation_key(headers: dict[str, str], body: dict[str, Any]) -> str:
    rollout = next((v for k, v in headers.items() if k.lower() == ROLLOUT_HEADER), None)
    if rollout:
        return rollout[:300]
    return hashlib.sha256(first_user_text(body).encode("utf-8", "replace")).hexdigest()[:16]


class MockOpenAI(ThreadedHTTPService):
    def __init__(self, host: str = "127.0.0.1", port: int = 0, latency_s: float = 0.0,
                 answers: dict[str, str | None] | None = None, correct_fraction: float = 0.5, seed: int = 0) -> None:
        if latency_s < 0:
            raise ValueError(f"latency_s must be >= 0, got {latency_s}")
        if not 0.0 <= correct_fraction <= 1.0:
            raise ValueError(f"correct_fraction must be in [0, 1], got {correct_fraction}")
        self.latency_s = latency_s
        self.answers, self.correct_fraction, self.seed = answers, correct_fraction, seed
        self.records: deque[Record] = deque(maxlen=MAX_RECORDS)
        self._lock = threading.Lock()
        app = json_app(self._get, self._post, MAX_BODY_BYTES)
        # 1,000 rollouts connect at once at the top of the latency curve; a short accept queue drops SYNs.
        self._serve(app, host, port, backlog=2048)

    def stats(self, reset: bool = False) -> dict[str, Any]:
        with self._lock:
            out = {"latency_s": self.latency_s, "requests": [asdict(r) for r in self.records]}
            if reset:
                self.records.clear()
        return out

    def _record(self, record: Record) -> None:
        with self._lock:
            self.records.append(record)

    async def _get(self, request: web.Request) -> web.Response:
        if request.path == "/stats":
            return _json(200, self.stats(request.query.get("reset", "0") not in ("0", "")))
        return _json(200, {"object": "list", "data": [{"id": "mock", "object": "model"}]})

    async def _post(self, request: web.Request) -> web.StreamResponse:
        arrived, arrived_wall = time.monotonic(), time.time()
        raw = await read_body(request, MAX_BODY_BYTES)
        if raw is None:
            return _error("Content-Length missing or too large")
        try:
            body = json.loads(raw or b"{}")
        except (ValueError, UnicodeDecodeError):
            body = None
        if not isinstance(body, dict):
            return _error("the body is not a JSON object")
        headers = dict(request.headers.items())
        right = bool(self.answers) and is_right(task_key(headers, body), self.correct_fraction, self.seed)
        reply = respond(body, self.answers, right)
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        model = body.get("model") if isinstance(body.get("model"), str) else "mock"
        resp = _json(200, _completion(reply, model))
        turn = sum(1 for m in _messages(body) if m.get("role") == "assistant")
        # Recorded as the reply leaves, before it is written: a client that reads its reply and then asks /stats
        # (or stats()) finds its request there.
        self._record(Record(conversation_key(headers, body), turn, arrived, time.monotonic(), arrived_wall,
                            time.time(), bool(reply.tool_calls)))
        try:  # sent here, not after the handler returns
            await resp.prepare(request)
            await resp.write_eof()
        except ConnectionError:
            pass
        return resp


def _json(status: int, payload: Any) -> web.Response:
    resp = web.Response(status=status, body=json.dumps(payload).encode(), content_type="application/json")
    if status != 200:  # the body may be unread: the connection cannot carry another request
        resp.force_close()
    return resp


def _error(message: str) -> web.Response:
    return _json(400, {"error": {"message": message, "type": "invalid_request_error", "code": None}})


def main() -> None:
    ap = argparse.ArgumentParser(description="Serve deterministic mock Chat Completions (see module docstring).")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--latency", type=float, default=0.0, help="seconds before each reply")
    ap.add_argument("--answers", help="JSON file: first user message -> gold answer (null: a tool task)")
    ap.add_argument("--correct-fraction", type=float, default=0.5, help="tasks in --answers answered right")
    ap.add_argument("--seed", type=int, default=0, help="which tasks are right (with the task key)")
    args = ap.parse_args()
    answers = None
    if args.answers:
        with open(args.answers, encoding="utf-8") as f:
            answers = json.load(f)
    server = MockOpenAI(args.host, args.port, args.latency, answers, args.correct_fraction, args.seed)
    print(server.base_url, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()

"""`nemo_gym`: any NeMo Gym resources server, driven over HTTP, as a gymflow environment.

A row is NeMo Gym's row unchanged plus `resources_server` (the server's name in NeMo Gym's configs, e.g.
`example_single_tool_call`). Its URL comes from $GYMFLOW_NEMO_GYM_<SERVER>_URL on the env workers (verify also
reads `environments.nemo_gym.servers.<server>`). The protocol is NeMo Gym's simple agent's: `/seed_session` with
the row, which sets a session cookie; one POST `/<tool>` per tool call with that cookie; `/verify` with the row
plus the episode as a Responses API `response`. Seeding is lazy (setup cannot do I/O): on the first tool call, or
in verify when there was none; the cookie is the episode state.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import Any

from gymflow.environments import nemo_gym_http as http
from gymflow.environments import nemo_gym_responses as responses
from gymflow.environments.base import (
    JSON,
    MAX_VERIFY_S,
    Environment,
    EnvironmentOptions,
    TaskData,
    ToolOutput,
    VerifyContext,
)
from pydantic import Field

from gymflow.kernel.errors import ConfigError, TaskError, ToolError, VerifierError
from gymflow.kernel.wire import ChatMessage, Score, Task

STATE_KEY = "nemo_gym_cookies"
_TOOL_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")  # one URL path segment, never `..`
# The server's own endpoints: a tool of these names would let the model seed, verify or close its own session.
RESERVED = frozenset({"seed_session", "verify", "close_session", "aggregate_metrics", "reverify_mode", "mcp",
                      "health", "healthz", "livez", "readyz", "docs", "openapi.json", "redoc"})
_OURS = ("gymflow_request", "gymflow_prompt_len")
# FastAPI's answers for a missing route, as opposed to a tool that says "not found" itself.
_NO_ROUTE = ({"detail": "Not Found"}, {"detail": "Method Not Allowed"})
_MAX_DETAIL_CHARS = 500
VERIFY_ATTEMPTS = 3  # verify is retried here: a VerifierError is final (masked), unlike a tool call's error
VERIFY_BACKOFF_S = 1.0


class NemoGymTask(TaskData):
    resources_server: str = Field(pattern=f"^{http.SERVER_NAME.pattern}$")  # a name, not a path or URL
    # Filled by parse_task from the task, never from the row: what /seed_session and /verify need of the prompt.
    gymflow_request: JSON = Field(default_factory=dict, exclude=True)
    gymflow_prompt_len: int = Field(0, exclude=True)

    def row(self) -> JSON:
        """The row as NeMo Gym's agent sends it: its own fields plus `responses_create_params`."""
        return {**(self.model_extra or {}), "responses_create_params": self.gymflow_request}


def _check_tool_name(name: str) -> str | None:
    if not _TOOL_NAME.fullmatch(name):
        return f"tool name {name[:80]!r} is not one URL path segment (letters, digits, _ . -)"
    if name in RESERVED:
        return f"tool name {name!r} is one of the resources server's own endpoints"
    return None


def _scalar_details(reply: JSON, sent: JSON) -> JSON:
    """The verifier's own scalar fields (the reply echoes the request, which must not be stored twice)."""
    out: JSON = {}
    for key, value in reply.items():
        if key in sent or key in ("response", "reward") or len(out) >= 32:
            continue
        if isinstance(value, str):
            out[key] = value[:_MAX_DETAIL_CHARS]
        elif value is None or isinstance(value, (bool, int)) or (isinstance(value, float) and math.isfinite(value)):
            out[key] = value
    return out


class NemoGymOptions(EnvironmentOptions):
    servers: dict[str, str] | None = Field(None, description="Resources server name -> its http(s) URL")
    timeout_s: float | None = Field(None, gt=0, le=MAX_VERIFY_S, description="One request to a resources server")


class NemoGymEnvironment(Environment[NemoGymTask]):
    name = "nemo_gym"
    task_type = NemoGymTask
    Options = NemoGymOptions
    needs = ("a NeMo Gym resources server (environments.nemo_gym.servers)",)
    in_loop_reason = "its work is async HTTP to NeMo Gym's resources servers, processes of their own"

    # A nemo_gym row is any NeMo Gym row plus `resources_server`: routing must not send a math row here to
    # `math_with_judge` (gymflow/data/routing.py).
    accepts_any_row = True

    def parse_task(self, task: Task) -> NemoGymTask:
        if "resources_server" not in task.data:
            raise TaskError("resources_server: required: the NeMo Gym resources server this row goes to, e.g. "
                            "\"example_single_tool_call\" (environment nemo_gym)")
        for key in _OURS:
            if key in task.data:
                raise TaskError(f"{key}: reserved by the nemo_gym environment; rename the field")
        for i, tool in enumerate(task.tools):
            if problem := _check_tool_name(tool.name):
                raise TaskError(f"responses_create_params.tools[{i}].name: {problem}")
        data = super().parse_task(task)
        return data.model_copy(update={"gymflow_request": responses.create_params(task),
                                       "gymflow_prompt_len": len(task.messages)})

    async def _seed(self, data: NemoGymTask, url: str, timeout: float) -> dict[str, str]:
        reply = await http.post(url, "/seed_session", http.encode(data.row()), {}, timeout)
        if not 200 <= reply.status < 300:
            raise TaskError(f"{data.resources_server}/seed_session refused the row (HTTP {reply.status}): "
                            f"{reply.snippet()}")
        return http.merge_cookies({}, reply.cookies)

    async def call_tool(self, data: NemoGymTask, state: JSON, name: str, args: JSON) -> ToolOutput:
        if problem := _check_tool_name(name):
            raise ToolError(problem)
        try:
            body = http.encode(args)
        except ValueError:
            raise ToolError("arguments must be strict JSON (no NaN or Infinity)") from None
        url, timeout = http.server_url(data.resources_server), http.timeout_s()
        cookies = state.get(STATE_KEY)
        if not isinstance(cookies, dict):
            cookies = await self._seed(data, url, timeout)
        reply = await http.post(url, f"/{name}", body, cookies, timeout)
        new_state = {**state, STATE_KEY: http.merge_cookies(cookies, reply.cookies)}
        if 200 <= reply.status < 300:
            return ToolOutput(content=reply.text, state=new_state)
        if reply.status in (404, 405) and _json_or_none(reply.text) in _NO_ROUTE:
            var = http.url_env_var(data.resources_server)
            raise ConfigError(f"resources server {data.resources_server!r} at {http.redact(url)} has no endpoint "
                              f"/{name}: check the row's resources_server and {var}")
        # 400/404/422...: the server refused these arguments; the model sees why and may fix them.
        raise ToolError(f"HTTP {reply.status}: {reply.text}")

    async def verify(self, data: NemoGymTask, messages: Sequence[ChatMessage], state: JSON,
                     ctx: VerifyContext) -> Score:
        server = data.resources_server
        url, timeout = http.server_url(server, ctx.options), http.timeout_s(ctx.options)
        params = data.gymflow_request
        sent = {**data.row(), "response": responses.response(messages, data.gymflow_prompt_len, params,
                                                              ctx.policy_model)}
        try:
            body = http.encode(sent)
        except ValueError as e:
            raise VerifierError(f"the episode cannot be sent as JSON: {e}") from None
        cookies = state.get(STATE_KEY)

        async def attempt() -> http.Reply:
            nonlocal cookies
            if not isinstance(cookies, dict):
                cookies = await self._seed(data, url, timeout)
            return await http.post(url, "/verify", body, cookies, timeout)

        try:
            reply = await http.with_retries(attempt, attempts=VERIFY_ATTEMPTS, backoff_s=VERIFY_BACKOFF_S)
        except http.ServerUnavailable as e:
            raise VerifierError(f"NeMo Gym server {server!r} could not verify after {VERIFY_ATTEMPTS} attempts: {e}"
                                ) from None
        if not 200 <= reply.status < 300:
            raise VerifierError(f"{server}/verify refused the episode (HTTP {reply.status}): {reply.snippet()}")
        return _score(server, reply, sent)

    async def validate(self, task: Task) -> Score | None:
        return None  # NeMo Gym rows carry no gold transcript


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _score(server: str, reply: http.Reply, sent: JSON) -> Score:
    body = _json_or_none(reply.text)
    if not isinstance(body, dict):
        raise VerifierError(f"{server}/verify answered something that is not a JSON object: {reply.snippet()}")
    reward = body.get("reward")
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
        raise VerifierError(f"{server}/verify answered no finite number as reward: {str(reward)[:80]}")
    if body.get("mask_sample") is True:  # the server says its own infrastructure failed: not a measurement
        reason = f"{body.get('failure_kind') or 'unspecified'}: {str(body.get('failure_reason') or '')[:300]}"
        raise VerifierError(f"{server}/verify masked the sample ({reason})")
    return Score(reward=float(reward), details={"resources_server": server, **_scalar_details(body, sent)})

"""`nemo_gym`: any NeMo Gym resources server, driven as NeMo Gym's simple agent drives it, as a gymflow environment.

A row is NeMo Gym's row unchanged plus `resources_server` (the server's name in NeMo Gym's catalogue, e.g.
`xlam_fc`), optionally `resources_server_config` (one of its `configs/*.yaml`; default `<name>.yaml`) and
`resources_server_overrides` (values merged into that server's config, e.g. `{"should_use_judge": false}`).
Where is the server? $GYMFLOW_NEMO_GYM_<SERVER>_URL (or `environments.nemo_gym.servers.<server>`, verify only)
when set: one the user runs. Otherwise gymflow runs it: one process per server per env worker, started from NeMo
Gym's Python (environments/nemo_gym_server.py). The protocol is NeMo Gym's simple agent's: `/seed_session` with
the row, which sets a session cookie; one POST `/<tool>` per tool call with that cookie, whose reply body, whatever
its status (a 404 for a tool the server has no route for, a 422, a 500), is the tool's output the model sees;
`/verify` with the row plus the episode as a Responses API `response` (every output item). Seeding is lazy: on the
first tool call, or in verify when there was none; for a server that lists its tools over MCP
(`expose_tools_over_mcp`), at setup, where those tools are listed (`discover_tools`, environments/nemo_gym_mcp.py)
and offered beside the row's. The cookie is the episode state, with the
managed server's instance id, so an episode seeded on a server that has since died is failed or masked, not scored.
A server whose config names NeMo Gym's gymnasium agent is driven by that agent's protocol instead (/reset, /step:
environments/nemo_gym_gymnasium.py), through `open_episode`, `respond` and `call_tool`.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
from collections.abc import Sequence
from functools import cache
from typing import Any

import httpx
from gymflow.environments import nemo_gym_catalogue as catalogue
from gymflow.environments import nemo_gym_gymnasium as gym
from gymflow.environments import nemo_gym_http as http
from gymflow.environments import nemo_gym_mcp as mcp
from gymflow.environments import nemo_gym_responses as responses
from gymflow.environments import nemo_gym_server as managed
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

from gymflow.kernel.errors import ConfigError, GymflowError, TaskError, ToolError, VerifierError
from gymflow.kernel.failures import ENVIRONMENT_ERROR, VERIFIER_CRASHED
from gymflow.kernel.wire import ChatMessage, Score, Task, ToolSpec

STATE_KEY = "nemo_gym_cookies"
INSTANCE_KEY = "nemo_gym_instance"  # the managed server instance the session was seeded on
_TOOL_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")  # one URL path segment, never `..`
# The server's own endpoints: a tool of these names would let the model seed, verify or close its own session.
RESERVED = frozenset({"seed_session", "verify", "close_session", "aggregate_metrics", "reverify_mode", "mcp",
                      "health", "healthz", "livez", "readyz", "docs", "openapi.json", "redoc"})
_OURS = ("gymflow_request", "gymflow_prompt_len")
# A rollout row (a NeMo Gym rollout file replayed) is the verify reply it recorded: these are that reply's own fields
# (BaseVerifyResponse), never a request's. NeMo Gym's agent seeds and verifies with the task row, which has none;
# sent back, a server that builds its reply as `Reply(**body.model_dump(), reward=r)` fails (equivalence_llm_judge:
# "got multiple values for keyword argument 'reward'"). `response` is the episode's own, set at verify.
RECORDED_OUTCOME = frozenset({"response", "reward", "mask_sample", "failure_kind", "failure_reason"})
# A tool route's 500 (its handler raised) is shown to the model, as NeMo Gym's simple agent shows it; 502-504 and
# connection failures are the platform's (retried, then environment_error).
_TOOL_ANSWERED = frozenset({500})
_MAX_DETAIL_CHARS = 500
VERIFY_ATTEMPTS = 3  # verify is retried here: a VerifierError is final (masked), unlike a tool call's error
VERIFY_BACKOFF_S = 1.0


class NemoGymTask(TaskData):
    resources_server: str = Field(pattern=f"^{http.SERVER_NAME.pattern}$")  # a name, not a path or URL
    # Managed servers only: which of the server's configs/*.yaml, and values merged into its config.
    resources_server_config: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}\.yaml$")
    resources_server_overrides: dict[str, Any] | None = None
    # Filled by parse_task from the task, never from the row: what /seed_session and /verify need of the prompt.
    gymflow_request: JSON = Field(default_factory=dict, exclude=True)
    gymflow_prompt_len: int = Field(0, exclude=True)

    def row(self) -> JSON:
        """The row as NeMo Gym's agent sends it: its own fields plus `responses_create_params`, less a recorded
        rollout's outcome (RECORDED_OUTCOME)."""
        extra = {k: v for k, v in (self.model_extra or {}).items() if k not in RECORDED_OUTCOME}
        return {**extra, "responses_create_params": self.gymflow_request}


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


def _user_run(server: str, options: JSON | None = None) -> bool:
    """Whether the user runs this server (a URL is configured) rather than gymflow."""
    return bool(((options or {}).get("servers") or {}).get(server)) or bool(os.environ.get(http.url_env_var(server)))


def _lost(data: NemoGymTask, was: str, now: str) -> str:
    return (f"NeMo Gym server {data.resources_server} was restarted (instance {was} -> {now}) after this episode's "
            "session was seeded on it (it died, or this step ran on another env worker): the session is lost")


@cache
def _agent(server: str, config: str | None) -> catalogue.Agent:
    """The agent the server's config names (which protocol drives it); Agent(None) where it cannot be read."""
    try:
        return catalogue.agent(catalogue.server(server), config)
    except ConfigError:
        return catalogue.Agent(None)


def gymnasium(data: NemoGymTask) -> bool:
    """Whether NeMo Gym drives this row's server with its gymnasium agent (/reset and /step: nemo_gym_gymnasium)."""
    return _agent(data.resources_server, data.resources_server_config).name == gym.AGENT


class NemoGymEnvironment(Environment[NemoGymTask]):
    name = "nemo_gym"
    task_type = NemoGymTask
    Options = NemoGymOptions
    needs = ("NeMo Gym resources servers: run from NeMo Gym's Python (.nemo313 or $GYMFLOW_NEMO_GYM_PYTHON), or "
             "at $GYMFLOW_NEMO_GYM_<SERVER>_URL; `gymflow env list --nemo-gym`",)
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
        if not _user_run(data.resources_server):
            self._check_runnable(data)
        return data.model_copy(update={"gymflow_request": responses.create_params(task),
                                       "gymflow_prompt_len": len(task.messages)})

    @staticmethod
    def _check_runnable(data: NemoGymTask) -> None:
        """A row for a server gymflow cannot run is refused here, before any episode or server starts."""
        try:
            info = catalogue.server(data.resources_server)
        except ConfigError as e:
            raise TaskError(f"resources_server: {e}") from None
        if refusal := catalogue.refusal_for(info, data.resources_server_overrides):
            raise TaskError(f"resources_server: NeMo Gym server {info.name} cannot run here: {refusal}")
        if data.resources_server_config is not None and data.resources_server_config not in info.configs:
            raise TaskError(f"resources_server_config: {data.resources_server_config!r} is not one of "
                            f"{info.name}'s configs ({', '.join(info.configs) or 'none'})")

    async def _endpoint(self, data: NemoGymTask, options: JSON | None = None) -> tuple[str, str]:
        """(base URL, managed instance id or '' for a server the user runs)."""
        if _user_run(data.resources_server, options):
            return http.server_url(data.resources_server, options), ""
        try:
            spec = managed.Spec.of(data.resources_server, data.resources_server_config,
                                   data.resources_server_overrides)
        except ConfigError as e:
            raise ConfigError(f"{e}; or set {http.url_env_var(data.resources_server)} to a server you run") from None
        return await managed.managed(spec).ensure()

    async def _seed(self, data: NemoGymTask, url: str, timeout: float) -> dict[str, str]:
        return (await self._seed_reply(data, url, timeout))[0]

    async def _seed_reply(self, data: NemoGymTask, url: str, timeout: float) -> tuple[dict[str, str], Any]:
        """(session cookies, the reply's JSON or None)."""
        row = _without(data.row(), await _reply_only_fields(url, timeout))
        reply = await http.post(url, "/seed_session", http.encode(row), {}, timeout)
        if not 200 <= reply.status < 300:
            raise TaskError(f"{data.resources_server}/seed_session refused the row (HTTP {reply.status}): "
                            f"{reply.snippet()}")
        return http.merge_cookies({}, reply.cookies), _json_or_none(reply.text)

    async def discover_tools(self, data: NemoGymTask, state: JSON) -> tuple[list[ToolSpec], JSON]:
        """For a server that lists its tools over MCP: the session seeded now (its token names the tools this
        session may call) and the tools its endpoint lists; the calls then go to their plain routes."""
        if gymnasium(data) or not mcp.lists_tools(data.resources_server, data.resources_server_config,
                                                   data.resources_server_overrides):
            return [], state
        url, instance = await self._endpoint(data)
        timeout = http.timeout_s()
        cookies, reply = await http.with_retries(lambda: self._seed_reply(data, url, timeout))
        where = mcp.endpoint(data.resources_server, reply)
        if where is None:
            raise mcp.McpError(f"{data.resources_server}: its config exposes tools over MCP, but /seed_session "
                               f"announced no `{mcp.KEY}` endpoint")
        tools = await mcp.list_tools(data.resources_server, url, where, cookies, timeout, _check_tool_name)
        return tools, {**state, STATE_KEY: cookies, INSTANCE_KEY: instance}

    def responds(self, task: Task, data: NemoGymTask) -> bool:
        return gymnasium(data)

    async def open_episode(self, data: NemoGymTask, state: JSON) -> tuple[list[ChatMessage], JSON]:
        """/reset: the session, and the observation the gymnasium agent appends to the prompt."""
        url, instance = await self._endpoint(data)
        reply = await http.with_retries(lambda: http.post(url, "/reset", http.encode(gym.row(data.row())), {},
                                                          http.timeout_s()))
        obs, info = gym.parse_reset(data.resources_server, reply)
        cookies = http.merge_cookies({}, reply.cookies)
        return gym.as_user(obs), {**state, **gym.state_after_reset(cookies, instance, info)}

    async def _step(self, data: NemoGymTask, state: JSON, output: list[JSON]
                    ) -> tuple[JSON, str | None, bool, JSON]:
        """One /step of the gymnasium protocol: (state after, observation, episode ended, info)."""
        if state.get(gym.ENDED_KEY):
            raise GymflowError(f"{data.resources_server}: the episode already ended ({state[gym.ENDED_KEY]})",
                               failure_type=ENVIRONMENT_ERROR)
        url, instance = await self._endpoint(data)
        cookies = state.get(STATE_KEY)
        if not isinstance(cookies, dict):
            raise GymflowError(f"{data.resources_server}: no /reset session in the episode state",
                               failure_type=ENVIRONMENT_ERROR)
        if state.get(INSTANCE_KEY, "") != instance:
            raise GymflowError(_lost(data, state.get(INSTANCE_KEY, ""), instance), failure_type=ENVIRONMENT_ERROR)
        body = http.encode(gym.step_body(gym.row(data.row()), state, output, "policy"))
        reply = await http.post(url, "/step", body, cookies, http.timeout_s())
        obs, reward, terminated, truncated, info = gym.parse_step(data.resources_server, reply)
        max_steps = _agent(data.resources_server, data.resources_server_config).max_steps or gym.DEFAULT_MAX_STEPS
        after = gym.after_step({**state, STATE_KEY: http.merge_cookies(cookies, reply.cookies)}, reward,
                               terminated, truncated, max_steps)
        if after.get(gym.ENDED_KEY):
            await _close(url, after)
        return after, obs, bool(after.get(gym.ENDED_KEY)), info

    async def respond(self, data: NemoGymTask, state: JSON, messages: Sequence[ChatMessage]) -> ToolOutput:
        """A turn without tool calls, stepped: the observation is the next user message."""
        after, obs, done, _ = await self._step(data, state, gym.turn_output(messages))
        return ToolOutput(content="" if done else obs or "", state=after, done=done)

    async def call_tool(self, data: NemoGymTask, state: JSON, name: str, args: JSON) -> ToolOutput:
        if problem := _check_tool_name(name):
            raise ToolError(problem)
        if gymnasium(data):  # the call stepped alone; its output is the step's info.tool_outputs
            after, obs, done, info = await self._step(data, state, [gym.function_call(name, args)])
            return gym.tool_turn(after, name, args, obs, info, done)
        try:
            body = http.encode(args)
        except ValueError:
            raise ToolError("arguments must be strict JSON (no NaN or Infinity)") from None
        url, instance = await self._endpoint(data)
        timeout = http.timeout_s()
        cookies = state.get(STATE_KEY)
        if not isinstance(cookies, dict):
            cookies = await self._seed(data, url, timeout)
        elif state.get(INSTANCE_KEY, "") != instance:
            raise GymflowError(_lost(data, state.get(INSTANCE_KEY, ""), instance), failure_type=ENVIRONMENT_ERROR)
        reply = await http.post(url, f"/{name}", body, cookies, timeout, answered=_TOOL_ANSWERED)
        new_state = {**state, STATE_KEY: http.merge_cookies(cookies, reply.cookies), INSTANCE_KEY: instance}
        # NeMo Gym's simple agent: "Resource-server errors are valid model-visible tool outputs". The reply body,
        # whatever its status, is what the model sees: a 404 for a tool the server has no route for
        # (xlam_fc has none: it scores the calls), a 422 for bad arguments, a 500 from a handler that raised.
        return ToolOutput(content=reply.text, state=new_state)

    async def verify(self, data: NemoGymTask, messages: Sequence[ChatMessage], state: JSON,
                     ctx: VerifyContext) -> Score:
        server = data.resources_server
        if gymnasium(data):  # the gymnasium agent's reward: the sum of the steps' (no /verify)
            if not isinstance(state.get(STATE_KEY), dict):
                raise VerifierError(f"{server}: the episode never reached /reset")
            if not state.get(gym.ENDED_KEY):  # ended by gymflow's turn limit: the server's slot is released here
                with contextlib.suppress(ConfigError, GymflowError, managed.ServerCrashed):
                    url, instance = await self._endpoint(data, ctx.options)
                    if instance == state.get(INSTANCE_KEY, ""):
                        await _close(url, state)
            return _checked_reward(server, gym.reward_of(state), {
                "resources_server": server, "steps": int(state.get(gym.STEPS_KEY, 0)),
                "ended": str(state.get(gym.ENDED_KEY) or "turn_limit")})
        timeout = http.timeout_s(ctx.options)
        params = data.gymflow_request
        sent = {**data.row(), "response": responses.response(messages, data.gymflow_prompt_len, params,
                                                              ctx.policy_model)}
        try:
            body = http.encode(sent)
        except ValueError as e:
            raise VerifierError(f"the episode cannot be sent as JSON: {e}") from None
        cookies = state.get(STATE_KEY)
        seeded_on = state.get(INSTANCE_KEY, "")

        async def attempt() -> http.Reply:
            nonlocal cookies, seeded_on
            try:
                url, instance = await self._endpoint(data, ctx.options)
            except (ConfigError, managed.ServerCrashed) as e:
                raise VerifierError(str(e), failure_type=VERIFIER_CRASHED if isinstance(e, managed.ServerCrashed)
                                    else None) from None
            if isinstance(cookies, dict) and seeded_on != instance:
                raise VerifierError(_lost(data, seeded_on, instance), failure_type=VERIFIER_CRASHED)
            if not isinstance(cookies, dict):
                cookies, seeded_on = await self._seed(data, url, timeout), instance
            drop = await _reply_only_fields(url, timeout)
            return await http.post(url, "/verify", http.encode(_without(sent, drop)) if drop else body, cookies,
                                   timeout)

        try:
            reply = await http.with_retries(attempt, attempts=VERIFY_ATTEMPTS, backoff_s=VERIFY_BACKOFF_S)
        except http.ServerUnavailable as e:
            raise VerifierError(f"NeMo Gym server {server!r} could not verify after {VERIFY_ATTEMPTS} attempts: {e}"
                                ) from None
        if not 200 <= reply.status < 300:
            raise VerifierError(f"{server}/verify refused the episode (HTTP {reply.status}): {reply.snippet()}")
        return _score(server, reply, sent)

    def close(self) -> None:
        """Stop the servers this process started (they also stop at exit, or with the process)."""
        managed.stop_all()

    async def validate(self, task: Task) -> Score | None:
        return None  # NeMo Gym rows carry no gold transcript


_REPLY_ONLY: dict[str, frozenset[str]] = {}  # a server's base URL -> its verify reply's own fields


async def _reply_only_fields(url: str, timeout: float) -> frozenset[str]:
    """The fields of the server's /verify reply model that its request model lacks (its OpenAPI schema, read once
    per server): a replayed rollout row's recorded outcome (`judge_evaluations`, `extracted_answer`), which a server
    whose request model allows extra fields would get back and collide with (RECORDED_OUTCOME, generalised). Empty
    when the schema cannot be read: RECORDED_OUTCOME is dropped regardless."""
    if url in _REPLY_ONLY:
        return _REPLY_ONLY[url]
    try:
        async with httpx.AsyncClient(timeout=timeout, trust_env=False, verify=http.tls_context()) as client:
            spec = (await client.get(f"{url}/openapi.json")).json()
        post = spec["paths"]["/verify"]["post"]
        models = spec["components"]["schemas"]

        def fields(schema: dict[str, Any]) -> set[str]:
            return set(models[schema["$ref"].rsplit("/", 1)[-1]].get("properties") or {})
        request = fields(post["requestBody"]["content"]["application/json"]["schema"])
        reply = fields(post["responses"]["200"]["content"]["application/json"]["schema"])
    except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError):
        return frozenset()
    _REPLY_ONLY[url] = frozenset(reply - request)
    return _REPLY_ONLY[url]


async def _close(url: str, state: JSON) -> None:
    """POST /close for a server that asked for it at /reset (the gymnasium agent's cleanup); best effort: a failed
    close changes no verdict (the agent only warns), and the server expires what is left."""
    cookies = state.get(STATE_KEY)
    if state.get(gym.CLOSE_KEY) and isinstance(cookies, dict):
        with contextlib.suppress(http.ServerUnavailable):
            await http.post(url, "/close", b"{}", cookies, min(http.timeout_s(), 10.0))


def _without(row: JSON, drop: frozenset[str]) -> JSON:
    return {k: v for k, v in row.items() if k not in drop or k in ("response", "responses_create_params")}


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _checked_reward(server: str, reward: float, details: JSON) -> Score:
    if not 0.0 <= reward <= 1.0:
        raise VerifierError(f"{server} answered reward {reward:g}, outside [0, 1]: gymflow records rewards in "
                            "[0, 1]; check the server's config (a reward scale or penalty setting)")
    return Score(reward=float(reward), details=details)


def _score(server: str, reply: http.Reply, sent: JSON) -> Score:
    body = _json_or_none(reply.text)
    if not isinstance(body, dict):
        raise VerifierError(f"{server}/verify answered something that is not a JSON object: {reply.snippet()}")
    reward = body.get("reward")
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
        raise VerifierError(f"{server}/verify answered no finite number as reward: {str(reward)[:80]}")
    _checked_reward(server, reward, {})
    if body.get("mask_sample") is True:  # the server says its own infrastructure failed: not a measurement
        reason = f"{body.get('failure_kind') or 'unspecified'}: {str(body.get('failure_reason') or '')[:300]}"
        raise VerifierError(f"{server}/verify masked the sample ({reason})")
    return Score(reward=float(reward), details={"resources_server": server, **_scalar_details(body, sent)})

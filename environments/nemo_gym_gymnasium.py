"""NeMo Gym's gymnasium agent's protocol (`responses_api_agents/gymnasium_agent/app.py`), as gymflow's episode.

A server whose config names `gymnasium_agent` (wordle, blackjack, example_multi_turn_gymnasium, ...) has no
`/seed_session` or `/verify`: `/reset` with the row starts the episode (a session cookie, and an observation the
agent appends to the prompt as a user message), and every model turn goes to `/step` as a Responses `response`
holding that turn's output. A step's reply is (observation, reward, terminated, truncated, info): the observation is
the next user message, `info.tool_outputs` the outputs of the turn's function calls, and `terminated` or `truncated`
ends the episode (so does the agent's `max_steps`). The reward is the sum of the steps' rewards, as the agent
reports it. In gymflow a turn without tool calls is stepped by `respond` (the next user message), a tool call by
`call_tool` (its output, then the observation, is the tool message); the state carries the cookies, the managed
server's instance, the steps taken and the reward so far.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from typing import Any

from gymflow.environments import nemo_gym_http as http
from gymflow.environments import nemo_gym_responses as responses
from gymflow.environments.base import JSON, ToolOutput

from gymflow.kernel.errors import GymflowError, TaskError
from gymflow.kernel.failures import ENVIRONMENT_ERROR
from gymflow.kernel.wire import ChatMessage

AGENT = "gymnasium_agent"
DEFAULT_MAX_STEPS = 10  # GymnasiumAgentConfig.max_steps
STEPS_KEY = "nemo_gym_steps"
REWARD_KEY = "nemo_gym_reward"
ENDED_KEY = "nemo_gym_ended"  # "terminated", "truncated", or absent while the episode runs
IDEMPOTENT_KEY = "nemo_gym_step_ids"  # the server takes `_ng_step_request_id` (its reset info said so)
CLOSE_KEY = "nemo_gym_close"  # the server wants POST /close when the episode ends (`supports_explicit_close`)
CALL_ID = "call_gymflow"  # a tool call stepped alone: the id its function_call item and tool output share


# A replayed rollout row is the agent's reply (GymnasiumRunResponse): its own fields are not the row's, which the
# agent sends to /reset and /step as the task had it.
RECORDED = frozenset({"terminated", "truncated", "info"})


def row(row: JSON) -> JSON:
    return {k: v for k, v in row.items() if k not in RECORDED}


def response(model: str, output: list[JSON]) -> JSON:
    return {"id": "resp_gymflow", "object": "response", "created_at": 0.0, "model": model or "policy",
            "status": "completed", "output": output, "tools": [], "tool_choice": "auto",
            "parallel_tool_calls": True, "incomplete_details": None, "error": None, "metadata": {}}


def parse_reset(server: str, reply: http.Reply) -> tuple[str | None, JSON]:
    """(observation, info) of a /reset reply; a 4xx is the row's fault (TaskError)."""
    if not 200 <= reply.status < 300:
        raise TaskError(f"{server}/reset refused the row (HTTP {reply.status}): {reply.snippet()}")
    body = _object(server, "/reset", reply)
    obs = body.get("observation")
    info = body.get("info") if isinstance(body.get("info"), dict) else {}
    return (obs if isinstance(obs, str) and obs else None), info


def parse_step(server: str, reply: http.Reply) -> tuple[str | None, float, bool, bool, JSON]:
    """(observation, reward, terminated, truncated, info) of a /step reply. A server that answers no step (4xx,
    not JSON, a reward that is no finite number) failed the platform's way: the episode is failed, never scored."""
    if not 200 <= reply.status < 300:
        raise GymflowError(f"{server}/step refused the turn (HTTP {reply.status}): {reply.snippet()}",
                           failure_type=ENVIRONMENT_ERROR)
    body = _object(server, "/step", reply)
    reward = body.get("reward", 0.0)
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
        raise GymflowError(f"{server}/step answered no finite number as reward: {str(reward)[:80]}",
                           failure_type=ENVIRONMENT_ERROR)
    obs = body.get("observation")
    info = body.get("info") if isinstance(body.get("info"), dict) else {}
    return ((obs if isinstance(obs, str) and obs else None), float(reward), body.get("terminated") is True,
            body.get("truncated") is True, info)


def _object(server: str, path: str, reply: http.Reply) -> JSON:
    try:
        body = json.loads(reply.text)
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise GymflowError(f"{server}{path} answered something that is not a JSON object: {reply.snippet()}",
                           failure_type=ENVIRONMENT_ERROR)
    return body


def step_body(row: JSON, state: JSON, output: list[JSON], model: str) -> JSON:
    body = {**row, "response": response(model, output)}
    if state.get(IDEMPOTENT_KEY):  # the same step retried (the activity's retry) carries the same id
        seed = json.dumps([state.get("nemo_gym_cookies"), state.get(STEPS_KEY, 0)], sort_keys=True)
        body["_ng_step_request_id"] = hashlib.sha256(seed.encode()).hexdigest()[:32]
    return body


def after_step(state: JSON, reward: float, terminated: bool, truncated: bool, max_steps: int) -> JSON:
    steps = int(state.get(STEPS_KEY, 0)) + 1
    new = {**state, STEPS_KEY: steps, REWARD_KEY: float(state.get(REWARD_KEY, 0.0)) + reward}
    if terminated:
        new[ENDED_KEY] = "terminated"
    elif truncated or steps >= max_steps:  # the agent's loop ends after max_steps steps: truncated
        new[ENDED_KEY] = "truncated"
    return new


def turn_output(messages: Sequence[ChatMessage]) -> list[JSON]:
    """The last assistant message as the Responses output items of that model turn."""
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].role == "assistant":
            return responses.items([messages[i]], i)
    return []


def tool_turn(state: JSON, name: str, args: JSON, obs: str | None, info: JSON, done: bool) -> ToolOutput:
    """A tool call stepped: its output (info.tool_outputs), then the observation, as the tool message."""
    outputs = [o for o in info.get("tool_outputs") or () if isinstance(o, dict)]
    mine = [str(o.get("output", "")) for o in outputs if o.get("call_id") == CALL_ID] or \
        [str(o.get("output", "")) for o in outputs]
    parts = [*mine, *([obs] if obs and not done else [])]
    return ToolOutput(content="\n\n".join(parts), state=state, done=done)


def function_call(name: str, args: JSON) -> JSON:
    return {"type": "function_call", "id": "fc_gymflow", "call_id": CALL_ID, "name": name,
            "arguments": json.dumps(args), "status": "completed"}


def reward_of(state: JSON) -> float:
    return float(state.get(REWARD_KEY, 0.0))


def as_user(obs: str | None) -> list[ChatMessage]:
    return [ChatMessage(role="user", content=obs)] if obs else []


def state_after_reset(cookies: dict[str, str], instance: str, info: JSON) -> dict[str, Any]:
    state: dict[str, Any] = {"nemo_gym_cookies": cookies, "nemo_gym_instance": instance, STEPS_KEY: 0,
                             REWARD_KEY: 0.0}
    if info.get("supports_step_idempotency") is True:
        state[IDEMPOTENT_KEY] = True
    if info.get("supports_explicit_close") is True:
        state[CLOSE_KEY] = True
    return state

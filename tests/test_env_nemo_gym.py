"""nemo_gym: the HTTP protocol of NeMo Gym's resources servers against a scriptable in-test server double
(seeding, cookies, tool calls, /verify bodies), and every way the server or the model can misbehave."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from gymflow.activities.boundary import classify
from gymflow.activities.env_activities import run_tool_call, verify_episode
from gymflow.environments import nemo_gym as ng
from gymflow.environments import nemo_gym_http as http
from gymflow.environments.base import VerifyContext
from gymflow.environments.nemo_gym_responses import items
from gymflow.environments.registry import get_environment

from gymflow.data.datasets import load_jsonl, row_to_task
from gymflow.data.routing import route_problem
from gymflow.kernel.errors import ConfigError, TaskError, VerifierError
from gymflow.kernel.responses_format import input_to_messages
from gymflow.kernel.wire import ChatMessage, FunctionCall, Task, ToolCall
from tests.conftest import SHARED

COOKIE = "SimpleWeatherResourcesServer___weather"
WEATHER_TOOL = {"type": "function", "name": "get_weather", "description": "", "strict": True,
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
Handler = Callable[[dict[str, Any]], tuple[Any, ...]]  # (status, body[, headers as a dict or (name, value) list])


@dataclass
class Double:
    """A resources server double: `routes[path](request) -> (status, body[, headers])`, requests recorded."""

    url: str
    routes: dict[str, Handler] = field(default_factory=dict)
    requests: list[dict[str, Any]] = field(default_factory=list)

    def paths(self) -> list[str]:
        return [r["path"] for r in self.requests]


def _serve() -> Iterator[Double]:
    double = Double(url="")

    class H(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # keep test output quiet
            pass

        def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            req = {"path": self.path, "json": json.loads(raw) if raw else None, "raw": raw,
                   "cookie": self.headers.get("Cookie")}
            double.requests.append(req)
            route = double.routes.get(self.path)
            status, body, *rest = route(req) if route else (404, {"detail": "Not Found"})
            headers = rest[0] if rest else []
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            try:
                self.send_response(status)
                for k, v in (headers.items() if isinstance(headers, dict) else headers):
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), H)
    server.daemon_threads = True
    double.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield double
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def srv(monkeypatch: pytest.MonkeyPatch) -> Iterator[Double]:
    for double in _serve():
        monkeypatch.setenv("GYMFLOW_NEMO_GYM_WEATHER_URL", double.url)
        monkeypatch.setattr(ng, "VERIFY_BACKOFF_S", 0.0)
        double.routes["/seed_session"] = lambda req, n=iter(range(1, 1000)): (
            200, {}, {"Set-Cookie": f"{COOKIE}=sess{next(n)}; path=/"})
        double.routes["/get_weather"] = lambda req: (200, {"city": req["json"]["city"], "weather_description": "cold"})
        double.routes["/verify"] = lambda req: (200, {**req["json"], "reward": 1.0, "extracted": "x"})
        yield double


def task(**extra: Any) -> Task:
    row = {"responses_create_params": {"input": [{"role": "developer", "content": "be nice"},
                                                 {"role": "user", "content": "weather in sf?"}],
                                       "tools": [WEATHER_TOOL], "temperature": 0.5},
           "resources_server": "weather", "expected": "sf", **extra}
    return row_to_task(row, env="nemo_gym", default_id="t")


ENV = ng.NemoGymEnvironment()


def call(name: str, args: str, cid: str = "c1") -> ChatMessage:
    return ChatMessage(role="assistant", tool_calls=(ToolCall(id=cid, function=FunctionCall(name=name,
                                                                                             arguments=args)),))


# ---- rows ------------------------------------------------------------------------------------------------

def test_registered_under_its_entry_point() -> None:
    assert isinstance(get_environment("nemo_gym"), ng.NemoGymEnvironment)


@pytest.mark.parametrize("extra, where", [
    ({"resources_server": None}, "resources_server"),
    ({"resources_server": "../verify"}, "resources_server"),
    ({"gymflow_request": {}}, "gymflow_request"),
])
def test_bad_rows_name_the_field(extra: dict[str, Any], where: str) -> None:
    t = task(**extra)
    if extra.get("resources_server", "") is None:
        t = t.model_copy(update={"data": {k: v for k, v in t.data.items() if k != "resources_server"}})
    with pytest.raises(TaskError, match=where):
        ENV.parse_task(t)


@pytest.mark.parametrize("name", ["verify", "seed_session", "close_session", "a/b"])
def test_a_row_cannot_offer_the_servers_own_endpoints_as_tools(name: str) -> None:
    row = {"responses_create_params": {"input": "hi", "tools": [{**WEATHER_TOOL, "name": name}]},
           "resources_server": "weather"}
    with pytest.raises(TaskError, match=r"tools\[0\]\.name"):
        ENV.parse_task(row_to_task(row, env="nemo_gym", default_id="t"))


def test_any_nemo_gym_row_loads_here_not_routed_to_a_look_alike(tmp_path: Any, monkeypatch: pytest.MonkeyPatch
                                                                   ) -> None:
    # Servers the user runs (a URL is set): no NeMo Gym install is consulted.
    monkeypatch.setenv("GYMFLOW_NEMO_GYM_MATH_WITH_JUDGE_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("GYMFLOW_NEMO_GYM_WEATHER_URL", "http://127.0.0.1:9")
    rows = [json.loads(line) for line in (SHARED / "math_with_judge" / "example.jsonl").read_text().splitlines()]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({**r, "resources_server": "math_with_judge"}) + "\n" for r in rows))
    tasks, errors = load_jsonl(path, env="nemo_gym")
    assert errors == [] and len(tasks) == 5
    # ...and a row naming a resources server, sent elsewhere, is pointed here.
    problem = route_problem("single_tool", task())
    assert problem is not None and "nemo_gym" in problem


def test_transcript_items_round_trip_through_the_row_converter() -> None:
    msgs = [ChatMessage(role="system", content="s"), ChatMessage(role="user", content="u"),
            call("get_weather", '{"city": "SF"}'), ChatMessage(role="tool", tool_call_id="c1", content="cold"),
            ChatMessage(role="assistant", content="It is cold.")]
    assert input_to_messages(items(msgs)) == msgs


# ---- the session and tool calls ----------------------------------------------------------------------------

async def test_seeds_once_then_sends_the_session_cookie_on_every_call(srv: Double) -> None:
    t = task()
    data = ENV.parse_task(t)
    first = await ENV.call_tool(data, ENV.setup(t, data), "get_weather", {"city": "SF"})
    second = await ENV.call_tool(data, first.state, "get_weather", {"city": "LA"})
    score = await ENV.verify(data, [*t.messages, call("get_weather", '{"city":"SF"}')], second.state,
                             VerifyContext("policy"))
    assert srv.paths() == ["/seed_session", "/get_weather", "/get_weather", "/verify"]
    assert [r["cookie"] for r in srv.requests] == [None] + [f"{COOKIE}=sess1"] * 3
    assert json.loads(first.content) == {"city": "SF", "weather_description": "cold"}
    assert second.state == {ng.STATE_KEY: {COOKIE: "sess1"}, ng.INSTANCE_KEY: ""}  # "": a server the user runs
    seed = srv.requests[0]["json"]
    assert seed["expected"] == "sf" and "resources_server" not in seed
    assert seed["responses_create_params"]["tools"][0]["name"] == "get_weather"
    assert seed["responses_create_params"]["temperature"] == 0.5
    assert [m["role"] for m in seed["responses_create_params"]["input"]] == ["system", "user"]
    assert score.reward == 1.0 and score.details == {"resources_server": "weather", "extracted": "x"}


async def test_verify_seeds_when_no_tool_was_called_and_sends_the_episode_as_a_response(srv: Double) -> None:
    t = task()
    data = ENV.parse_task(t)
    nul = "boxed \x00 answer \ud800" + "x" * 200_000  # hostile: NUL, a lone surrogate, large
    answer = ChatMessage(role="assistant", content=nul, reasoning_content="thinking")
    await ENV.verify(data, [*t.messages, call("get_weather", '{"city": "SF"}'),
                            ChatMessage(role="tool", tool_call_id="c1", content="cold"), answer],
                     {}, VerifyContext("my-model"))
    assert srv.paths() == ["/seed_session", "/verify"]
    assert srv.requests[1]["cookie"] == f"{COOKIE}=sess1"
    resp = srv.requests[1]["json"]["response"]
    assert resp["model"] == "my-model" and resp["object"] == "response"
    assert [o["type"] for o in resp["output"]] == ["function_call", "function_call_output", "reasoning", "message"]
    assert resp["output"][0]["call_id"] == resp["output"][1]["call_id"] == "c1"
    assert resp["output"][3]["content"][0]["text"] == nul


@pytest.mark.parametrize("status, body", [
    (422, {"detail": [{"loc": ["body", "city"], "msg": "Field required"}]}),  # FastAPI's refusal of the arguments
    (404, {"detail": "Not Found"}),  # no route for the tool (xlam_fc has none: it scores the calls themselves)
    (404, {"error": "no such city"}),  # the tool's own 404
    (500, b"Internal Server Error"),  # the tool's handler raised
])
async def test_a_tool_routes_error_is_shown_to_the_model_as_nemo_gyms_agent_shows_it(
        srv: Double, status: int, body: Any) -> None:
    srv.routes["/get_weather"] = lambda req: (status, body, {"Set-Cookie": "extra=1; path=/"})
    t = task()
    data = ENV.parse_task(t)
    result = await run_tool_call(ENV, t, data, {}, ToolCall(id="c", function=FunctionCall(
        name="get_weather", arguments='{"city": "SF"}')))
    # The body verbatim, as the simple agent's function_call_output; the episode goes on, the session kept.
    assert result.message.content == (body.decode() if isinstance(body, bytes) else json.dumps(body))
    assert result.state[ng.STATE_KEY] == {COOKIE: "sess1", "extra": "1"}
    score = await ENV.verify(data, [*t.messages, call("get_weather", '{"city": "SF"}', "c"), result.message],
                             result.state, VerifyContext("p"))
    assert score.reward == 1.0 and srv.paths() == ["/seed_session", "/get_weather", "/verify"]
    output = srv.requests[2]["json"]["response"]["output"]
    assert output[1] == {"type": "function_call_output", "call_id": "c", "output": result.message.content}


@pytest.mark.parametrize("name, args", [("verify", "{}"), ("../seed_session", "{}"), ("get_weather", '{"c": NaN}')])
async def test_hostile_tool_calls_are_the_models_errors(srv: Double, name: str, args: str) -> None:
    t = task()
    t = t.model_copy(update={"tools": (*t.tools, t.tools[0].model_copy(update={"name": name}))})
    data = ENV.parse_task(task())
    result = await run_tool_call(ENV, t, data, {}, ToolCall(id="c", function=FunctionCall(name=name, arguments=args)))
    assert result.is_error and result.state == {}
    assert "/verify" not in srv.paths()


@pytest.mark.parametrize("status", [502, 503, 504, 429])
async def test_a_failing_server_is_retried_by_the_platform_never_shown_to_the_model(srv: Double, status: int) -> None:
    srv.routes["/get_weather"] = lambda req: (status, {"detail": "boom"})
    with pytest.raises(http.ServerUnavailable, match=str(status)) as err:
        await ENV.call_tool(ENV.parse_task(task()), {}, "get_weather", {"city": "SF"})
    typed = classify(err.value, "environment")
    assert typed.type == "environment_error" and not typed.non_retryable


async def test_a_server_that_is_down_or_hangs_is_unavailable(srv: Double, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GYMFLOW_NEMO_GYM_TIMEOUT_S", "0.5")
    srv.routes["/get_weather"] = lambda req: (time.sleep(3), (200, {}))[1]
    data = ENV.parse_task(task())
    started = time.monotonic()
    with pytest.raises(http.ServerUnavailable, match="no reply within 0.5 s"):
        await ENV.call_tool(data, {}, "get_weather", {"city": "SF"})
    assert time.monotonic() - started < 2.5
    monkeypatch.setenv("GYMFLOW_NEMO_GYM_WEATHER_URL", "http://127.0.0.1:9")  # nothing listens on discard
    with pytest.raises(http.ServerUnavailable, match="Connect"):
        await ENV.call_tool(data, {}, "get_weather", {"city": "SF"})


async def test_oversized_replies_and_cookies_are_refused(srv: Double, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http, "MAX_REPLY_BYTES", 1000)
    srv.routes["/get_weather"] = lambda req: (200, b"x" * 5000)
    data = ENV.parse_task(task())
    with pytest.raises(http.ServerUnavailable, match="over 1,000 bytes"):
        await ENV.call_tool(data, {ng.STATE_KEY: {}}, "get_weather", {"city": "SF"})
    big = [("Set-Cookie", f"big{i}={'a' * 3000}") for i in range(3)]
    srv.routes["/seed_session"] = lambda req: (200, {}, big)
    srv.routes["/get_weather"] = lambda req: (200, {})
    with pytest.raises(http.ServerUnavailable, match="cookies"):
        await ENV.call_tool(data, {}, "get_weather", {"city": "SF"})


async def test_a_row_the_server_refuses_at_seeding_is_a_bad_task(srv: Double) -> None:
    srv.routes["/seed_session"] = lambda req: (422, {"detail": "question: Field required"})
    with pytest.raises(TaskError, match="seed_session refused the row.*question"):
        await ENV.call_tool(ENV.parse_task(task()), {}, "get_weather", {"city": "SF"})


# ---- configuration ----------------------------------------------------------------------------------------

async def test_urls_come_from_the_env_var_or_the_runs_options_and_secrets_stay_out(
        srv: Double, monkeypatch: pytest.MonkeyPatch) -> None:
    data = ENV.parse_task(task())
    monkeypatch.delenv("GYMFLOW_NEMO_GYM_WEATHER_URL")
    with pytest.raises(ConfigError, match="GYMFLOW_NEMO_GYM_WEATHER_URL"):
        await ENV.call_tool(data, {}, "get_weather", {"city": "SF"})
    score = await ENV.verify(data, [], {}, VerifyContext("p", options={"servers": {"weather": srv.url}}))
    assert score.reward == 1.0
    monkeypatch.setenv("GYMFLOW_NEMO_GYM_WEATHER_URL", "ftp://user:hunter2@host/")
    with pytest.raises(ConfigError, match="http") as err:
        await ENV.call_tool(data, {}, "get_weather", {"city": "SF"})
    assert "hunter2" not in str(err.value)
    monkeypatch.setenv("GYMFLOW_NEMO_GYM_WEATHER_URL", "http://user:hunter2@127.0.0.1:9")
    with pytest.raises(http.ServerUnavailable) as down:
        await ENV.call_tool(data, {}, "get_weather", {"city": "SF"})
    assert "hunter2" not in str(down.value)


# ---- verify ----------------------------------------------------------------------------------------------

async def test_verify_retries_a_flaky_server_within_bounds(srv: Double) -> None:
    answers = iter([(503, "busy"), (500, "oops"), (200, {"reward": 0.25})])
    srv.routes["/verify"] = lambda req: next(answers)
    score = await ENV.verify(ENV.parse_task(task()), [], {ng.STATE_KEY: {COOKIE: "s"}}, VerifyContext("p"))
    assert score.reward == 0.25 and srv.paths().count("/verify") == 3


@pytest.mark.parametrize("status, body, why", [
    (503, {"detail": "down"}, "after 3 attempts"),
    (422, {"detail": "response: Field required"}, "refused the episode"),
    (200, b"<html>proxy error</html>", "not a JSON object"),
    (200, {"reward": "1"}, "no finite number"),
    (200, {"reward": True}, "no finite number"),
    (200, {"reward": 1.5}, "outside \\[0, 1\\]"),
    (200, {"reward": -0.5}, "outside \\[0, 1\\]"),
    (200, b'{"reward": NaN}', "no finite number"),
    (200, {"reward": 1.0, "mask_sample": True, "failure_kind": "judge_unavailable"}, "judge_unavailable"),
])
async def test_an_unscorable_episode_is_masked_never_zero(srv: Double, status: int, body: Any, why: str) -> None:
    srv.routes["/verify"] = lambda req: (status, body)
    data = ENV.parse_task(task())
    with pytest.raises(VerifierError, match=why):
        await ENV.verify(data, [], {ng.STATE_KEY: {}}, VerifyContext("p"))
    score = await verify_episode(ENV, data, [], {ng.STATE_KEY: {}}, VerifyContext("p"))
    assert score.masked and score.reward is None and score.failure_type == "verifier_failed"
    assert srv.paths().count("/verify") <= 2 * ng.VERIFY_ATTEMPTS


async def test_details_keep_the_verifiers_scalars_not_the_echoed_request(srv: Double) -> None:
    srv.routes["/verify"] = lambda req: (200, {**req["json"], "reward": 0.0, "note": "n" * 5000, "nested": {"a": 1},
                                               "library_reward": 0.0, "none": None})
    score = await ENV.verify(ENV.parse_task(task()), [], {ng.STATE_KEY: {}}, VerifyContext("p"))
    assert score.reward == 0.0
    assert set(score.details) == {"resources_server", "note", "library_reward", "none"}
    assert len(score.details["note"]) == 500


# ---- end to end --------------------------------------------------------------------------------------------

@pytest.mark.integration
async def test_a_durable_rollout_drives_the_server(gf: Any, scripted: Any, sql: Any, run_id: str, srv: Double) -> None:
    """Temporal, the env pool and Postgres: the seed and the cookie survive the activity boundary into verify."""
    from gymflow.testing.scripted_openai import text, tool_call

    scripted.script(tool_call("get_weather", {"city": "SF"}), text("It is cold."))
    summary = await gf.run_rollout(gf.make_input(run_id, task(), 0, "policy", max_turns=5))
    assert summary.status == "completed" and summary.reward == 1.0 and summary.tool_calls == 1
    assert srv.paths() == ["/seed_session", "/get_weather", "/verify"]
    assert srv.requests[2]["cookie"] == f"{COOKIE}=sess1"
    output = srv.requests[2]["json"]["response"]["output"]
    assert [o["type"] for o in output] == ["function_call", "function_call_output", "message"]
    (transcript,) = sql("SELECT transcript FROM rollouts WHERE id = %s", summary.rollout_id)[0]
    assert json.loads(transcript[3]["content"]) == {"city": "SF", "weather_description": "cold"}

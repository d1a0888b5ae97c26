"""nemo_gym servers that list their tools over MCP (environments/nemo_gym_mcp.py, `discover_tools`).

The listing against a scripted endpoint that misbehaves in each way a hostile or broken server could; then NeMo
Gym 0.7.0's own example_mcp_weather (its rows offer no tools; `get_weather` is only on its MCP endpoint) through
Temporal, the env pool and Postgres: the model is offered the listed tool, its call reaches the server's session,
and the rollout scores as NeMo Gym scores it.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from gymflow.environments import nemo_gym_mcp as mcp
from gymflow.environments.nemo_gym import _check_tool_name
from gymflow.environments.nemo_gym_http import url_env_var

from gymflow.data.datasets import row_to_task
from tests.test_nemo_gym_gymnasium import SERVERS_DIR, needs_nemo

Answer = Callable[[dict[str, Any]], tuple[int, Any]]
WEATHER = {"name": "get_weather", "description": "Weather.", "inputSchema": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


@pytest.fixture
def endpoint() -> Iterator[tuple[str, list[Answer], list[dict[str, Any]]]]:
    """(base URL, the answers to give in turn, the requests seen with their headers)."""
    answers: list[Answer] = []
    seen: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append({"path": self.path, "body": body, "headers": dict(self.headers)})
            status, reply = answers.pop(0)(body) if answers else (500, "no answer scripted")
            data = reply.encode() if isinstance(reply, str) else json.dumps(reply).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", answers, seen
    finally:
        server.shutdown()


def _tools(*tools: Any, cursor: str | None = None) -> Answer:
    def answer(body: dict[str, Any]) -> tuple[int, Any]:
        result: dict[str, Any] = {"tools": list(tools)}
        if cursor:
            result["nextCursor"] = cursor
        return 200, {"jsonrpc": "2.0", "id": body["id"], "result": result}
    return answer


async def _list(url: str) -> list[Any]:
    where = mcp.endpoint("srv", {"mcp": {"server_name": "srv", "url_path": "/mcp", "transport": "http",
                                         "headers": {"X-NeMo-Gym-Session-Token": "tok.en"}}})
    assert where == ("/mcp", {"X-NeMo-Gym-Session-Token": "tok.en"})
    return await mcp.list_tools("srv", url, where, {"session": "abc"}, 5.0, _check_tool_name)


async def test_the_listed_tools_are_offered_with_the_session_token_and_cookie(endpoint: Any) -> None:
    url, answers, seen = endpoint
    answers += [_tools(WEATHER, cursor="page2"), _tools({"name": "get_forecast"})]
    tools = await _list(url)
    assert [(t.name, t.parameters) for t in tools] == [
        ("get_weather", WEATHER["inputSchema"]), ("get_forecast", {"type": "object", "properties": {}})]
    first, second = seen
    assert first["body"]["method"] == "tools/list" and second["body"]["params"] == {"cursor": "page2"}
    assert first["headers"]["X-NeMo-Gym-Session-Token"] == "tok.en" and "session=abc" in first["headers"]["Cookie"]


@pytest.mark.parametrize("answer, says", [
    (lambda b: (200, "<html>not json</html>"), "did not answer JSON"),
    (lambda b: (200, {"jsonrpc": "2.0", "id": 1, "error": {"code": -32601, "message": "Method not found"}}),
     "Method not found"),
    (lambda b: (404, {"detail": "Not Found"}), "HTTP 404"),
    (_tools({"name": "verify"}), "the resources server's own endpoints"),
    (_tools({"name": "../seed_session"}), "not one URL path segment"),
    (_tools(WEATHER, WEATHER), "names a tool twice"),
    (_tools({"description": "nameless"}), "a tool without a name"),
    (_tools({"name": "big", "inputSchema": {"x": "y" * 70_000}}), "inputSchema"),
    (_tools(*({"name": f"t{i}"} for i in range(mcp.MAX_TOOLS + 1))), f"over {mcp.MAX_TOOLS} tools"),
], ids=["not-json", "rpc-error", "http-404", "reserved-name", "path-name", "twice", "nameless", "huge-schema",
        "too-many"])
async def test_a_listing_that_is_not_a_tool_list_fails_the_episode_by_name(endpoint: Any, answer: Answer,
                                                                            says: str) -> None:
    url, answers, _ = endpoint
    answers.append(answer)
    with pytest.raises(mcp.McpError, match="srv") as raised:
        await _list(url)
    assert says in str(raised.value) and raised.value.failure_type == "environment_error"


async def test_a_cursor_that_never_ends_stops_after_the_page_bound(endpoint: Any) -> None:
    url, answers, seen = endpoint
    answers += [_tools({"name": f"t{i}"}, cursor="again") for i in range(mcp.MAX_PAGES + 2)]
    with pytest.raises(mcp.McpError, match=f"still paging after {mcp.MAX_PAGES} pages"):
        await _list(url)
    assert len(seen) == mcp.MAX_PAGES


@pytest.mark.parametrize("meta, says", [
    ("a string", "not an object"),
    ({"url_path": "http://elsewhere/mcp", "headers": {}}, "not a path"),
    ({"url_path": "/../mcp", "headers": {}}, "not a path"),
    ({"transport": "sse", "headers": {}}, "streamable HTTP only"),
    ({"headers": {"X-Token": "two\r\nlines"}}, "plain HTTP headers"),
    ({"headers": {"Bad Name": "v"}}, "plain HTTP headers"),
])
def test_an_announced_endpoint_is_checked_before_it_is_called(meta: Any, says: str) -> None:
    with pytest.raises(mcp.McpError, match=says):
        mcp.endpoint("srv", {"mcp": meta})
    assert mcp.endpoint("srv", {}) is None and mcp.endpoint("srv", None) is None


SERVER = "example_mcp_weather"


@needs_nemo
@pytest.mark.integration
async def test_a_tool_only_the_mcp_endpoint_lists_is_offered_called_and_scored(gf: Any, scripted: Any, sql: Any,
                                                                             run_id: str) -> None:
    """The row offers no tools; the env worker starts the server, lists `get_weather` from its MCP endpoint, and the
    model's call lands in the session /verify reads (reward 1 as NeMo Gym scores it); a tool nobody listed is
    answered as unknown without reaching the server."""
    from gymflow.environments import nemo_gym_server as managed
    from gymflow.workflows.episode import EpisodeWorkflow
    from temporalio.contrib.pydantic import pydantic_data_converter
    from temporalio.worker import Replayer

    from gymflow.testing.scripted_openai import text, tool_call

    assert SERVERS_DIR is not None
    task = json.loads((SERVERS_DIR / SERVER / "data" / "example.jsonl").read_text().splitlines()[0])
    assert task["responses_create_params"].get("tools") in (None, [])
    city = task["verifier_metadata"]["expected_city"]
    sentence = f"The weather in {city} is sunny and 72 F."
    os.environ.pop(url_env_var(SERVER), None)  # gymflow runs it
    try:
        scripted.script(tool_call("get_forecast", {"city": city}), tool_call("get_weather", {"city": city}),
                        text(sentence))
        t = row_to_task({**task, "resources_server": SERVER}, env="nemo_gym", default_id="w0")
        summary = await gf.run_rollout(gf.make_input(run_id, t, 0, "policy", max_turns=6))
        assert summary.status == "completed" and summary.reward == 1.0, summary
        offered = [tool["function"]["name"] for tool in scripted.requests[0].body["tools"]]
        assert offered == ["get_weather"]
        (transcript,) = sql("SELECT transcript FROM rollouts WHERE id = %s", summary.rollout_id)[0]
        outputs = [m["content"] for m in transcript if m["role"] == "tool"]
        assert "unknown tool 'get_forecast'; available: get_weather" in outputs[0]
        assert json.loads(outputs[1]) == {"weather": sentence}
        history = await gf.temporal.get_workflow_handle(summary.rollout_id).fetch_history()
        assert "X-NeMo-Gym-Session-Token" not in json.dumps(history.to_json_dict())  # the token stays in the call
        replayed = await Replayer(workflows=[EpisodeWorkflow], data_converter=pydantic_data_converter
                                  ).replay_workflow(history, raise_on_replay_failure=False)
        assert replayed.replay_failure is None, replayed.replay_failure
    finally:
        managed.stop_all()

"""Model endpoints are probed once at start and a problem is one line naming the URL (never the key)."""

from __future__ import annotations

import json
import socket

import pytest
from aiohttp import web
from click.testing import CliRunner

from gymflow.cli.collect_cmd import collect
from gymflow.cli.probe import probe_model
from gymflow.kernel.config import ModelConfig

KEY = "sk-probe-secret-0123456789"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
async def endpoint():
    """A tiny OpenAI-compatible /models: `state` says what it answers."""
    state = {"status": 200, "served": ["m"], "seen_auth": None}

    async def models(request: web.Request) -> web.Response:
        state["seen_auth"] = request.headers.get("Authorization")
        if state["status"] != 200:
            return web.json_response({"error": {"message": f"bad key {KEY}"}}, status=state["status"])
        return web.json_response({"object": "list", "data": [{"id": m} for m in state["served"]]})

    app = web.Application()
    app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # noqa: SLF001 - the port the OS chose
    yield f"http://127.0.0.1:{port}/v1", state
    await runner.cleanup()


async def test_a_refused_connection_names_the_url():
    port = _closed_port()
    line = await probe_model("policy", ModelConfig(base_url=f"http://127.0.0.1:{port}/v1", model="m"))
    assert line == f"model 'policy': connection refused at http://127.0.0.1:{port}/v1"


async def test_a_rejected_key_names_its_variable_and_never_the_key(endpoint, monkeypatch):
    url, state = endpoint
    state["status"] = 401
    monkeypatch.setenv("PROBE_KEY", KEY)
    line = await probe_model("policy", ModelConfig(base_url=url, model="m", api_key_env="PROBE_KEY"))
    assert line == f"model 'policy': 401 from {url} (check the key in $PROBE_KEY)"
    assert state["seen_auth"] == f"Bearer {KEY}" and KEY not in line


async def test_a_model_the_endpoint_does_not_serve_lists_what_it_serves(endpoint):
    url, state = endpoint
    state["served"] = ["Qwen/Qwen3-8B", "other"]
    line = await probe_model("policy", ModelConfig(base_url=url, model="Qwen/Qwen3-4B"))
    assert line == f"model 'policy': 'Qwen/Qwen3-4B' is not served at {url} (served: Qwen/Qwen3-8B, other)"
    state["served"] = ["Qwen/Qwen3-4B"]
    assert await probe_model("policy", ModelConfig(base_url=url, model="Qwen/Qwen3-4B")) is None


async def test_an_endpoint_without_a_models_route_passes(endpoint):
    url, _ = endpoint
    assert await probe_model("policy", ModelConfig(base_url=url.replace("/v1", "/other"), model="m")) is None


async def test_credentials_in_the_url_are_not_shown():
    port = _closed_port()
    line = await probe_model("p", ModelConfig(base_url=f"http://user:{KEY}@127.0.0.1:{port}/v1?key={KEY}",
                                              model="m"))
    assert line is not None and KEY not in line and "connection refused at http://127.0.0.1:" in line


def test_collect_on_a_dead_endpoint_stops_before_anything_starts(tmp_path):
    port = _closed_port()
    config = tmp_path / "gymflow.yaml"
    config.write_text(f"models:\n  policy: {{base_url: 'http://127.0.0.1:{port}/v1', model: m}}\n"
                      "temporal: {address: '127.0.0.1:1'}\n")
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"id": "a", "messages": [{"role": "user", "content": "hi"}]}) + "\n")
    result = CliRunner().invoke(collect, [str(rows), "--env", "one_word", "-c", str(config)])
    assert result.exit_code == 1
    assert f"model 'policy': connection refused at http://127.0.0.1:{port}/v1" in result.output
    assert "nothing was started (--no-probe starts anyway)" in result.output


async def test_a_refused_model_call_is_said_as_refused_with_the_url_not_a_timeout():
    """httpx-aiohttp reports a refused connection as a ConnectTimeout; the failure says what happened."""
    import openai

    from activities.model_client import _classify

    port = _closed_port()
    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1?key={KEY}", api_key="k", max_retries=0,
                                http_client=openai.DefaultAioHttpClient())
    try:
        with pytest.raises(openai.APIConnectionError) as err:
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    finally:
        await client.close()
    failure = _classify(err.value, "policy")
    assert failure.message == f"policy: connection refused at http://127.0.0.1:{port}/v1/"
    assert failure.type == "model_unavailable" and KEY not in failure.message

"""The codec server (`gymflow codec`, gymflow/codec/): the Temporal UI decodes the episode workflow's payloads
through it and reads the messages behind their ids.

Through the real stack: a rollout's history payloads, as the UI sends them (proto3 JSON), come back with the
messages added; CORS answers only the UI's origin; bad input gets a clean 4xx or the payload unchanged; and
`gymflow up` hands the endpoint to the dev server's UI.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import psutil
import pytest
import yaml
from gymflow.workers.local_stack import free_port, wait_for_port

from gymflow.client import GymflowClient
from gymflow.codec.server import CodecServer, Limits, make_server, serve_in_thread
from gymflow.kernel import names
from gymflow.testing.scripted_openai import text, tool_call
from tests.conftest import ROOT
from tests.helpers import weather_task

UI = "http://localhost:8233"
JSON_PLAIN = base64.b64encode(b"json/plain").decode()
BOGUS_ID = 987_654_321_012


def payload(value: Any, encoding: str = JSON_PLAIN) -> dict[str, Any]:
    return {"metadata": {"encoding": encoding}, "data": base64.b64encode(json.dumps(value).encode()).decode()}


def data(p: dict[str, Any]) -> Any:
    return json.loads(base64.b64decode(p["data"]))


@pytest.fixture(scope="module")
def codec(stack) -> Iterator[CodecServer]:
    server = make_server(stack.database_url, 0, origins=(UI,), limits=Limits(max_body_bytes=64_000, max_payloads=50))
    serve_in_thread(server)
    yield server
    server.shutdown()
    server.server_close()


async def post(url: str, body: Any, **headers: str) -> httpx.Response:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with httpx.AsyncClient(timeout=10) as http:
        return await http.post(url, content=raw, headers={"Content-Type": "application/json", **headers})


async def _activity_results(client: GymflowClient, rollout_id: str) -> dict[str, list[dict[str, Any]]]:
    """activity type -> the result payloads of its completions, in history's proto3 JSON (what the UI sends)."""
    history = json.loads((await client.temporal.get_workflow_handle(rollout_id).fetch_history()).to_json())
    scheduled, out = {}, {}
    for event in history["events"]:
        if "activityTaskScheduledEventAttributes" in event:
            scheduled[event["eventId"]] = event["activityTaskScheduledEventAttributes"]["activityType"]["name"]
        done = event.get("activityTaskCompletedEventAttributes")
        if done:
            out.setdefault(scheduled[done["scheduledEventId"]], []).extend(done["result"]["payloads"])
    return out


async def test_decode_adds_the_messages_behind_head_ids(ep, scripted, codec, run_id):
    scripted.script(tool_call("get_weather", {"city": "SF"}), text("cold"))
    inp = ep.make_input(run_id, weather_task(), 0, "pooled")  # generate as activities: payloads with head ids
    assert (await ep.run_rollout(inp)).status == "completed"
    results = await _activity_results(ep, inp.rollout_id)
    generated = results[names.EPISODE_GENERATE]
    began = [payload(int(data(generated[0])["head_id"]) - 1)]  # a bare id, like begin's result
    assert [set(data(p)) >= {"head_id"} for p in generated] == [True, True]
    assert "cold" not in json.dumps([data(p) for p in generated])  # ids only, until decoded

    resp = await post(f"{codec.url}/decode", {"payloads": [*generated, *began]}, **{"X-Namespace": "default"})
    assert resp.status_code == 200, resp.text
    call, answer, begin = resp.json()["payloads"]
    assert call["metadata"] == generated[0]["metadata"]
    call_msg = data(call)["head_message"]
    assert call_msg["role"] == "assistant"
    assert call_msg["tool_calls"] == [{"name": "get_weather", "arguments": json.dumps({"city": "SF"})}]
    assert data(answer)["head_message"] == {"role": "assistant", "content": "cold"}
    assert data(answer)["head_id"] == data(generated[1])["head_id"]  # the original fields stay
    assert begin == began[0]  # a bare id (begin's result) is returned as sent


async def test_preflight_answers_the_ui_origin_only(codec):
    async with httpx.AsyncClient(timeout=10) as http:
        ok = await http.options(f"{codec.url}/default/decode", headers={
            "Origin": UI, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type,x-namespace"})
        other = await http.options(f"{codec.url}/decode", headers={
            "Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
    assert ok.status_code == 204
    assert ok.headers["access-control-allow-origin"] == UI
    assert set(ok.headers["access-control-allow-headers"].split(",")) >= {"content-type", "x-namespace",
                                                                           "authorization"}
    assert set(ok.headers["access-control-allow-methods"].split(",")) >= {"POST", "OPTIONS"}
    assert other.status_code == 403 and "access-control-allow-origin" not in other.headers
    # a page from another origin cannot read decoded data, even without a preflight
    denied = await post(f"{codec.url}/decode", {"payloads": [payload({"head_id": 1})]}, Origin="https://evil.example")
    assert denied.status_code == 403 and "payloads" not in denied.text
    allowed = await post(f"{codec.url}/decode", {"payloads": []}, Origin=UI)
    assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == UI


async def test_bad_input_gets_a_clean_answer(codec):
    plain = [payload({"turn": 3, "nested": {"no_head": True}}), payload(7),
             {"metadata": {"encoding": base64.b64encode(b"binary/null").decode()}},
             {"metadata": {"encoding": JSON_PLAIN}, "data": base64.b64encode(b"{not json").decode()},
             {"metadata": {"encoding": "%%%"}, "data": "!!"}]
    bogus = payload({"head_id": BOGUS_ID, "turn": 1, "head_message": "spoofed"})
    resp = await post(f"{codec.url}/decode", {"payloads": [*plain, bogus]})
    assert resp.status_code == 200, resp.text
    *same, bogus_out = resp.json()["payloads"]
    assert same == plain  # byte-identical: neither re-encoded nor dropped
    assert data(bogus_out) == {"head_id": BOGUS_ID, "head_message": {"error": f"message {BOGUS_ID} not found"},
                               "turn": 1}

    encoded = await post(f"{codec.url}/encode", {"payloads": [bogus]})
    assert encoded.json() == {"payloads": [bogus]}  # gymflow encodes nothing
    for body, status in [(b"{not json", 400), ({"payloads": 3}, 400), ({"payloads": ["x"]}, 400),
                         ({"payloads": [plain[0]] * 51}, 400), (b"[" * 5_000 + b"]" * 5_000, 400),
                         ({"payloads": [payload("x" * 70_000)]}, 413)]:
        resp = await post(f"{codec.url}/decode", body)
        assert resp.status_code == status, (body if isinstance(body, bytes) else str(body))[:80]
        assert set(resp.json()) == {"error"} and "Traceback" not in resp.text
    async with httpx.AsyncClient(timeout=10) as http:
        assert (await http.post(f"{codec.url}/decode", content=b"{}", headers={"Content-Type": "text/plain"})
                ).status_code == 415
        assert (await http.post(f"{codec.url}/nope", json={"payloads": []})).status_code == 404
        assert (await http.get(f"{codec.url}/healthz")).json() == {"status": "ok"}


async def test_a_database_outage_leaves_payloads_readable():
    server = make_server(f"postgresql://gymflow:hunter2@127.0.0.1:{free_port()}/gymflow", 0)
    serve_in_thread(server)
    try:
        sent = payload({"head_id": 5})
        resp = await post(f"{server.url}/decode", {"payloads": [sent, payload(1)]})
    finally:
        server.shutdown()
        server.server_close()
    assert resp.status_code == 200, resp.text
    out = resp.json()["payloads"]
    assert data(out[0]) == {"head_id": 5, "head_message": {"error": "message store unavailable (OperationalError)"}}
    assert out[1] == payload(1) and "hunter2" not in resp.text and "127.0.0.1" not in resp.text


async def test_gymflow_codec_command_serves_the_database(config_file, tmp_path):
    port = free_port()
    log = tmp_path / "codec.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "gymflow.cli.main", "codec", "--port", str(port),
                                 "--config", str(config_file)], cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT)
    try:
        await asyncio.to_thread(wait_for_port, "127.0.0.1", port, 30, proc)
        resp = await post(f"http://127.0.0.1:{port}/decode", {"payloads": [payload({"head_id": BOGUS_ID})]})
        # "not found" (not "unavailable"): it reached the test database named by --config
        assert data(resp.json()["payloads"][0])["head_message"] == {"error": f"message {BOGUS_ID} not found"}
    finally:
        proc.terminate()
        proc.wait(timeout=15)
    assert proc.returncode == 0, log.read_text()
    assert f"codec server: http://127.0.0.1:{port}" in log.read_text()


async def test_up_gives_the_dev_server_ui_its_codec_endpoint(stack, tmp_path):
    """`gymflow up` (no pools, Postgres configured): the dev server runs with --ui-codec-endpoint, its UI
    reports that endpoint to browsers, and the endpoint decodes against the stack's database."""
    os.chmod(tmp_path, 0o755)
    ui_port, codec_port = free_port(), free_port()
    config = tmp_path / "gymflow.yaml"
    config.write_text(yaml.safe_dump({"state_dir": str(tmp_path / "state"), "database": {"url": stack.database_url},
                                      "temporal": {"port": free_port(), "ui_port": ui_port}}))
    env = {k: v for k, v in os.environ.items() if k not in ("TEMPORAL_ADDRESS", "DATABASE_URL")}
    log = tmp_path / "up.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "gymflow.cli.main", "up", "--pools", "", "--codec-port",
                                 str(codec_port), "--config", str(config)], cwd=ROOT, env=env, stdout=sink,
                                stderr=subprocess.STDOUT)
    endpoint = f"http://127.0.0.1:{codec_port}"
    try:
        deadline = time.monotonic() + 60
        while f"Codec server: {endpoint}" not in log.read_text(errors="replace"):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")
            await asyncio.sleep(0.2)
        (server,) = [c for c in psutil.Process(proc.pid).children(recursive=True) if "start-dev" in c.cmdline()]
        args = server.cmdline()
        assert args[args.index("--ui-codec-endpoint") + 1] == endpoint
        await asyncio.to_thread(wait_for_port, "127.0.0.1", ui_port, 30)
        async with httpx.AsyncClient(timeout=10) as http:
            ui = (await http.get(f"http://127.0.0.1:{ui_port}/api/v1/settings")).json()
        assert ui["Codec"]["Endpoint"] == endpoint
        resp = await post(f"{endpoint}/decode", {"payloads": [payload({"head_id": BOGUS_ID})]},
                          Origin=f"http://localhost:{ui_port}")
        assert resp.headers["access-control-allow-origin"] == f"http://localhost:{ui_port}"
        assert data(resp.json()["payloads"][0])["head_message"] == {"error": f"message {BOGUS_ID} not found"}
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    assert proc.returncode == 0, log.read_text(errors="replace")

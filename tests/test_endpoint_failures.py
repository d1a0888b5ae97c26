"""A model endpoint's failure is said as what it is (refused, DNS, TLS, timeout) with its URL, by the start-up
probe and by the model client; the worker's warning for it comes once per model and cause a minute, counted."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import struct
import threading
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from aiohttp import web
from click.testing import CliRunner
from gymflow.activities import model_client
from gymflow.activities.model_client import ModelClients, RepeatedModelFailures, quiet_repeated_failures
from temporalio.exceptions import ApplicationError

from gymflow.cli.collect_cmd import collect
from gymflow.cli.probe import judge_models, pool_models, probe_model
from gymflow.cli.stack_cmd import warn_about_endpoints
from gymflow.kernel.config import ModelConfig, Settings
from gymflow.kernel.logfilter import ACTIVITY_LOGGER, ExpectedFailureFilter
from gymflow.testing.scripted_openai import http_error
from tests.helpers import user_task


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def silent() -> Iterator[str]:
    """A port that accepts connections (the kernel's backlog) and never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield f"http://127.0.0.1:{s.getsockname()[1]}/v1"


@pytest.fixture
async def plain() -> AsyncIterator[tuple[int, dict]]:
    """A plain-HTTP /v1/models (so https:// to it fails the TLS handshake); `state["status"]` is its answer."""
    state = {"status": 200}

    async def models(request: web.Request) -> web.Response:
        if state["status"] != 200:
            return web.json_response({"error": {"message": "no"}}, status=state["status"])
        return web.json_response({"object": "list", "data": []})

    app = web.Application()
    app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield site._server.sockets[0].getsockname()[1], state  # noqa: SLF001 - the port the OS chose
    await runner.cleanup()


# -- the probe ------------------------------------------------------------------------------------------------------

async def test_the_probe_names_a_dns_failure_by_host():
    line = await probe_model("policy", ModelConfig(base_url="http://no-such-host.invalid/v1", model="m"))
    assert line == "model 'policy': DNS lookup failed for no-such-host.invalid"


async def test_the_probe_names_a_tls_failure_with_the_url(plain):
    port, _ = plain
    line = await probe_model("policy", ModelConfig(base_url=f"https://127.0.0.1:{port}/v1", model="m"))
    assert line is not None and line.startswith(f"model 'policy': TLS error at https://127.0.0.1:{port}/v1: ")


async def test_the_probe_names_a_timeout_with_its_limit(silent):
    line = await probe_model("policy", ModelConfig(base_url=silent, model="m"), timeout_s=0.3)
    assert line == f"model 'policy': timed out after 0.3 s at {silent}"


async def test_a_rejected_request_without_a_key_names_the_unset_variable(plain, monkeypatch):
    port, state = plain
    state["status"] = 401
    monkeypatch.delenv("PROBE_KEY", raising=False)
    url = f"http://127.0.0.1:{port}/v1"
    cfg = ModelConfig(base_url=url, model="m", api_key_env="PROBE_KEY")
    assert await probe_model("policy", cfg) == f"model 'policy': 401 from {url} ($PROBE_KEY is not set)"
    # collect: only the workers read the key, so its absence here proves nothing about theirs
    assert await probe_model("policy", cfg, keys_elsewhere=True) is None


async def test_recorded_and_non_http_models_are_not_probed():
    assert await probe_model("r", ModelConfig(recorded="rollouts.jsonl")) is None
    assert await probe_model("u", ModelConfig(base_url="unix:///run/vllm.sock", model="m")) is None


def test_each_pool_probes_the_models_it_calls():
    settings = Settings.model_validate({
        "models": {"local": {"base_url": "http://a/v1"}, "pooled": {"base_url": "http://b/v1", "placement": "pool"},
                   "judge": {"base_url": "http://c/v1"}, "near_judge": {"base_url": "http://d/v1"}},
        "environments": {"math_with_judge": {"judge_model": "judge"},
                         "equivalence_llm_judge": {"judge_model": "near_judge", "placement": "local"}}})
    assert pool_models(settings, "workflows") == ["local", "near_judge"]  # the env pool reports `judge`
    assert pool_models(settings, "env") == ["judge"]
    assert pool_models(settings, "generate") == ["pooled"]
    assert pool_models(settings, "generate", ["local"]) == []  # a local model's queue gets no work
    assert set(pool_models(settings, "all")) == {"local", "pooled", "judge", "near_judge"}
    assert judge_models(settings, {"math_with_judge", "single_tool"}) == ["judge"]


def test_a_worker_warns_about_a_dead_endpoint_and_goes_on(capsys):
    port = _closed_port()
    settings = Settings.model_validate({"models": {"policy": {"base_url": f"http://127.0.0.1:{port}/v1"}}})
    warn_about_endpoints(settings, ["policy"])  # returns: the endpoint may come up later
    assert capsys.readouterr().err == (f"warning: model 'policy': connection refused at http://127.0.0.1:{port}/v1 "
                                       "(rollouts of it fail until it answers)\n")


# -- the model client -----------------------------------------------------------------------------------------------

async def _failure(base_url: str, timeout_s: float = 20) -> ApplicationError:
    models = ModelClients({"policy": ModelConfig(base_url=base_url, model="m", request_timeout_s=timeout_s)})
    try:
        with pytest.raises(ApplicationError) as err:
            await models.create("policy", {"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    finally:
        await models.close()
    assert err.value.type == "model_unavailable" and not err.value.non_retryable
    return err.value


async def test_a_model_call_that_times_out_says_so_with_its_limit(silent):
    failure = await _failure(silent, timeout_s=0.3)
    assert failure.message == f"policy: timed out after 0.3 s at {silent}/chat/completions"


async def test_a_model_call_to_an_unknown_host_says_dns():
    failure = await _failure("http://no-such-host.invalid/v1")
    assert failure.message == "policy: DNS lookup failed for no-such-host.invalid"


async def test_a_model_call_over_tls_to_a_plain_server_says_tls(plain):
    port, _ = plain
    failure = await _failure(f"https://127.0.0.1:{port}/v1")
    assert failure.message.startswith(f"policy: TLS error at https://127.0.0.1:{port}/v1/chat/completions: ")


async def test_a_connection_reset_is_not_called_a_timeout():
    """httpx-aiohttp maps every aiohttp connection error to a ConnectTimeout; a reset is not one."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]

        def reset_one() -> None:
            conn, _ = s.accept()
            conn.recv(1)  # the request is on its way: connected (a reset before that reads as a refusal)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()  # linger 0: an RST, not a FIN

        task = asyncio.create_task(asyncio.to_thread(reset_one))
        failure = await _failure(f"http://127.0.0.1:{port}/v1")
        await task
    assert "timed out" not in failure.message
    assert failure.message.startswith(f"policy: cannot connect to http://127.0.0.1:{port}/v1/chat/completions: ")


# -- the worker's warning, rate-limited -----------------------------------------------------------------------------

class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _attempt(message: str, kind: str = "model_unavailable", attempt: int = 1) -> logging.LogRecord:
    """The SDK's record of one failed activity attempt."""
    err = ApplicationError(message, type=kind)
    return logging.makeLogRecord({
        "name": ACTIVITY_LOGGER, "levelno": logging.WARNING, "levelname": "WARNING",
        "msg": "Completing activity as failed", "exc_info": (ApplicationError, err, None),
        "__temporal_error_identifier": "ActivityFailure",
        "temporal_activity": {"activity_type": "generate", "workflow_id": f"r/t{attempt}", "attempt": attempt}})


def test_sixty_failed_attempts_make_one_warning_then_a_count():
    clock = _Clock()
    quiet = RepeatedModelFailures(every_s=60, clock=clock)
    refused = "policy: connection refused at http://127.0.0.1:9/v1/chat/completions"
    shown = [r for r in (_attempt(refused, attempt=i) for i in range(60)) if quiet.filter(r)]
    assert len(shown) == 1
    assert shown[0].getMessage() == (f"activity generate failed (workflow r/t0, attempt 0): model_unavailable: "
                                     f"{refused}")
    assert shown[0].exc_info is None  # the one-line form of ExpectedFailureFilter
    clock.now += 61
    later = _attempt(refused, attempt=61)
    assert quiet.filter(later)
    assert later.getMessage().endswith(f"{refused} (59 more like it since the last one shown, at most one per 60 s)")
    assert not quiet.filter(_attempt(refused))  # the next interval has begun


def test_each_model_and_cause_gets_its_own_warning_and_other_failures_are_not_held():
    quiet = RepeatedModelFailures(every_s=60, clock=_Clock())
    lines = ["policy: connection refused at http://a/v1/chat/completions", "judge: connection refused at http://b/v1/",
             "policy: rate limited (429)"]
    assert all(quiet.filter(_attempt(m)) for m in lines)
    assert not any(quiet.filter(_attempt(m)) for m in lines)
    # one rollout's own failure (a prompt too long) is news every time
    assert all(quiet.filter(_attempt("policy: too long", kind="context_length_exceeded")) for _ in range(3))


def test_the_worker_installs_it_in_place_of_the_one_line_filter():
    logger = logging.getLogger(ACTIVITY_LOGGER)
    before = list(logger.filters)
    try:
        logger.addFilter(ExpectedFailureFilter())
        quiet_repeated_failures()
        quiet_repeated_failures()
        installed = [f for f in logger.filters if isinstance(f, ExpectedFailureFilter)]
        assert len(installed) == 1 and isinstance(installed[0], RepeatedModelFailures)
        assert installed[0].every_s == model_client.WARN_EVERY_S
    finally:
        logger.filters[:] = before


async def test_a_failing_endpoint_is_one_warning_in_the_worker_not_one_per_attempt(gf, generate_pool, scripted,
                                                                                     run_id):
    """The generate pool is a real `gymflow worker`: 2 rollouts x 4 attempts of an endpoint that answers 507 were
    8 identical warnings; now one (the next, a minute on, would carry the count)."""
    before = len(generate_pool.logs())
    scripted.script(*[http_error(507, "insufficient storage") for _ in range(8)])
    inputs = [gf.make_input(run_id, user_task("hi", f"u{i}"), 0, "pooled") for i in range(2)]
    summaries = await asyncio.gather(*(gf.run_rollout(i) for i in inputs))
    assert [s.failure_type for s in summaries] == ["model_unavailable"] * 2
    assert len(scripted.requests) == 8  # every attempt did fail
    await asyncio.sleep(0.5)  # the worker's log line may land a moment after the workflow ends
    new = generate_pool.logs()[before:]
    assert len([ln for ln in new.splitlines() if "model_unavailable: pooled: HTTP 507" in ln]) == 1, new


@pytest.fixture
def refusing_key() -> Iterator[int]:
    """A /v1/models that answers 401, in a thread (collect runs its own event loop, blocking the test's)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            self.send_response(401)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_collect_stops_on_a_dead_judge_too(tmp_path, refusing_key):
    """The judge of the run's environment is probed beside the policy; a 401 for a key that only the workers
    hold (unset here) is no reason to stop."""
    port = refusing_key
    dead = _closed_port()
    config = tmp_path / "gymflow.yaml"
    config.write_text(
        f"models:\n  policy: {{base_url: 'http://127.0.0.1:{port}/v1', model: m, api_key_env: UNSET_PROBE_KEY}}\n"
        f"  judge: {{base_url: 'http://127.0.0.1:{dead}/v1', model: j}}\n"
        "environments:\n  math_with_judge: {judge_model: judge}\n")
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"id": "a", "messages": [{"role": "user", "content": "1+1?"}], "question": "1+1?",
                                "expected_answer": "2"}) + "\n")
    result = CliRunner(env={"UNSET_PROBE_KEY": None}).invoke(
        collect, [str(rows), "--env", "math_with_judge", "-c", str(config)])
    assert result.exit_code == 1
    assert result.output == (f"Error: model 'judge': connection refused at http://127.0.0.1:{dead}/v1\n"
                             "nothing was started (--no-probe starts anyway)\n")

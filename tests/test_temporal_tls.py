"""Temporal anywhere: TLS (server CA, mTLS client cert, server name) and an API key from the environment, all
through one connect function. The dev server has no TLS flags, so mTLS is tested through a TLS-terminating
proxy in front of it (tests/tls_support.py) with certificates made by the `openssl` CLI."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from gymflow.workers.local_stack import free_port
from temporalio.service import TLSConfig

from gymflow.client import GymflowClient
from gymflow.kernel import connect
from gymflow.kernel.config import load_settings, settings_from_mapping
from gymflow.kernel.connect import TemporalUnreachable, connect_configured, temporal_options
from gymflow.kernel.errors import ConfigError
from tests.conftest import ROOT
from tests.helpers import user_task
from tests.tls_support import Certs, TLSProxy, make_certs, openssl

TEMPORAL_KEY = "tmprl-test-" + uuid.uuid4().hex  # must never show up in logs, messages or reprs
NO_SDK_ENV = {"TEMPORAL_CONFIG_FILE": "/nonexistent/temporal.toml"}  # keep a developer's profile out of it


def _settings(temporal: dict[str, Any]) -> Any:
    return settings_from_mapping({"temporal": {"address": "127.0.0.1:1", **temporal},
                                  "database": {"url": "postgresql://x@127.0.0.1:1/x"}}, env=NO_SDK_ENV)


# -- how the connect arguments are built --------------------------------------------------------------------

def test_api_key_comes_from_the_named_variable_implies_tls_and_is_never_shown():
    env = {**NO_SDK_ENV, "MY_TEMPORAL_KEY": TEMPORAL_KEY}
    opts = temporal_options(_settings({"api_key_env": "MY_TEMPORAL_KEY", "namespace": "ns.acct"}), env)
    kwargs = opts.connect_kwargs()
    assert kwargs["api_key"] == TEMPORAL_KEY and kwargs["tls"] is True and kwargs["namespace"] == "ns.acct"
    for text in (repr(opts), str(opts), opts.describe()):
        assert TEMPORAL_KEY not in text and "$MY_TEMPORAL_KEY" in text


def test_api_key_config_errors_name_the_variable_not_a_value():
    with pytest.raises(ConfigError, match=r"\$MISSING_KEY is not set"):
        temporal_options(_settings({"api_key_env": "MISSING_KEY"}), dict(NO_SDK_ENV))
    with pytest.raises(ConfigError, match="NAME of an environment variable"):
        _settings({"api_key_env": "tmprl-abc.def"})


def test_tls_files_are_read_and_validated(tmp_path: Path):
    (tmp_path / "ca.pem").write_bytes(b"CA")
    (tmp_path / "c.pem").write_bytes(b"CERT")
    (tmp_path / "c.key").write_bytes(b"KEY")
    opts = temporal_options(_settings({"tls": {"ca_cert": str(tmp_path / "ca.pem"), "client_cert": str(
        tmp_path / "c.pem"), "client_key": str(tmp_path / "c.key"), "server_name": "temporal.internal"}}),
        dict(NO_SDK_ENV))
    assert opts.tls == TLSConfig(server_root_ca_cert=b"CA", domain="temporal.internal", client_cert=b"CERT",
                                 client_private_key=b"KEY")
    assert "KEY" not in repr(opts) and "mTLS" in repr(opts)
    with pytest.raises(ConfigError, match="temporal.tls.ca_cert: cannot read"):
        temporal_options(_settings({"tls": {"ca_cert": str(tmp_path / "nope.pem")}}), dict(NO_SDK_ENV))
    with pytest.raises(ConfigError, match="client_cert and client_key"):
        _settings({"tls": {"client_cert": str(tmp_path / "c.pem")}})
    # An API key with TLS explicitly off (a proxy in front terminates TLS): plaintext, key still sent.
    off = temporal_options(_settings({"tls": {"enabled": False}, "api_key_env": "K"}), {**NO_SDK_ENV, "K": "k"})
    assert off.tls is False and off.api_key == "k"
    assert temporal_options(_settings({}), dict(NO_SDK_ENV)).connect_kwargs() == {
        "namespace": "default", "tls": False, "api_key": None, "rpc_metadata": {}}


def test_the_sdk_environment_configuration_fills_what_the_config_leaves_unset(tmp_path: Path):
    ca = tmp_path / "ca.pem"
    ca.write_bytes(b"CA")
    env = {**NO_SDK_ENV, "TEMPORAL_NAMESPACE": "from-env", "TEMPORAL_API_KEY": TEMPORAL_KEY,
           "TEMPORAL_TLS_SERVER_CA_CERT_PATH": str(ca), "TEMPORAL_TLS_SERVER_NAME": "srv"}
    opts = temporal_options(_settings({}), env)
    assert (opts.namespace, opts.api_key) == ("from-env", TEMPORAL_KEY)
    assert isinstance(opts.tls, TLSConfig) and (opts.tls.server_root_ca_cert, opts.tls.domain) == (b"CA", "srv")
    assert TEMPORAL_KEY not in repr(opts)
    # Keys the config sets win; env_config: false ignores Temporal's variables altogether.
    assert temporal_options(_settings({"namespace": "mine"}), env).namespace == "mine"
    off = temporal_options(_settings({"env_config": False}), env)
    assert (off.namespace, off.api_key, off.tls) == ("default", None, False)
    # A TOML profile, as the `temporal` CLI writes it.
    toml = tmp_path / "temporal.toml"
    toml.write_text('[profile.default]\nnamespace = "from-toml"\napi_key = "k2"\n')
    prof = temporal_options(_settings({}), {"TEMPORAL_CONFIG_FILE": str(toml)})
    assert (prof.namespace, prof.api_key, prof.tls) == ("from-toml", "k2", True)


async def test_every_connect_passes_the_options_to_the_sdk(monkeypatch: pytest.MonkeyPatch):
    seen: dict[str, Any] = {}

    async def fake_connect(address: str, **kwargs: Any) -> str:
        seen.update(kwargs, address=address)
        return "client"

    monkeypatch.setattr(connect.Client, "connect", fake_connect)
    monkeypatch.setenv("MY_TEMPORAL_KEY", TEMPORAL_KEY)
    monkeypatch.setenv("TEMPORAL_CONFIG_FILE", "/nonexistent/temporal.toml")
    settings = _settings({"api_key_env": "MY_TEMPORAL_KEY", "namespace": "acct.ns"})
    assert await connect_configured(settings) == "client"
    # The SDK sends api_key as the `authorization: Bearer <key>` gRPC header.
    assert (seen["address"], seen["api_key"], seen["tls"], seen["namespace"]) == (
        "127.0.0.1:1", TEMPORAL_KEY, True, "acct.ns")


# -- against the dev server, through an mTLS proxy ----------------------------------------------------------

@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    if openssl() is None:
        pytest.skip("needs the openssl CLI to make test certificates")
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture
def proxy(certs: Certs, stack: Any) -> Any:
    with TLSProxy(certs, stack.temporal_address) as p:
        yield p


def _tls_config(path: Path, base: Path, proxy: TLSProxy, tls: dict[str, Any], **extra: Any) -> Path:
    raw = yaml.safe_load(base.read_text())
    raw["temporal"] = {"address": proxy.address, "tls": tls, "env_config": False, **extra}
    # On the generate pool: only the worker under test polls tls-policy's queue (a local model would be called by
    # whichever workflow worker runs the episode).
    raw["models"]["tls-policy"] = {**raw["models"]["policy"], "model": "scripted-tls", "placement": "pool"}
    path.write_text(yaml.safe_dump(raw))
    return path


async def test_mtls_worker_and_client_run_a_rollout(proxy, certs, config_file, scripted, run_id, tmp_path):
    tls = {"ca_cert": str(certs.ca), "client_cert": str(certs.client_cert), "client_key": str(certs.client_key),
           "server_name": "localhost"}
    config = _tls_config(tmp_path / "gymflow.yaml", config_file, proxy, tls, api_key_env="MY_TEMPORAL_KEY")
    env = {**os.environ, "MY_TEMPORAL_KEY": TEMPORAL_KEY, "GYMFLOW_STARTUP_WAIT_S": "30"}
    log = tmp_path / "worker.log"
    # Every pool in one process, over mTLS. Only it polls tls-policy's generate queue, so the rollout below
    # completes only if this worker connected through the proxy.
    with log.open("wb") as out:
        worker = subprocess.Popen([sys.executable, "-m", "gymflow.cli.main", "worker", "--pool", "all", "-v",
                                   "--models", "tls-policy", "--config", str(config)],
                                  stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    os.environ["MY_TEMPORAL_KEY"] = TEMPORAL_KEY
    try:
        settings = load_settings(config, env=dict(os.environ))
        gf = await GymflowClient.connect(settings, wait_s=30)
        try:
            inp = gf.make_input(run_id, user_task("hi", task_id="tls0"), 0, "tls-policy")
            summary = await asyncio.wait_for(gf.run_rollout(inp), 60)
        finally:
            await gf.close()
        assert summary.status == "completed", (summary, log.read_text())
        assert any(r.body["model"] == "scripted-tls" for r in scripted.requests)
        assert proxy.accepted >= 2 and not proxy.refused  # the client and the worker, both over mTLS
    finally:
        os.environ.pop("MY_TEMPORAL_KEY", None)
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
    text = log.read_text()
    assert "mTLS (client certificate), private CA, API key from $MY_TEMPORAL_KEY" in text, text
    assert TEMPORAL_KEY not in text


@pytest.mark.parametrize("case", ["no client cert", "wrong CA"])
async def test_a_refused_tls_connect_fails_at_once_with_a_clear_error(proxy, certs, case):
    tls = TLSConfig(server_root_ca_cert=(certs.other_ca if case == "wrong CA" else certs.ca).read_bytes(),
                    domain="localhost")
    if case == "wrong CA":
        tls.client_cert, tls.client_private_key = certs.client_cert.read_bytes(), certs.client_key.read_bytes()
    started = time.monotonic()
    with pytest.raises(TemporalUnreachable) as info:
        await connect.connect_temporal(proxy.address, wait_s=60,
                                       options=connect.TemporalOptions(tls=tls, api_key=TEMPORAL_KEY))
    assert time.monotonic() - started < 15, "a TLS refusal is not waited out"
    message = str(info.value)
    assert "refused the connection" in message and "temporal.tls" in message
    assert ("CertificateRequired" if case == "no client cert" else "UnknownIssuer") in message
    assert TEMPORAL_KEY not in message


async def test_a_worker_with_a_wrong_ca_exits_with_the_reason(proxy, certs, config_file, tmp_path):
    config = _tls_config(tmp_path / "gymflow.yaml", config_file, proxy,
                         {"ca_cert": str(certs.other_ca), "client_cert": str(certs.client_cert),
                          "client_key": str(certs.client_key), "server_name": "localhost"})
    proc = subprocess.run([sys.executable, "-m", "gymflow.cli.main", "worker", "--pool", "workflows",
                           "--config", str(config)], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "GYMFLOW_STARTUP_WAIT_S": "300"})
    assert proc.returncode != 0
    assert "refused the connection" in proc.stderr and "UnknownIssuer" in proc.stderr, proc.stderr


def test_the_tls_probe_names_a_refusal_and_waits_for_a_server_not_up(proxy, certs):
    # What connect_temporal asks when the SDK reports only a closed transport (a TLS 1.3 refusal of a missing client
    # certificate, under load): a refusal is named at once, never waited out; an accepted config is no refusal.
    ca = certs.ca.read_bytes()
    refused = connect.tls_refusal(proxy.address, TLSConfig(server_root_ca_cert=ca, domain="localhost"))
    assert refused == "received fatal alert: CertificateRequired"
    wrong_ca = connect.tls_refusal(proxy.address, TLSConfig(
        server_root_ca_cert=certs.other_ca.read_bytes(), domain="localhost",
        client_cert=certs.client_cert.read_bytes(), client_private_key=certs.client_key.read_bytes()))
    assert wrong_ca is not None and "UnknownIssuer" in wrong_ca
    # A server that is not up is waited for, not refused.
    closed = f"127.0.0.1:{free_port()}"
    assert connect.tls_refusal(closed, TLSConfig(server_root_ca_cert=ca, domain="localhost")) is None

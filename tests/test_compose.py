"""The production compose stack, checked structurally (no Docker engine runs on the dev machines).

Each test reads docker-compose.yml with PyYAML and compares it with the real code it must agree with:
the CLI's pool choices, the search attributes in gymflow.kernel.names, the config loader, the
workers' shutdown grace. No network, no containers.
"""

from __future__ import annotations

import inspect
import re
import shlex
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from gymflow.workers.pools import build_pool

from gymflow.cli.stack_cmd import worker as worker_command
from gymflow.kernel.config import load_settings
from gymflow.kernel.names import SEARCH_ATTRIBUTES

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yml"
CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}
SECRET_KEY = re.compile(r"PASSWORD|PASSWD|PWD|SECRET|TOKEN|API_?KEY", re.IGNORECASE)
# A value that only names a variable: ${X}, ${X:?msg}, ${X?msg}, or ${X:-} (empty default).
PURE_REFERENCE = re.compile(r"\$\{[A-Za-z_][A-Za-z0-9_]*(?::?\?[^}]*|:?-)?\}")
URL_PASSWORD = re.compile(r"://[^/\s:@]+:([^@\s]+)@")
SECRET_FLAG = re.compile(r"--(?:api-key|password|token)[= ](\S+)", re.IGNORECASE)


# ---- helpers: a small model of compose's own rules ---------------------------------------------

def compose_interpolate(text: str, env: dict[str, str]) -> str:
    """Resolve `${...}` the way compose does (`$$` is a literal `$`); raise ValueError if malformed."""
    out, i = [], 0
    while i < len(text):
        if text.startswith("$$", i):
            out.append("$")
            i += 2
        elif text.startswith("${", i):
            end = text.find("}", i)
            if end < 0:
                raise ValueError(f"unclosed ${{ in {text!r}")
            body = text[i + 2:end]
            m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)(?:(:-|-|:\?|\?|:\+|\+)(.*))?", body, re.DOTALL)
            if m is None:
                raise ValueError(f"malformed interpolation ${{{body}}} in {text!r}")
            name, op, arg = m.group(1), m.group(2), m.group(3) or ""
            if "${" in arg or "$" in arg.replace("$$", ""):
                raise ValueError(f"nested interpolation in ${{{body}}}")
            if op in (":?", "?") and not arg.strip():
                raise ValueError(f"${{{name}{op}}} needs a message saying what to set")
            value = env.get(name)
            unset = value is None or (value == "" and op is not None and op.startswith(":"))
            if op in (":?", "?") and unset:
                raise ValueError(f"required variable {name} is not set: {arg}")
            if op in (":-", "-"):
                out.append(arg if unset else value)
            elif op in (":+", "+"):
                out.append("" if unset else arg)
            else:
                out.append(value or "")
            i = end + 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def strings(node: Any) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [s for v in node.values() for s in strings(v)]
    if isinstance(node, list):
        return [s for v in node for s in strings(v)]
    return []


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {str(k): "" if v is None else str(v) for k, v in env.items()}


def argv(service: dict[str, Any], key: str = "command") -> list[str]:
    value = service.get(key) or []
    return shlex.split(value) if isinstance(value, str) else [str(v) for v in value]


def option(args: list[str], name: str) -> str | None:
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def bind_mounts(service: dict[str, Any]) -> dict[str, str]:
    """container path -> host path (relative paths only; named volumes are skipped)."""
    out = {}
    for v in service.get("volumes") or []:
        if isinstance(v, str):
            parts = v.split(":")
            src, dst = parts[0], parts[1] if len(parts) > 1 else parts[0]
        else:
            src, dst = v.get("source", ""), v.get("target", "")
        if src.startswith((".", "/")):
            out[dst] = src
    return out


def depends_on(service: dict[str, Any]) -> dict[str, Any]:
    deps = service.get("depends_on") or {}
    return {d: None for d in deps} if isinstance(deps, list) else deps


def literal_secrets(services: dict[str, Any]) -> list[str]:
    found = []
    for name, svc in services.items():
        for key, value in environment(svc).items():
            if SECRET_KEY.search(key) and not PURE_REFERENCE.fullmatch(value):
                found.append(f"{name}: {key}={value!r}")
        for s in [*strings(svc), *(" ".join(argv(svc, k)) for k in ("command", "entrypoint"))]:
            for pattern in (URL_PASSWORD, SECRET_FLAG):
                for m in pattern.finditer(s):
                    if not PURE_REFERENCE.fullmatch(m.group(1)):
                        found.append(f"{name}: {m.group(0)!r}")
    return found


CLI_POOLS = next(p for p in worker_command.params if p.name == "pool").type.choices
DEPLOYED_POOLS = sorted(set(CLI_POOLS) - {"all"})  # `all` = every pool in one process, for `gymflow up`
FAKE_ENV = {"POSTGRES_PASSWORD": "pw-from-env"}


@pytest.fixture(scope="module")
def services() -> dict[str, Any]:
    doc = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(doc, dict) and isinstance(doc.get("services"), dict), "no services in docker-compose.yml"
    return doc["services"]


@pytest.fixture(scope="module")
def workers(services: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """pool -> its service, found by the command it runs."""
    out = {}
    for svc in services.values():
        args = argv(svc)
        if args[:2] == ["gymflow", "worker"]:
            out[option(args, "--pool")] = svc
    return out


def worker_env(svc: dict[str, Any]) -> dict[str, str]:
    return {k: compose_interpolate(v, FAKE_ENV) for k, v in environment(svc).items()}


# ---- structure ----------------------------------------------------------------------------------

def test_every_service_has_image_or_build(services):
    missing = [n for n, s in services.items() if not (s.get("image") or s.get("build"))]
    assert not missing, f"services without image or build: {missing}"


def test_depends_on_targets_exist_and_use_conditions(services):
    for name, svc in services.items():
        for target, spec in depends_on(svc).items():
            assert target in services, f"{name} depends on unknown service {target}"
            assert isinstance(spec, dict) and spec.get("condition") in CONDITIONS, \
                f"{name} -> {target}: depends_on needs a condition ({sorted(CONDITIONS)})"


def test_services_waited_on_as_healthy_have_healthchecks(services):
    waited = {t for s in services.values() for t, spec in depends_on(s).items()
              if isinstance(spec, dict) and spec.get("condition") == "service_healthy"}
    assert waited, "nothing waits for a healthy service"
    for target in waited:
        hc = services[target].get("healthcheck") or {}
        assert hc.get("test") and not hc.get("disable"), f"{target} is waited on as healthy but has no healthcheck"
        assert hc["test"] not in (["NONE"], "NONE")


def test_build_uses_the_repo_dockerfile(services):
    builds = [s["build"] for s in services.values() if s.get("build")]
    assert builds, "no service builds the gymflow image"
    for b in builds:
        spec = {"context": b} if isinstance(b, str) else b
        dockerfile = ROOT / spec.get("context", ".") / spec.get("dockerfile", "Dockerfile")
        text = dockerfile.read_text()
        assert re.search(r"^FROM python:3\.11-slim", text, re.MULTILINE)
        assert "bubblewrap" in text, "the env pool's sandbox needs bubblewrap in the image"
        assert re.search(r"pip install[^\n]* \.(\s|$)", text), "the image must install the project (pip install .)"
    ignored = (ROOT / ".dockerignore").read_text().split()
    for path in (".git", ".venv", ".env"):
        assert path in ignored, f".dockerignore must exclude {path}"


# ---- worker pools -------------------------------------------------------------------------------

def test_one_worker_service_per_cli_pool(services, workers):
    assert sorted(p for p in workers if p) == DEPLOYED_POOLS
    for pool in DEPLOYED_POOLS:
        assert services.get(f"worker-{pool}") is workers[pool], f"worker-{pool} must run --pool {pool}"


@pytest.mark.parametrize("pool", DEPLOYED_POOLS)
def test_worker_stops_gracefully_and_scales(pool, services):
    svc = services[f"worker-{pool}"]
    assert svc.get("stop_signal") == "SIGTERM"
    grace = svc.get("stop_grace_period", "10s")
    m = re.fullmatch(r"(?:(\d+)m)?(?:(\d+)s)?", str(grace))
    assert m and m.group(0), f"unreadable stop_grace_period {grace!r}"
    seconds = int(m.group(1) or 0) * 60 + int(m.group(2) or 0)
    worker_grace = inspect.signature(build_pool).parameters["shutdown_grace"].default.total_seconds()
    assert seconds > worker_grace, f"{pool}: Docker would SIGKILL before the worker's {worker_grace:.0f}s grace ends"
    assert svc.get("restart") in ("always", "unless-stopped", "on-failure")
    replicas = (svc.get("deploy") or {}).get("replicas")
    assert isinstance(replicas, int) and replicas >= 1
    assert "container_name" not in svc, "a fixed container_name prevents --scale"
    assert not svc.get("ports"), "published ports prevent --scale"


@pytest.mark.parametrize("pool", DEPLOYED_POOLS)
def test_worker_reaches_temporal_and_postgres_services(pool, services):
    svc = services[f"worker-{pool}"]
    raw = environment(svc)
    env = worker_env(svc)
    host, _, port = env["TEMPORAL_ADDRESS"].partition(":")
    assert host in services and port == "7233"
    url = urlsplit(env["DATABASE_URL"])
    assert url.scheme == "postgresql" and url.hostname in services and url.path == "/gymflow"
    assert url.username == "gymflow" and url.password == FAKE_ENV["POSTGRES_PASSWORD"]
    assert "${POSTGRES_PASSWORD:?" in raw["DATABASE_URL"], "the DB password must be required, not defaulted"
    deps = depends_on(svc)
    for backend in (url.hostname, host):
        assert deps.get(backend, {}).get("condition") == "service_healthy", f"{pool} must wait for {backend}"


@pytest.mark.parametrize("pool", DEPLOYED_POOLS)
def test_worker_config_is_mounted_and_loads(pool, services):
    svc = services[f"worker-{pool}"]
    args = argv(svc)
    config_in_container = option(args, "--config")
    assert config_in_container, f"worker-{pool} must pass --config"
    mounts = bind_mounts(svc)
    assert config_in_container in mounts, f"{config_in_container} is not mounted into worker-{pool}"
    source = (ROOT / mounts[config_in_container]).resolve()
    assert source.is_file() and source.is_relative_to(ROOT), f"{source} must be a file in the repo"

    settings = load_settings(source, env=worker_env(svc))
    policy = settings.models.get("policy")
    assert policy is not None, "config has no `policy` model"
    assert settings.temporal.address == worker_env(svc)["TEMPORAL_ADDRESS"]
    assert settings.database.url == worker_env(svc)["DATABASE_URL"]
    for model in settings.models.values():
        assert model.api_key_env is None or model.api_key_env in environment(svc), \
            f"worker-{pool} does not pass {model.api_key_env} to the container"


def test_policy_is_the_vllm_service_with_token_ids(services, workers):
    svc = workers["generate"]
    settings = load_settings(ROOT / bind_mounts(svc)[option(argv(svc), "--config")], env=worker_env(svc))
    policy = settings.models["policy"]
    assert policy.return_token_ids and policy.logprobs
    url = urlsplit(policy.base_url)
    assert url.hostname in services and url.path.rstrip("/") == "/v1", "policy must point at a compose service"
    assert depends_on(svc).get(url.hostname, {}).get("condition") == "service_healthy", \
        "the generate pool must wait for its model server"

    server = services[url.hostname]
    served = [compose_interpolate(a, {}) for a in argv(server)]
    assert policy.model in (option(served, "--served-model-name"), option(served, "--model")), \
        "config's model id is not what vLLM serves"
    max_num_seqs = option(served, "--max-num-seqs")
    assert max_num_seqs and settings.pools.generate.concurrency <= int(max_num_seqs)
    assert "/health" in " ".join(strings(server.get("healthcheck")))


def test_model_server_reserves_an_nvidia_gpu(services):
    gpu_services = []
    for name, svc in services.items():
        devices = (((svc.get("deploy") or {}).get("resources") or {}).get("reservations") or {}).get("devices") or []
        if any(d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", []) for d in devices):
            gpu_services.append(name)
    assert "vllm" in gpu_services
    assert "vllm/vllm-openai" in services["vllm"]["image"]
    assert "${POLICY_MODEL:-" in " ".join(argv(services["vllm"]))


# ---- Temporal and Postgres setup ----------------------------------------------------------------

def test_search_attributes_registered_with_their_types(services, workers):
    create = re.compile(r"search-attribute\s+create\b[^\n]*?--name[ =]\"?(\w+)\"?\s+--type[ =]\"?(\w+)\"?")
    registered: dict[str, str] = {}
    setup_services = set()
    for name, svc in services.items():
        for s in strings([svc.get("entrypoint"), svc.get("command")]):
            for attr, kind in create.findall(s):
                registered[attr] = kind
                setup_services.add(name)
    assert registered == SEARCH_ATTRIBUTES
    (setup,) = setup_services
    assert depends_on(services[setup]).get("temporal", {}).get("condition") == "service_healthy"
    for pool, svc in workers.items():
        assert depends_on(svc).get(setup, {}).get("condition") == "service_completed_successfully", \
            f"worker {pool} must start after the search attributes exist"


def test_gymflow_results_database_is_separate_from_temporal(services, workers):
    url = urlsplit(worker_env(workers["env"])["DATABASE_URL"])
    temporal_env = environment(services["temporal"])
    temporal_dbs = {temporal_env.get("DBNAME", "temporal"),
                    temporal_env.get("VISIBILITY_DBNAME", "temporal_visibility")}
    assert url.path.lstrip("/") not in temporal_dbs
    assert url.username != temporal_env.get("POSTGRES_USER")

    pg = services[url.hostname]
    assert str(pg["image"]).startswith("postgres:16")
    assert any(not str(v).startswith((".", "/")) for v in pg.get("volumes", [])), "postgres needs a named volume"
    assert "pg_isready" in " ".join(strings(pg.get("healthcheck")))
    init_dir = bind_mounts(pg).get("/docker-entrypoint-initdb.d")
    assert init_dir, "postgres must mount init scripts that create the gymflow database"
    init_sql = "\n".join(p.read_text() for p in sorted((ROOT / init_dir).iterdir()) if p.suffix in (".sql", ".sh"))
    assert re.search(r"CREATE ROLE gymflow\b", init_sql)
    assert re.search(r"CREATE DATABASE gymflow OWNER gymflow", init_sql)
    assert re.search(r"CREATE ROLE temporal\b[^;]*CREATEDB", init_sql), "auto-setup creates temporal_visibility"
    assert not re.search(r"PASSWORD\s+'", init_sql), "init scripts must not hold a literal password"


# ---- secrets and interpolation ------------------------------------------------------------------

def test_no_literal_secrets(services):
    assert literal_secrets(services) == []
    assert "${POSTGRES_PASSWORD:?" in environment(services["postgres"])["POSTGRES_PASSWORD"]


def test_secret_check_catches_literals():
    assert literal_secrets({"a": {"environment": {"POSTGRES_PASSWORD": "hunter2"}}})
    assert literal_secrets({"a": {"environment": ["OPENAI_API_KEY=sk-123"]}})
    assert literal_secrets({"a": {"environment": {"HF_TOKEN": "${HF_TOKEN:-hf_abc}"}}})  # a default is a literal
    assert literal_secrets({"a": {"environment": {"DATABASE_URL": "postgresql://u:pw@db/x"}}})
    assert literal_secrets({"a": {"command": ["--api-key", "sk-123"]}})
    assert not literal_secrets({"a": {"environment": {"X_API_KEY": "${X_API_KEY:-}", "PWD_X": "${P:?set P}"}}})


def test_interpolations_are_well_formed():
    doc = yaml.safe_load(COMPOSE.read_text())
    values = strings(doc)
    assert any("${" in s for s in values)
    for s in values:
        compose_interpolate(s, FAKE_ENV)  # raises on a malformed or unsatisfied `${...}`
    with pytest.raises(ValueError, match="POSTGRES_PASSWORD"):
        for s in values:
            compose_interpolate(s, {})


@pytest.mark.parametrize("bad", ["${", "${1X}", "${X:?}", "${X:-${Y}}", "${X!}", "${X:?set X"])
def test_interpolation_check_rejects_malformed(bad):
    with pytest.raises(ValueError):
        compose_interpolate(bad, {"X": "1"})


# ---- the codec server (the Temporal UI reads episode messages through it) ---------------------------

def test_codec_service_serves_the_ui(services):
    from gymflow.cli.codec_cmd import codec as codec_command

    (name,) = [n for n, s in services.items() if argv(s)[:2] == ["gymflow", "codec"]]
    svc, args = services[name], argv(services[name])
    known = {opt for p in codec_command.params for opt in p.opts}
    assert {a.split("=", 1)[0] for a in args[2:] if a.startswith("--")} <= known, "unknown `gymflow codec` option"
    port = option(args, "--port")
    assert option(args, "--bind") == "0.0.0.0" and port
    # The browser calls the endpoint, so the UI must name the codec's published address, on loopback only.
    published = {p.rsplit(":", 1)[1]: p.rsplit(":", 1)[0] for p in svc.get("ports", [])}
    assert published.get(port, "").startswith("127.0.0.1:"), f"{name} must publish {port} on 127.0.0.1"
    host_port = published[port].split(":")[1]
    ui = services["temporal-ui"]
    endpoint = urlsplit(environment(ui)["TEMPORAL_CODEC_ENDPOINT"])
    assert endpoint.hostname in ("localhost", "127.0.0.1") and str(endpoint.port) == host_port
    ui_host_port = next(p.rsplit(":", 1)[0].split(":")[1] for p in ui["ports"] if p.endswith(":8080"))
    origins = option(args, "--cors-origins") or ""
    assert f"http://localhost:{ui_host_port}" in origins.split(","), "CORS must allow the UI's origin"
    assert "*" not in origins.split(","), "any web page could read transcripts"
    # Reads the results database like the workers, with nothing else from their environment.
    env = worker_env(svc)
    url = urlsplit(env["DATABASE_URL"])
    assert url.hostname in services and url.path == "/gymflow" and url.password == FAKE_ENV["POSTGRES_PASSWORD"]
    assert set(env) == {"DATABASE_URL"}, "the codec needs no model keys or other settings"
    assert depends_on(svc).get(url.hostname, {}).get("condition") == "service_healthy"
    assert f":{port}/healthz" in " ".join(strings(svc.get("healthcheck")))

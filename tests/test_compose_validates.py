"""docker-compose.yml as the tools read it, and the data its environments need inside the containers.

tests/test_compose.py checks the file's structure with PyYAML; here Debian's docker-compose 1.29 (which .ci/run
installs) validates it offline with `config` (no Docker engine), and every data folder an environment reads
(`$GYMFLOW_*DATA*`, e.g. workplace_assistant's world and tool schemas) is checked to be set on the services that
run environments and to be there in the container: bind-mounted from a folder that holds it, or copied into the
image by the Dockerfile.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import shlex
import shutil
import subprocess
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from gymflow.environments.base import Placement
from gymflow.environments.workplace_assistant import env as workplace_env
from gymflow.environments.workplace_assistant import world as workplace_world

from tests.test_compose import COMPOSE, FAKE_ENV, ROOT, argv, compose_interpolate, environment, option

DOCKER_COMPOSE = shutil.which("docker-compose")
needs_docker_compose = pytest.mark.skipif(
    DOCKER_COMPOSE is None, reason="docker-compose (1.29) not installed: .ci/run installs it (apt: docker-compose)")

# Where an environment's setup, tool calls and verify run (environments/base.py Placement): `local` in the
# workflow pool, `pool` in the env pool. These pools' services need every environment's data.
POOL_OF_PLACEMENT = {"local": "workflows", "pool": "env"}
DATA_VAR = re.compile(r"""["'](GYMFLOW_[A-Z0-9_]*DATA[A-Z0-9_]*)["']""")


def docker_compose(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """docker-compose on the repo's file, with only PATH and HOME from this environment (no stray COMPOSE_*)."""
    base = {k: os.environ[k] for k in ("PATH", "HOME") if k in os.environ}
    return subprocess.run([DOCKER_COMPOSE or "docker-compose", "-f", str(COMPOSE), *args], cwd=ROOT,
                          env={**base, **(env if env is not None else FAKE_ENV)},
                          capture_output=True, text=True, timeout=120)


# ---- the file as docker-compose 1.29 reads it ----------------------------------------------------------

def test_no_compose_v2_only_top_level_keys():
    """Compose v2 knows a top-level `name:`; docker-compose 1.29 rejects it ("'name' does not match any of the
    regexes: '^x-'"). The project name is COMPOSE_PROJECT_NAME or `-p` (docs/deploy.md)."""
    doc = yaml.safe_load(COMPOSE.read_text())
    assert "name" not in doc, "docker-compose 1.29 rejects a top-level name:"
    unknown = {k for k in doc if not k.startswith("x-")} - {"services", "volumes", "networks", "configs", "secrets"}
    assert not unknown, f"top-level keys docker-compose 1.29 does not know: {sorted(unknown)}"


@needs_docker_compose
def test_docker_compose_config_accepts_the_file():
    out = docker_compose("config", "-q")
    said = (out.stdout + out.stderr).strip()
    assert out.returncode == 0, said
    # No error, and no warning either (an unset ${VAR} without a default would say "... is not set").
    assert said == "", said


@needs_docker_compose
def test_docker_compose_requires_the_postgres_password():
    out = docker_compose("config", "-q", env={})
    assert out.returncode != 0
    assert "POSTGRES_PASSWORD" in out.stderr


# ---- environment data in the containers ------------------------------------------------------------------

def data_vars() -> set[str]:
    """The GYMFLOW_*DATA* variables environments/ reads a data folder from (workplace_assistant's today)."""
    found = set()
    for path in (ROOT / "environments").rglob("*.py"):
        found |= set(DATA_VAR.findall(path.read_text()))
    return found


def environment_services(services: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """service name -> service, for the worker services whose pool runs environments."""
    pools = {POOL_OF_PLACEMENT[p] for p in typing.get_args(Placement)}
    out = {name: svc for name, svc in services.items()
           if argv(svc)[:2] == ["gymflow", "worker"] and option(argv(svc), "--pool") in pools | {"all"}}
    assert {option(argv(s), "--pool") for s in out.values()} >= pools, "a pool that runs environments has no service"
    return out


def mounts(svc: dict[str, Any], env: dict[str, str]) -> dict[str, Path]:
    """container path -> host path of the service's bind mounts, interpolated as compose does (named volumes
    skipped); relative host paths are relative to the compose file's folder."""
    out = {}
    for v in svc.get("volumes") or []:
        if isinstance(v, str):
            parts = compose_interpolate(v, env).split(":")
            src, dst = parts[0], parts[1] if len(parts) > 1 else parts[0]
        else:
            if v.get("type", "volume") != "bind":
                continue
            src, dst = compose_interpolate(v["source"], env), compose_interpolate(v["target"], env)
        if src.startswith((".", "/")):
            out[dst] = (COMPOSE.parent / src).resolve()
    return out


def dockerfile_copies(text: str) -> list[tuple[list[str], str]]:
    """(sources in the build context, absolute destination) of each COPY/ADD from the context, WORKDIR applied."""
    text = re.sub(r"\\\n", " ", text)
    workdir, out = "/", []
    for line in text.splitlines():
        m = re.match(r"\s*(WORKDIR|COPY|ADD)\s+(.+)$", line, re.IGNORECASE)
        if not m:
            continue
        word, rest = m.group(1).upper(), m.group(2).strip()
        if word == "WORKDIR":
            workdir = posixpath.join(workdir, rest)
            continue
        flags, rest = re.fullmatch(r"((?:--\S+\s+)*)(.*)", rest).groups()
        if "--from" in flags:
            continue  # from another stage or image, not the project's files
        *sources, dest = json.loads(rest) if rest.startswith("[") else shlex.split(rest)
        out.append((sources, posixpath.normpath(posixpath.join(workdir, dest))))
    return out


def host_path_in_image(container_path: str, copies: list[tuple[list[str], str]], context: Path) -> Path | None:
    """The build-context folder a COPY puts at `container_path` (or above it), if one does."""
    for sources, dest in copies:
        if len(sources) != 1:
            continue
        rel = posixpath.relpath(container_path, dest)
        if not rel.startswith(".."):
            return (context / sources[0] / rel).resolve()
    return None


def where_the_data_comes_from(svc: dict[str, Any], container_path: str) -> Path | None:
    """The host folder that is `container_path` in this service's container: a bind mount, else a COPY."""
    for target, source in mounts(svc, FAKE_ENV).items():
        rel = posixpath.relpath(container_path, target)
        if not rel.startswith(".."):
            return (source / rel).resolve()
    build = svc.get("build")
    if build:
        spec = {"context": build} if isinstance(build, str) else build
        context = (COMPOSE.parent / spec.get("context", ".")).resolve()
        dockerfile = context / spec.get("dockerfile", "Dockerfile")
        return host_path_in_image(container_path, dockerfile_copies(dockerfile.read_text()), context)
    return None


def test_dockerfile_copy_parser():
    copies = dockerfile_copies("WORKDIR /opt/app\nCOPY a.txt b ./\nCOPY --chown=1:1 data ./data\n"
                               "COPY --from=build /x /y\nWORKDIR sub\nADD [\"c\", \"/abs\"]\n")
    assert copies == [(["a.txt", "b"], "/opt/app"), (["data"], "/opt/app/data"), (["c"], "/abs")]
    assert host_path_in_image("/opt/app/data/w", copies, Path("/ctx")) == Path("/ctx/data/w")
    assert host_path_in_image("/elsewhere", copies, Path("/ctx")) is None


def test_environment_data_vars_are_known():
    assert workplace_world.ENV_VAR in data_vars()
    assert workplace_env.WorkplaceAssistantEnvironment.placement in POOL_OF_PLACEMENT


def test_services_that_run_environments_have_their_data():
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    for name, svc in environment_services(services).items():
        env = {k: compose_interpolate(v, FAKE_ENV) for k, v in environment(svc).items()}
        for var in sorted(data_vars()):
            path = env.get(var)
            assert path and posixpath.isabs(path), f"{name} must set {var} to an absolute path in the container"
            source = where_the_data_comes_from(svc, path)
            assert source is not None, f"{name}: {var}={path} is neither mounted nor copied into the image"
            assert source.is_dir(), f"{name}: {var}={path} comes from {source}, which is not a folder"


def test_the_mounted_workplace_data_is_what_the_environment_reads():
    """The folder the services get holds a world and tool schemas the environment loads (the real loaders)."""
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    sources = set()
    for svc in environment_services(services).values():
        path = compose_interpolate(environment(svc)[workplace_world.ENV_VAR], FAKE_ENV)
        sources.add(where_the_data_comes_from(svc, path))
    (source,) = sources  # one data folder for every pool
    world = workplace_world._load(str(source))
    assert all(world.tables[t] for t in ("emails", "calendar", "analytics", "tasks", "crm"))
    assert len(workplace_env._tools_at(str(source))) == 27


@needs_docker_compose
def test_docker_compose_mounts_the_data_where_the_variable_points():
    """The same, as docker-compose itself resolves the file (relative sources, interpolation)."""
    out = docker_compose("config")
    assert out.returncode == 0, out.stderr
    resolved = yaml.safe_load(out.stdout)["services"]
    for name, svc in environment_services(resolved).items():
        path = environment(svc)[workplace_world.ENV_VAR]
        source = where_the_data_comes_from(svc, path)
        assert source is not None and (source / "world").is_dir() and (source / "tool_schemas").is_dir(), \
            f"{name}: {path} is not the workplace_assistant data in the container"

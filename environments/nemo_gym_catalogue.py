"""NeMo Gym's resources servers as installed in its Python: which exist, what each needs, which can run here.

NeMo Gym (>= 3.13) cannot share gymflow's interpreter, so it lives in a venv of its own: $GYMFLOW_NEMO_GYM_PYTHON,
else `.nemo313/bin/python` in the repository (which `.ci/run` creates). Its wheel ships `resources_servers/<name>/`
with `app.py`, `configs/*.yaml`, `requirements.txt` and `data/example.jsonl`. Everything here reads those files
(one probe of the venv for the installed distributions, cached): nothing starts a server.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from gymflow.kernel.errors import ConfigError

PYTHON_ENV = "GYMFLOW_NEMO_GYM_PYTHON"
REPO_VENV = Path(__file__).resolve().parents[1] / ".nemo313" / "bin" / "python"
MAKE_ONE = ("create one: `~/.pyenv/versions/3.13.0/bin/python -m venv .nemo313 && .nemo313/bin/pip install "
            "--ignore-requires-python nemo-gym==0.7.0` (README.md, under `.ci/run`), or set $GYMFLOW_NEMO_GYM_PYTHON "
            "to a Python 3.13 with nemo-gym installed")
PROBE_TIMEOUT_S = 60.0
_INTERPOLATION = re.compile(r"\$\{([^}]*)\}")
_REQ_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
_REMOTE_URL = re.compile(r"^https?://(?!127\.0\.0\.1|localhost|0\.0\.0\.0)", re.I)


def python() -> Path:
    """The NeMo Gym interpreter, or a ConfigError that says how to make one."""
    given = os.environ.get(PYTHON_ENV)
    path = Path(given) if given else REPO_VENV
    if not path.exists():
        where = f"${PYTHON_ENV}={given}" if given else f"no NeMo Gym python at {path}"
        raise ConfigError(f"{where} does not exist: {MAKE_ONE}")
    return path


def _site_packages(py: Path) -> Path:
    """The venv's site-packages, found from its layout (no interpreter start), else by asking it."""
    for lib in sorted((py.parent.parent / "lib").glob("python3*/site-packages")):
        if (lib / "resources_servers").is_dir():
            return lib
    try:
        done = subprocess.run([str(py), "-c", "import resources_servers as r; print(list(r.__path__)[0])"],
                              capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ConfigError(f"{py} cannot be run to find NeMo Gym's servers ({e}): {MAKE_ONE}") from None
    if done.returncode != 0:
        raise ConfigError(f"{py} has no NeMo Gym (`import resources_servers` failed): {MAKE_ONE}")
    return Path(done.stdout.strip()).parent


@cache
def _installed_dists(py: Path) -> frozenset[str]:
    """Normalized names of every distribution installed in that venv (one probe, cached per process)."""
    code = "import importlib.metadata as m, json; print(json.dumps([d.metadata['Name'] for d in m.distributions()]))"
    try:
        done = subprocess.run([str(py), "-c", code], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
        names = json.loads(done.stdout) if done.returncode == 0 else []
    except (OSError, subprocess.TimeoutExpired, ValueError):
        names = []
    return frozenset(_norm(n) for n in names if isinstance(n, str))


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass
class ServerInfo:
    name: str
    folder: Path
    configs: list[str]  # file names under configs/
    requirements: list[str] = field(default_factory=list)  # beyond nemo-gym itself
    missing: list[str] = field(default_factory=list)  # requirements not installed in the venv
    needs: list[str] = field(default_factory=list)  # what it needs beyond its packages, in words
    refusal: str | None = None  # why it cannot run here, offline; None: it can

    @property
    def examples(self) -> Path:
        return self.folder / "data" / "example.jsonl"


def refusal_for(info: ServerInfo, overrides: dict[str, Any] | None) -> str | None:
    """Why the server cannot run here for a row with these `resources_server_overrides`, or None. A refusal stands
    unless the row gives overrides: they may give the values the server lacks (its own start then says if not)."""
    return info.refusal if info.refusal and not overrides else None


def default_config(info: ServerInfo) -> Path:
    """`configs/<name>.yaml` where it exists (NeMo Gym's own convention), else the first config file."""
    chosen = f"{info.name}.yaml" if f"{info.name}.yaml" in info.configs else info.configs[0]
    return info.folder / "configs" / chosen


def requirements(folder: Path) -> tuple[list[str], list[str]]:
    """(package requirements, requirements from a URL or path) of the server's requirements.txt."""
    path = folder / "requirements.txt"
    if not path.exists():
        return [], []
    plain, remote = [], []
    for raw in path.read_text(errors="replace").splitlines():
        line = raw.split("#", 1)[0].strip()
        # nemo-gym itself, by name or as the repository root (`-e ../../`): installed already.
        if not line or "nemo-gym" in line.replace("_", "-") or line.startswith("-r") \
                or re.fullmatch(r"(-e\s+)?(\.\./)+\.?\.?/?", line):
            continue
        if "://" in line or line.startswith(("-e", ".", "/")) or " @ " in line:
            remote.append(line)
        else:
            plain.append(line)
    return plain, remote


@dataclass(frozen=True)
class Agent:
    """The NeMo Gym agent a server's config names (`responses_api_agents: <agent>:`), and its step bound."""

    name: str | None
    max_steps: int | None = None


def agent(info: ServerInfo, config: str | None = None) -> Agent:
    """The agent of the server's config (`config`, else its default one), as NeMo Gym would start it: the first
    `responses_api_agents` instance whose `resources_server` names this server. Agent(None) when none does."""
    if not info.configs:
        return Agent(None)
    path = info.folder / "configs" / config if config else default_config(info)
    for value in load_config(path).values():
        inner = value.get("responses_api_agents") if isinstance(value, dict) else None
        for impl, cfg in (inner or {}).items() if isinstance(inner, dict) else ():
            if isinstance(cfg, dict) and (cfg.get("resources_server") or {}).get("name") == info.name:
                steps = cfg.get("max_steps")
                return Agent(str(impl), steps if isinstance(steps, int) and not isinstance(steps, bool) else None)
    return Agent(None)


def exposes_mcp(info: ServerInfo, config: str | None = None) -> bool:
    """Whether the server's config (`config`, else its default one) turns on `expose_tools_over_mcp`: its
    /seed_session then announces an MCP endpoint listing the tools its rows may not name."""
    if not info.configs:
        return False
    path = info.folder / "configs" / config if config else default_config(info)
    _, cfg = resources_entry(load_config(path), info.name, path)
    return cfg.get("expose_tools_over_mcp") is True


def sandbox_in_place(info: ServerInfo, path: Path) -> bool:
    """Whether the server's config at `path` configures its sandbox provider in place (`{opensandbox: {...}}`),
    which gymflow's own sandbox can replace (a provider named by reference is resolved at start-up)."""
    return _sandbox_in_place(info.name, path)


@cache
def _sandbox_in_place(server: str, path: Path) -> bool:
    # Asked on every call to a managed server (nemo_gym_server.Spec.of): the config file is read once.
    return isinstance(resources_entry(load_config(path), server, path)[1].get("sandbox_provider"), dict)


def load_config(path: Path) -> dict[str, Any]:
    """One NeMo Gym config file as plain YAML (NeMo Gym loads it with OmegaConf; interpolations stay strings)."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"{path}: not readable as YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of top-level server instances")
    return data


def resources_entry(config: dict[str, Any], server: str, path: Path) -> tuple[str, dict[str, Any]]:
    """(top-level key, the server's own config) of the `resources_servers` instance of `server` in a config file."""
    candidates = []
    for key, value in config.items():
        inner = value.get("resources_servers") if isinstance(value, dict) else None
        if isinstance(inner, dict):
            candidates += [(key, cfg) for impl, cfg in inner.items() if impl == server and isinstance(cfg, dict)]
    if not candidates:
        raise ConfigError(f"{path}: no `resources_servers: {server}:` instance in it")
    return candidates[0]


def _walk(value: Any, path: str = "") -> list[tuple[str, Any]]:
    if isinstance(value, dict):
        return [kv for k, v in value.items() for kv in _walk(v, f"{path}.{k}" if path else str(k))]
    if isinstance(value, list):
        return [kv for i, v in enumerate(value) for kv in _walk(v, f"{path}[{i}]")]
    return [(path, value)]


def config_needs(cfg: dict[str, Any], top: dict[str, Any]) -> tuple[list[str], str | None]:
    """(needs, refusal) from a server's own config: sandboxes, remote URLs, values nobody sets, judge models."""
    needs: list[str] = []
    refusal = None
    unset, remote = [], []
    inline = isinstance(cfg.get("sandbox_provider"), dict)
    if inline:  # a provider configured in place is reached only when a sandbox is made (litmus_agent: a tool's)
        needs.append(f"a sandbox ({', '.join(cfg['sandbox_provider'])} in its config): gymflow's sandbox stands "
                     "in (environments/nemo_gym_sandbox_provider.py: plain Python images only)")
    for key, value in _walk(cfg):
        leaf = key.rsplit(".", 1)[-1]
        if inline and key.startswith(("sandbox_provider.", "sandbox_spec.")):
            continue
        if "sandbox" in key.lower() and value not in (None, False, "", "null"):
            refusal = refusal or f"needs a sandbox provider ({key}), which gymflow cannot give NeMo Gym"
        if isinstance(value, str):
            for ref in _INTERPOLATION.findall(value):
                if ref.startswith("oc.env:") and "," not in ref:
                    unset.append(f"${ref[7:]}")
                elif not ref.startswith("oc.") and ref.split(".")[0] not in top:
                    unset.append(ref)
            if _REMOTE_URL.match(value):
                remote.append(f"{leaf}={value}")
    for key, value in cfg.items():
        if isinstance(value, dict) and value.get("type") == "responses_api_models":
            needs.append(f"model {value.get('name')} ({key}): none given, calls to it fail")
    if remote:
        needs.append("network: " + ", ".join(remote[:3]))
        refusal = refusal or f"needs the network ({remote[0]}); gymflow runs offline"
    if unset:
        needs.append("config values: " + ", ".join(sorted(set(unset))[:6]))
        refusal = refusal or (f"its config needs values nobody set ({', '.join(sorted(set(unset))[:4])}): "
                              "give them in the row's resources_server_overrides")
    return needs, refusal


def required_fields(app: Path) -> list[str]:
    """Fields of the server's config class (a `...ResourcesServerConfig` subclass in its app.py) that have no
    default: read from the source (ast), not by importing it, so the catalogue never runs a server's code."""
    try:
        tree = ast.parse(app.read_text(encoding="utf-8", errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return []
    out: list[str] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        bases = [ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases]
        if not any(b.endswith("ResourcesServerConfig") for b in bases):
            continue
        for item in node.body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and item.value is None \
                    and "Optional" not in ast.unparse(item.annotation) and "None" not in ast.unparse(item.annotation):
                out.append(item.target.id)
    return out


def _describe(folder: Path, dists: frozenset[str]) -> ServerInfo:
    configs = sorted(p.name for p in (folder / "configs").glob("*.yaml"))
    info = ServerInfo(folder.name, folder, configs)
    plain, remote = requirements(folder)
    info.requirements = plain + remote
    for req in plain:
        m = _REQ_NAME.match(req)
        if m and dists and _norm(m.group(1)) not in dists:
            info.missing.append(req)
    refusals = []
    if remote:
        refusals.append(f"needs packages from a URL or path ({remote[0]})")
    if info.missing:
        refusals.append(f"packages not installed in the NeMo Gym venv: {', '.join(info.missing[:4])} "
                        f"(`gymflow env nemo-gym-install {folder.name}`)")
    if not configs:
        refusals.append("no config file under configs/")
    else:
        try:
            path = default_config(info)
            top = load_config(path)
            _, cfg = resources_entry(top, folder.name, path)
            needs, refusal = config_needs(cfg, top)
            unset = [f for f in required_fields(folder / "app.py") if f not in cfg]
            if unset:  # the server would not start: pydantic refuses its config (google_search's API key)
                needs.append("config values: " + ", ".join(unset[:6]))
                refusal = refusal or (f"its config needs values nobody set ({', '.join(unset[:4])}): give them in "
                                      "the row's resources_server_overrides")
            info.needs += needs
            if refusal:
                refusals.append(refusal)
        except ConfigError as e:
            refusals.append(str(e))
    info.refusal = "; ".join(refusals) or None
    return info


def forget_installed() -> None:
    """Drop the cached probe of installed packages and the catalogue built from it (after an install)."""
    _installed_dists.cache_clear()
    catalogue.cache_clear()


@cache
def catalogue(py: Path | None = None) -> dict[str, ServerInfo]:
    """Every resources server installed for `py` (default: `python()`), by name."""
    py = py or python()
    root = _site_packages(py) / "resources_servers"
    dists = _installed_dists(py)
    return {d.name: _describe(d, dists) for d in sorted(root.iterdir()) if (d / "app.py").is_file()}


def server(name: str, py: Path | None = None) -> ServerInfo:
    """One server installed for `py` (default: `python()`), or a ConfigError naming the close matches."""
    py = py or python()
    servers = catalogue(py)
    if name not in servers:
        close = [n for n in servers if name.split("_")[0] in n][:5]
        hint = f" (similar: {', '.join(close)})" if close else ""
        raise ConfigError(f"NeMo Gym resources server {name!r} is not installed in {py}{hint}: "
                          "`gymflow env list --nemo-gym` lists those that are")
    return servers[name]

"""Start one NeMo Gym resources server as NeMo Gym's `ng_run` starts its children. Runs under NeMo Gym's Python.

    python nemo_gym_launch.py SERVER_DIR CONFIG_YAML SERVER PORT PARENT_PID OVERRIDES_JSON

It reads CONFIG_YAML with OmegaConf (as NeMo Gym reads config files), keeps the `resources_servers: SERVER` instance
(the agents and model servers in the same file are not started), merges OVERRIDES_JSON into that instance's config,
binds it to 127.0.0.1:PORT, resolves every interpolation (a value nobody set fails here, by name, not mid-run),
then execs `python app.py` in SERVER_DIR with NEMO_GYM_CONFIG_DICT / NEMO_GYM_CONFIG_PATH set. It dies with the
process that started it (PR_SET_PDEATHSIG), so a killed env worker leaves no server behind. Exit 3: bad config.

OVERRIDES_JSON may name the model servers the server calls (a judge: `judge_model_server: {name: judge_model}`) in
`gymflow_model_urls: {"judge_model": "http://host:port"}`: NeMo Gym finds a model server by its top-level config
entry, which no override of the instance can add, so each becomes one here (the key is not merged).

A config whose `sandbox_provider` is `{gymflow: {...}}` gets gymflow's sandbox (nemo_gym_sandbox_provider.py,
beside this file), registered with NeMo Gym's provider registry; app.py then runs in this process (runpy, as
`python app.py` would run it), so the registration is there when the server makes its first sandbox.
"""

import ctypes
import importlib.util
import json
import os
import runpy
import signal
import sys
from pathlib import Path
from urllib.parse import urlsplit

MODEL_URLS = "gymflow_model_urls"
SANDBOX_PROVIDER = "gymflow"


def _die_with_parent(parent_pid: int) -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        sys.exit(1)


def _model_entries(urls: object, taken: set) -> dict:
    """Top-level config entries for the model servers named in `gymflow_model_urls` (NeMo Gym's client reads
    only the host and port of a model server's entry)."""
    if not isinstance(urls, dict):
        raise ValueError(f"{MODEL_URLS}: expected an object of model server name -> http://host:port")
    out = {}
    for name, url in urls.items():
        parts = urlsplit(url) if isinstance(url, str) else None
        if parts is None or parts.scheme != "http" or not parts.hostname or parts.port is None:
            raise ValueError(f"{MODEL_URLS}.{name}: expected http://host:port, got {url!r}")
        if name in taken:
            raise ValueError(f"{MODEL_URLS}.{name}: names an entry the config has already")
        out[name] = {"responses_api_models": {"gymflow_model": {"host": parts.hostname, "port": parts.port}}}
    return out


def _config(config_path: str, server: str, port: int, overrides: dict) -> tuple:
    from omegaconf import OmegaConf

    overrides = dict(overrides)
    models = overrides.pop(MODEL_URLS, None)

    full = OmegaConf.load(config_path)
    # hasattr "keys", not "get": a list (a top-level `config_paths: [...]`) has `get` too, and it raises on a str.
    found = [(key, value["resources_servers"]) for key, value in full.items()
             if hasattr(value, "keys") and value.get("resources_servers") is not None
             and server in value["resources_servers"]]
    if not found:
        raise ValueError(f"{config_path}: no `resources_servers: {server}:` instance in it")
    top, inner = found[0]
    provider = overrides.pop("sandbox_provider", None)
    instance = OmegaConf.merge(inner[server], OmegaConf.create(overrides),
                               {"host": "127.0.0.1", "port": port})
    if provider is not None:  # replaced, not merged: a provider config names exactly one provider
        instance["sandbox_provider"] = provider
    config = OmegaConf.create({"head_server": {"host": "127.0.0.1", "port": 9}, "dry_run": False,
                               top: {"resources_servers": {server: instance}}})
    # Interpolations may point at other top-level keys of the same file (`${judge_model_name}`).
    # `config_paths` is not one: it is NeMo Gym's list of other config files to merge (their servers are not ours).
    for key, value in full.items():
        if key not in (top, "config_paths") and not hasattr(value, "keys"):
            config[key] = value
    if models is not None:
        for name, entry in _model_entries(models, set(config.keys())).items():
            config[name] = entry
    OmegaConf.to_container(config[top], resolve=True)  # fails now, naming the key nobody set
    return str(top), OmegaConf.to_yaml(config)


def _uses_gymflow_sandbox(overrides: dict) -> bool:
    provider = overrides.get("sandbox_provider")
    return isinstance(provider, dict) and list(provider) == [SANDBOX_PROVIDER]


def _register_gymflow_sandbox() -> None:
    from nemo_gym.sandbox.providers.registry import register_provider

    path = Path(__file__).with_name("nemo_gym_sandbox_provider.py")
    spec = importlib.util.spec_from_file_location("gymflow_nemo_gym_sandbox_provider", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    register_provider(SANDBOX_PROVIDER, module.GymflowSandboxProvider, override=True)


def main() -> None:
    server_dir, config_path, server, port, parent_pid, overrides = sys.argv[1:7]
    _die_with_parent(int(parent_pid))
    try:
        top, config_yaml = _config(config_path, server, int(port), json.loads(overrides))
    except Exception as e:  # any config problem: one line for the manager to show
        print(f"gymflow-nemo-gym-launch: config error: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        sys.exit(3)
    os.environ["NEMO_GYM_CONFIG_DICT"] = config_yaml
    os.environ["NEMO_GYM_CONFIG_PATH"] = top
    os.chdir(server_dir)
    if not _uses_gymflow_sandbox(json.loads(overrides)):
        os.execv(sys.executable, [sys.executable, "app.py"])
    # sys.path[0] is this file's folder, whose modules (calendar.py) would shadow the standard library's.
    sys.argv, sys.path[0] = ["app.py"], os.getcwd()
    _register_gymflow_sandbox()
    runpy.run_path("app.py", run_name="__main__")


if __name__ == "__main__":
    main()

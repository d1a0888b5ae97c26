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
"""

import ctypes
import json
import os
import signal
import sys
from urllib.parse import urlsplit

MODEL_URLS = "gymflow_model_urls"


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
    instance = OmegaConf.merge(inner[server], OmegaConf.create(overrides),
                               {"host": "127.0.0.1", "port": port})
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
    os.execv(sys.executable, [sys.executable, "app.py"])


if __name__ == "__main__":
    main()

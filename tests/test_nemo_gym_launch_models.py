"""The launcher gives a managed NeMo Gym server the model servers it calls (its judge): `gymflow_model_urls` in the
overrides becomes top-level config entries, where NeMo Gym's client looks a model server up by name; the key itself
is not merged into the server's config, and a bad URL or a clash is a config error (exit 3), not a server start. A
config file with a top-level list (`config_paths`) still finds its instance.

Runs the launcher's config step under NeMo Gym's Python (it needs OmegaConf); skipped without one unless
GYMFLOW_REQUIRE_NEMO_GYM=1 (CI).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from gymflow.environments import nemo_gym_catalogue as catalogue
from gymflow.environments.nemo_gym_server import LAUNCHER

from gymflow.kernel.errors import ConfigError

try:
    PY: Path | None = catalogue.python()
    WHY = ""
except ConfigError as e:
    PY, WHY = None, str(e)
if PY is None and os.environ.get("GYMFLOW_REQUIRE_NEMO_GYM") == "1":
    raise RuntimeError(f"GYMFLOW_REQUIRE_NEMO_GYM=1 but {WHY}")
pytestmark = pytest.mark.skipif(PY is None, reason=WHY)

CONFIG = """\
config_paths:
  - responses_api_agents/some_agent/configs/some_agent.yaml
judge_name: the_judge
my_server:
  resources_servers:
    my_server:
      entrypoint: app.py
      judge_model_server:
        type: responses_api_models
        name: ${judge_name}
      should_use_judge: true
"""


def _config(tmp_path: Path, overrides: dict[str, Any]) -> tuple[int, Any, str]:
    """(exit code, the config it would hand the server, stderr) of the launcher's config step."""
    path = tmp_path / "my_server.yaml"
    path.write_text(CONFIG)
    code = (f"import importlib.util, json, sys; s = importlib.util.spec_from_file_location('l', {str(LAUNCHER)!r}); "
            "m = importlib.util.module_from_spec(s); s.loader.exec_module(m)\n"
            "try:\n"
            f"    top, text = m._config({str(path)!r}, 'my_server', 4321, json.loads(sys.argv[1]))\n"
            "except Exception as e:\n"
            "    print(e, file=sys.stderr); sys.exit(3)\n"
            "print(text)")
    assert PY is not None
    done = subprocess.run([str(PY), "-c", code, json.dumps(overrides)], capture_output=True, text=True, timeout=120)
    return done.returncode, yaml.safe_load(done.stdout) if done.returncode == 0 else None, done.stderr


def test_model_urls_become_top_level_model_servers(tmp_path: Path) -> None:
    rc, config, err = _config(tmp_path, {"gymflow_model_urls": {"the_judge": "http://127.0.0.1:5555"},
                                         "should_use_judge": False})
    assert rc == 0, err
    assert config["the_judge"] == {"responses_api_models": {"gymflow_model": {"host": "127.0.0.1", "port": 5555}}}
    instance = config["my_server"]["resources_servers"]["my_server"]
    assert "gymflow_model_urls" not in instance  # ours, not the server's
    assert instance["should_use_judge"] is False and instance["port"] == 4321


def test_without_model_urls_the_config_is_unchanged(tmp_path: Path) -> None:
    rc, config, err = _config(tmp_path, {})
    assert rc == 0, err
    assert set(config) == {"head_server", "dry_run", "my_server", "judge_name"}


def test_a_top_level_list_is_no_server_instance(tmp_path: Path) -> None:
    """NeMo Gym's critpt.yaml starts with `config_paths: [...]`: the search for the instance skips a list (it raised
    'ListConfig indices must be integers' before, so the server never started)."""
    rc, config, err = _config(tmp_path, {})
    assert rc == 0, err
    assert "config_paths" not in config  # other files' servers are not started


@pytest.mark.parametrize("urls, why", [
    ({"the_judge": "https://example.com"}, "expected http://host:port"),
    ({"the_judge": "http://127.0.0.1"}, "expected http://host:port"),
    ({"my_server": "http://127.0.0.1:1"}, "already"),
    ("http://127.0.0.1:1", "expected an object"),
])
def test_bad_model_urls_are_config_errors(tmp_path: Path, urls: Any, why: str) -> None:
    rc, _, err = _config(tmp_path, {"gymflow_model_urls": urls})
    assert rc == 3 and why in err

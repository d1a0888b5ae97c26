"""The catalogue refuses, before anything starts, a server whose config class requires values its config file does
not set (NeMo Gym's server would die at start-up on pydantic's error), read from app.py's source, never run."""

from __future__ import annotations

from pathlib import Path

from environments.nemo_gym_catalogue import required_fields

APP = '''
from typing import Optional
from pydantic import Field
from nemo_gym.base_resources_server import BaseResourcesServerConfig
import nemo_gym.base_resources_server as base

class SearchConfig(BaseResourcesServerConfig):
    google_api_key: str
    google_cx: str
    timeout_s: float = 10.0
    proxy: Optional[str]
    region: str | None

class Other(base.BaseResourcesServerConfig):
    judge_name: str

class NotAConfig:
    secret: str

raise SystemExit("the catalogue must not run this file")
'''


def test_required_fields_are_read_from_the_source_without_running_it(tmp_path: Path) -> None:
    app = tmp_path / "app.py"
    app.write_text(APP)
    assert required_fields(app) == ["google_api_key", "google_cx", "judge_name"]


def test_an_unreadable_app_has_no_required_fields(tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_text("class (:")
    assert required_fields(tmp_path / "bad.py") == [] and required_fields(tmp_path / "missing.py") == []


def test_a_sandbox_configured_in_place_is_a_need_and_a_named_one_a_refusal() -> None:
    """NeMo Gym resolves a provider named by reference (`sandbox_provider: sandbox`) at start-up, where an undefined
    one stops the server; one configured in place is reached only when a sandbox is made (litmus_agent: its
    code-exec tool), so the server's other rows run."""
    from environments.nemo_gym_catalogue import config_needs

    named = {"sandbox_provider": "sandbox", "sandbox_config": {"ttl_s": 60}}
    inline = {"sandbox_provider": {"opensandbox": {"connection": {"domain": "x"}}}, "sandbox_spec": {"image": "py"}}
    host = {"sandbox_host": "127.0.0.1"}
    assert "needs a sandbox provider (sandbox_provider)" in (config_needs(named, {})[1] or "")
    assert "needs a sandbox provider (sandbox_host)" in (config_needs(host, {})[1] or "")
    needs, refusal = config_needs(inline, {})
    assert refusal is None
    assert any("a sandbox (opensandbox in its config): gymflow's sandbox stands in" in n for n in needs)
    assert config_needs({**inline, "sandbox_host": "h"}, {})[1] is not None  # in place, and a host elsewhere

"""Config: one YAML file, ${VAR} interpolation, errors that name the key."""

from __future__ import annotations

import pytest

from gymflow.kernel.config import config_path, load_settings, settings_from_mapping
from gymflow.kernel.errors import ConfigError


def test_interpolation_with_defaults(tmp_path):
    path = tmp_path / "g.yaml"
    path.write_text("models:\n  policy:\n    base_url: ${VLLM_URL:-http://localhost:8000/v1}\n"
                    "    model: ${MODEL}\n    api_key_env: OPENAI_API_KEY\n")
    s = load_settings(path, env={"MODEL": "qwen"})
    assert s.models["policy"].base_url == "http://localhost:8000/v1"
    assert s.models["policy"].model == "qwen"


def test_missing_variable_names_the_key(tmp_path):
    path = tmp_path / "g.yaml"
    path.write_text("models:\n  policy:\n    base_url: x\n    model: ${MODEL}\n")
    with pytest.raises(ConfigError, match=r"models\.policy\.model: environment variable \$\{MODEL\} is not set"):
        load_settings(path, env={})


def test_validation_error_names_file_and_key(tmp_path):
    path = tmp_path / "g.yaml"
    path.write_text("models:\n  policy:\n    model: m\n")
    with pytest.raises(ConfigError) as e:
        load_settings(path, env={})
    assert str(path) in str(e.value) and "models.policy: Value error, set exactly one of base_url" in str(e.value)
    path.write_text("models:\n  policy:\n    base_url: u\n    concurrency: 0\n")
    with pytest.raises(ConfigError, match="models.policy.concurrency: Input should be greater than or equal to 1"):
        load_settings(path, env={})


def test_unknown_key_is_rejected():
    with pytest.raises(ConfigError, match="pools.gpu: Extra inputs are not permitted"):
        settings_from_mapping({"pools": {"gpu": {"concurrency": 1}}}, env={})


def test_api_key_env_must_be_a_name_not_a_key():
    with pytest.raises(ConfigError, match="api_key_env: Value error, must be the NAME"):
        settings_from_mapping({"models": {"p": {"base_url": "u", "model": "m", "api_key_env": "sk-abc123-xyz"}}},
                              env={})


def test_generation_placement_is_pool_or_local():
    base = {"base_url": "u", "model": "m"}
    # explicit values: the default is the lead's to choose (gymflow/kernel/config.py)
    s = settings_from_mapping({"models": {"p": {**base, "placement": "pool"}, "q": {**base, "placement": "local"}}},
                              env={})
    assert (s.models["p"].placement, s.models["q"].placement) == ("pool", "local")
    with pytest.raises(ConfigError, match=r"models.p.placement: Input should be 'pool' or 'local'"):
        settings_from_mapping({"models": {"p": {**base, "placement": "gpu"}}}, env={})


def test_environment_overrides_addresses():
    s = settings_from_mapping({"temporal": {"address": "a:1"}}, env={"TEMPORAL_ADDRESS": "b:2",
                                                                      "DATABASE_URL": "postgresql://x/y"})
    assert s.temporal.address == "b:2" and s.database.url == "postgresql://x/y"


def test_empty_variable_means_unset():
    s = settings_from_mapping({"temporal": {"address": "${TEMPORAL_ADDRESS:-}"}}, env={})
    assert s.temporal.address is None


def test_example_config_loads():
    from tests.conftest import ROOT

    s = load_settings(ROOT / "gymflow.example.yaml", env={})
    assert s.models["policy"].api_key_env == "OPENAI_API_KEY" and s.temporal.address is None


def test_an_empty_gymflow_config_variable_is_unset(tmp_path, monkeypatch):
    """`GYMFLOW_CONFIG= gymflow demo` read "." (a directory) and stopped; empty means not set."""
    monkeypatch.chdir(tmp_path)
    assert config_path(env={"GYMFLOW_CONFIG": ""}) is None
    (tmp_path / "gymflow.yaml").write_text("state_dir: here\n")
    assert config_path(env={"GYMFLOW_CONFIG": ""}) == "gymflow.yaml"
    assert load_settings(env={"GYMFLOW_CONFIG": ""}).state_dir.name == "here"

"""`environments.<name>.*` options are checked against each environment's declared `Options` when settings load
(CLI) and when a collect starts (Python API): bad values and typos fail naming the file and key, never at call time."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from click.testing import CliRunner
from gymflow.activities.env_processes import Limits
from gymflow.environments.base import EnvironmentOptions
from gymflow.environments.registry import available, check_options, get_environment

from gymflow.cli.main import cli
from gymflow.client import check_collectable
from gymflow.kernel.config import Settings, load_settings
from gymflow.kernel.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("options", "key", "why"), [
    ({"tool_timeout_s": math.nan}, "environments.mcqa.tool_timeout_s", "finite"),
    ({"tool_timeout_s": -1}, "environments.mcqa.tool_timeout_s", "greater than or equal to 0.1"),
    ({"tool_timeout_s": 1e-9}, "environments.mcqa.tool_timeout_s", "greater than or equal to 0.1"),
    ({"verify_timeout_s": 88_473_600}, "environments.mcqa.verify_timeout_s", "less than or equal to 86400"),
    ({"memory_mb": "lots"}, "environments.mcqa.memory_mb", "valid integer"),
    ({"memory_mb": 0.5}, "environments.mcqa.memory_mb", "fractional"),  # once became 0: no cap at all
    ({"memory_mb": 32}, "environments.mcqa.memory_mb", "greater than or equal to 64"),
    ({"placement": "gpu"}, "environments.mcqa.placement", "'local' or 'pool'"),
    ({"grading_mode": "loose"}, "environments.mcqa.grading_mode", "strict_single_letter_boxed"),
    ({"regex_timeout_s": math.inf}, "environments.mcqa.regex_timeout_s", "finite"),
])
def test_a_bad_option_value_fails_at_load_naming_the_file_and_key(options, key, why):
    with pytest.raises(ConfigError) as err:
        check_options({"mcqa": options}, "run.yaml")
    assert f"run.yaml: {key}: " in str(err.value)
    assert why in str(err.value)


def test_a_misspelt_option_name_lists_the_known_ones():
    with pytest.raises(ConfigError) as err:
        check_options({"instruction_following": {"max_reponse_chars": 10}}, "run.yaml")
    message = str(err.value)
    assert "run.yaml: environments.instruction_following.max_reponse_chars: unknown option" in message
    assert "max_response_chars" in message and "verify_timeout_s" in message


def test_options_for_an_environment_that_is_not_installed_fail():
    with pytest.raises(ConfigError, match=r"environments\.mathh: no environment 'mathh' is installed "
                                          r"\(installed: .*math_with_judge"):
        check_options({"mathh": {"verify_timeout_s": 10}}, "run.yaml")


def test_every_problem_is_reported_at_once():
    with pytest.raises(ConfigError) as err:
        check_options({"mcqa": {"tool_timeout_s": -1, "memory_mb": "x"}, "nope": {}}, "run.yaml")
    assert str(err.value).count("run.yaml: ") == 3


def test_good_options_load_normalised():
    """`${VAR}` interpolation yields strings: "30" is 30 s, as for the rest of the config."""
    out = check_options({"math_with_judge": {"library_timeout_s": "30", "judge_model": "judge"},
                         "nemo_gym": {"servers": {"math": "http://127.0.0.1:9"}, "timeout_s": 5},
                         "equivalence_llm_judge": {"judge_model": "judge", "check_twice_swap": True,
                                                   "placement": "pool", "memory_mb": 512}}, "run.yaml")
    assert out["math_with_judge"] == {"library_timeout_s": 30.0, "judge_model": "judge"}
    assert out["nemo_gym"]["timeout_s"] == 5.0
    assert out["equivalence_llm_judge"]["memory_mb"] == 512
    assert Limits.from_options(out["math_with_judge"]).verify_s == 30.0


def test_the_equivalence_judge_keeps_its_own_checks():
    with pytest.raises(ConfigError, match="judge_prompt_template"):
        check_options({"equivalence_llm_judge": {"judge_prompt_template": "{nope}"}}, "run.yaml")


def test_every_installed_environment_declares_the_platform_options():
    for name in available():
        options = get_environment(name).Options
        assert issubclass(options, EnvironmentOptions), name
        assert {"placement", "tool_timeout_s", "verify_timeout_s", "setup_timeout_s", "memory_mb",
                "max_state_bytes"} <= set(options.model_fields), name


def test_the_example_config_options_load():
    settings = load_settings(ROOT / "gymflow.example.yaml", env={})
    assert check_options(settings.environments, "gymflow.example.yaml")
    assert settings.rollout.sampling.max_tokens  # a reply without a bound holds up a local model's whole batch


def test_the_cli_refuses_a_config_with_a_typo_before_connecting(tmp_path):
    config = tmp_path / "gymflow.yaml"
    config.write_text("environments:\n  mcqa: {verify_timout_s: 5}\n")
    rows = tmp_path / "rows.jsonl"
    rows.write_text("{}\n")
    res = CliRunner().invoke(cli, ["collect", str(rows), "--env", "mcqa", "--model", "x", "-c", str(config)])
    assert res.exit_code != 0
    assert f"{config}: environments.mcqa.verify_timout_s: unknown option" in res.output


def test_a_collect_from_python_refuses_a_nan_option():
    settings = Settings(environments={"mcqa": {"tool_timeout_s": math.nan}})
    with pytest.raises(ConfigError, match=r"environments\.mcqa\.tool_timeout_s: Input should be a finite number"):
        check_collectable(settings, {"mcqa"}, "x")


def test_a_call_limit_past_the_activity_timeout_is_refused_naming_both():
    """A verify limit the activity's own timeout cuts first would be retried and end activity_timeout, never the
    typed verifier_timeout it was meant to give."""
    settings = Settings(environments={"math_with_judge": {"library_timeout_s": 150}, "mcqa": {"tool_timeout_s": 5}})
    with pytest.raises(ConfigError) as err:
        check_collectable(settings, {"math_with_judge"}, "x")
    assert ("environments.math_with_judge.library_timeout_s: 150 s is not below rollout.limits.env.start_to_close_s "
            "(120 s)") in str(err.value)
    assert "mcqa" not in str(err.value), "a limit below the timeout passes"
    ok = {"rollout": {"limits": {"env": {"start_to_close_s": 200, "schedule_to_close_s": 900}}}}
    assert check_options(settings.environments, activity_timeout_s=Settings.model_validate(ok).rollout.limits.env
                         .start_to_close_s)["math_with_judge"] == {"library_timeout_s": 150}

"""The messages a newcomer meets first (a fresh clone, no config, no stack) say what is wrong and how to fix it."""

from __future__ import annotations

import importlib.util
import json
import logging
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from gymflow.environments.base import Environment
from gymflow.workers.local_stack import free_port
from temporalio.runtime import LogForwardingConfig

from gymflow.cli.data_cmd import data
from gymflow.cli.env_cmd import describe, env
from gymflow.client import check_collectable
from gymflow.data.datasets import grouped, load_jsonl
from gymflow.kernel import safe_yaml
from gymflow.kernel.config import Settings, load_settings
from gymflow.kernel.connect import CORE_LOGGER, TEMPORAL_FIX, TemporalUnreachable, connect_temporal, startup_wait_s
from gymflow.kernel.errors import ConfigError
from gymflow.kernel.logfilter import CoreLogFilter
from tests.conftest import ROOT

NO_PROMPT = {"expected": "x"}  # a row with neither responses_create_params nor messages


def _rows(path: Path, rows: list[object]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# -- 1. dataset errors, one line per kind of mistake --------------------------------------------------------


def test_the_same_mistake_in_many_rows_is_one_line(tmp_path):
    path = _rows(tmp_path / "rows.jsonl", [NO_PROMPT] * 7 + [[1]])
    tasks, errors = load_jsonl(path, env="single_tool")
    assert not tasks and [e.line for e in errors] == [1, 2, 3, 4, 5, 6, 7, 8]  # per-line records stay
    lines = grouped(errors)
    assert len(lines) == 2, lines
    assert lines[0] == (f"{path}: 7 rows: {errors[0].message} (lines 1, 2, 3, 4, 5, … (2 more))")
    assert lines[1] == str(errors[7]) and lines[1].startswith(f"{path}:8: row: expected a JSON object")
    assert grouped(errors[:1]) == [str(errors[0])]  # one row keeps the file:line form


def test_data_prepare_prints_each_kind_of_mistake_once(tmp_path):
    path = _rows(tmp_path / "rows.jsonl", [NO_PROMPT] * 5)
    result = CliRunner(env={"COLUMNS": "400"}).invoke(data, ["prepare", str(path), "--env", "single_tool",
                                                             "--out", str(tmp_path / "out.jsonl")])
    assert result.exit_code == 1, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error ")]
    assert len(errors) == 1 and errors[0].endswith("(lines 1, 2, 3, 4, 5)") and ": 5 rows: " in errors[0], errors


# -- 2. every YAML error names the file and the line ---------------------------------------------------------


@pytest.mark.parametrize("loader", [None, safe_yaml._PyLoader])  # noqa: SLF001 - libyaml's and PyYAML's reader
@pytest.mark.parametrize("text", ["a: 1\nb: 2\nc: \x07\n", b"a: 1\nb: 2\nc: \xff\n"])
def test_a_bad_character_is_reported_by_file_and_line(loader, text):
    with pytest.raises(ConfigError) as e:
        safe_yaml.loads(text, "g.yaml", loader=loader)
    assert str(e.value).startswith("g.yaml, line 3, column 4: not valid YAML"), e.value


def test_config_with_a_control_character_names_file_and_line(tmp_path):
    path = tmp_path / "gymflow.yaml"
    path.write_text("rollout:\n  max_turns: 8\n  x: \x07\n")
    with pytest.raises(ConfigError, match=rf"^{path}, line 3, column 6: not valid YAML"):
        load_settings(path, env={})


# -- 3. no model configured: how to get one -------------------------------------------------------------------


def test_no_model_says_how_to_configure_one():
    for call in (lambda: Settings().model_config_for("policy"),
                 lambda: check_collectable(Settings(), {"single_tool"}, "policy")):
        with pytest.raises(ConfigError) as e:
            call()
        message = str(e.value)
        assert "model 'policy' is not configured (models: none)" in message
        assert "copy gymflow.example.yaml to gymflow.yaml and set models.policy" in message, message
        assert "`gymflow demo`" in message, message
    assert (ROOT / "gymflow.example.yaml").exists()


# -- 4. an unreachable Temporal: the fix in the first notice, a short wait at a terminal ---------------------


async def test_first_unreachable_notice_names_the_address_and_the_fix():
    notes: list[str] = []
    address = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(TemporalUnreachable) as err:
        await connect_temporal(address, wait_s=4, on_wait=notes.append)
    assert time.monotonic() - started < 4 + 1.5
    assert notes and notes[0].startswith(f"Temporal at {address} unreachable, retrying (since"), notes
    assert "for up to 4 s; start it with `gymflow up`, or set temporal.address or $TEMPORAL_ADDRESS" in notes[0]
    assert all(TEMPORAL_FIX not in n for n in notes[1:])  # said once, not every 5 s
    assert TEMPORAL_FIX in str(err.value)


def test_startup_wait_is_short_at_a_terminal(monkeypatch):
    assert startup_wait_s({}, interactive=True) == 30
    assert startup_wait_s({}, interactive=False) == 300
    assert startup_wait_s({"GYMFLOW_STARTUP_WAIT_S": "600"}, interactive=True) == 600  # the variable wins
    tty = SimpleNamespace(isatty=lambda: True)
    monkeypatch.setattr("sys.stdin", tty)
    monkeypatch.setattr("sys.stderr", tty)
    assert startup_wait_s({}) == 30
    monkeypatch.setattr("sys.stdin", None)  # a daemon without stdin
    assert startup_wait_s({}) == 300


# -- 5. env list: placement and what each environment needs ---------------------------------------------------


def test_env_list_shows_placement_and_needs():
    assert Environment.needs == ()
    result = CliRunner(env={"COLUMNS": "400"}).invoke(env, ["list"])
    assert result.exit_code == 0, result.output
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
            for line in result.output.splitlines() if line.startswith("│")}
    assert rows["code_gen"][0] == "pool" and "bubblewrap" in rows["code_gen"][1]
    assert "judge model" in rows["equivalence_llm_judge"][1]
    assert "data" in rows["workplace_assistant"][1]
    assert "NeMo Gym resources server" in rows["nemo_gym"][1]
    assert rows["single_tool"] == ["local", "-"]
    assert describe("no.such.module:Env")[1].startswith("cannot import no.such.module:Env: ")


# -- 6. the NeMo Gym parity skip points at something that exists ----------------------------------------------


def test_parity_skip_message_points_at_real_instructions(monkeypatch):
    monkeypatch.setenv("GYMFLOW_NEMO_GYM_PYTHON", "/nonexistent/python")
    monkeypatch.delenv("GYMFLOW_REQUIRE_NEMO_GYM", raising=False)
    spec = importlib.util.spec_from_file_location("_parity_probe", ROOT / "tests" / "test_nemo_gym_parity.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # a fresh copy: the probe runs with the missing python
    why = module.WHY
    assert module.SERVERS_DIR is None and "/nonexistent/python" in why
    assert ".ci/run" in why and "GYMFLOW_NEMO_GYM_PYTHON" in why, why
    readme = (ROOT / "README.md").read_text()
    assert (ROOT / ".ci" / "run").exists() and "`.ci/run`" in readme and "GYMFLOW_NEMO_GYM_PYTHON" in readme


# -- 7. the SDK core's forwarded logs: no colour codes, each TMPRL code at most once a minute -------------------


def _forward(logger: logging.Logger, message: str) -> None:
    """What the SDK does with one core log entry (temporalio.runtime.LogForwardingConfig)."""
    entry = SimpleNamespace(level=logging.WARNING, target="temporal_sdk_core::worker", message=message, fields={},
                            time=time.time())
    LogForwardingConfig(logger=logger)._on_logs([entry])  # noqa: SLF001


def test_core_logs_lose_colour_codes_and_repeats(caplog):
    now = [0.0]
    logger = logging.getLogger("test_newcomer.core")
    logger.addFilter(CoreLogFilter(["TMPRL1104"], every_s=60, clock=lambda: now[0]))
    with caplog.at_level(logging.WARNING, logger=logger.name):
        for t in (0, 10, 20, 61, 62):
            now[0] = t
            _forward(logger, "\x1b[33m[TMPRL1103] Attempted to upload\x1b[0m a big payload")
        _forward(logger, "\x1b[1m[TMPRL1104] Workflow task duration exceeded 5 seconds\x1b[0m")
        _forward(logger, "\x1b[31mplain\x1b[0m core line")
    shown = [r.getMessage() for r in caplog.records]
    assert all("\x1b" not in m for m in shown), shown
    assert len(shown) == 3, shown
    assert shown[0].endswith("[TMPRL1103] Attempted to upload a big payload {}")
    assert shown[1].endswith("a big payload {} (2 more TMPRL1103 since the last one, not shown)")
    assert shown[2].endswith("plain core line {}")


def test_worker_logging_installs_the_core_filter():
    from gymflow.kernel.connect import worker_logging

    config = worker_logging()
    assert config.forwarding is not None and config.forwarding.logger.name == CORE_LOGGER
    filters = [f for f in config.forwarding.logger.filters if isinstance(f, CoreLogFilter)]
    assert len(filters) == 1 and "TMPRL1104" in filters[0].expected

"""`gymflow collect` after failures says how to retry them; Ctrl-C says the rollouts keep running."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from gymflow.cli import collect_cmd
from gymflow.cli.progress import Tally


def _files(tmp_path: Path) -> tuple[Path, Path]:
    config = tmp_path / "gymflow.yaml"
    config.write_text("models:\n  policy: {base_url: 'http://127.0.0.1:9/v1', model: m}\n")
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"id": "a", "messages": [{"role": "user", "content": "hi"}]}) + "\n")
    return config, rows


def _invoke(tmp_path: Path, monkeypatch, outcome):
    config, rows = _files(tmp_path)

    def fake_run(coro):
        coro.close()  # never started: what matters is what the command prints about the outcome
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    monkeypatch.setattr(collect_cmd, "run", fake_run)
    args = [str(rows), "--env", "one_word", "--run-id", "r1", "-c", str(config)]
    return CliRunner().invoke(collect_cmd.collect, args), config, rows


def test_failures_end_with_the_two_commands_that_retry_them(tmp_path, monkeypatch):
    result, config, rows = _invoke(tmp_path, monkeypatch, Tally(total=3, done=3, failed=2))
    assert result.exit_code == 1
    assert "2 rollouts failed; to run them again" in result.output
    assert (f"gymflow collect {rows} --env one_word --model policy -n 1 --run-id r1 --config {config} "
            "--retry-failed") in result.output
    assert f"gymflow resume r1 --config {config}" in result.output


def test_ctrl_c_says_the_rollouts_keep_running_and_how_to_reattach(tmp_path, monkeypatch):
    result, _, rows = _invoke(tmp_path, monkeypatch, KeyboardInterrupt())
    assert result.exit_code == 130
    assert "Aborted!" not in result.output and "Traceback" not in result.output
    assert "the rollouts of run 'r1' keep running in Temporal" in result.output
    assert f"Rerun to re-attach: gymflow collect {rows} --env one_word" in result.output


def test_no_failures_no_hint(tmp_path, monkeypatch):
    result, _, _ = _invoke(tmp_path, monkeypatch, Tally(total=1, done=1))
    assert result.exit_code == 0 and "retry" not in result.output

"""What `gymflow demo` prints after its run, without a stack: the transcripts' lines and the next commands, each
of which must exist with the options it is printed with (tests/test_up.py runs the demo itself)."""

from __future__ import annotations

import shlex

import click
import pytest
import yaml
from click.testing import CliRunner

from gymflow.cli.demo_cmd import next_steps, transcript_lines
from gymflow.cli.main import cli


def _check_command(line: str) -> None:
    """`line` is a gymflow command whose subcommand exists and takes every option and argument given."""
    args = shlex.split(line)
    assert args[0] == "gymflow", line
    command = cli.commands.get(args[1])
    assert isinstance(command, click.Command), f"no command {args[1]!r}: {line}"
    options = {o: p for p in command.params if isinstance(p, click.Option) for o in p.opts}
    arguments = [p for p in command.params if isinstance(p, click.Argument)]
    positional, rest = [], args[2:]
    while rest:
        token = rest.pop(0)
        if token.startswith("-"):
            assert token in options, f"{args[1]} takes no {token}: {line}"
            if not options[token].is_flag:
                assert rest and not rest[0].startswith("-"), f"{token} needs a value: {line}"
                rest.pop(0)
        else:
            positional.append(token)
    assert len(positional) == len(arguments), f"{args[1]} takes {len(arguments)} arguments: {line}"


@pytest.mark.parametrize("flag", ["", "--scripted", "--local-model"])
@pytest.mark.parametrize("kept", [False, True])
def test_next_steps_are_three_commands_that_exist(flag, kept):
    lines = next_steps("demo-single_tool", "single_tool", flag, "my config.yaml",
                       ".gymflow/up-config.yaml" if flag else None, kept=kept)
    commands = [line.strip() for line in lines if line.strip().startswith("gymflow ")]
    assert len(commands) == 3, lines
    for command in commands:
        _check_command(command)
    by_name = {shlex.split(c)[1]: c for c in commands}
    assert by_name["report"] == "gymflow report demo-single_tool --config 'my config.yaml'"
    assert by_name["up"] == shlex.join(["gymflow", "up", *([flag] if flag else []), "--config", "my config.yaml"])
    collect_config = ".gymflow/up-config.yaml" if flag else "my config.yaml"
    assert by_name["collect"] == shlex.join(["gymflow", "collect", "your.jsonl", "--env", "single_tool", "--model",
                                             "policy", "--config", collect_config])
    # Without --keep the stack is down: `up` comes first, the others run beside it.
    assert [shlex.split(c)[1] for c in commands] == (["report", "collect", "up"] if kept else
                                                     ["up", "report", "collect"])


def test_next_steps_without_a_config_name_none():
    commands = [line.strip() for line in next_steps("demo-x", "x") if line.strip().startswith("gymflow ")]
    assert commands == ["gymflow up", "gymflow report demo-x", "gymflow collect your.jsonl --env x --model policy"]


def test_transcript_lines_are_role_content_cut_short():
    transcript = [
        {"role": "system", "content": "You are helpful. " * 40},
        {"role": "user", "content": "line one\nline two"},
        {"role": "assistant", "content": None, "reasoning_content": "think " * 100,
         "tool_calls": [{"id": "c1", "function": {"name": "get_weather", "arguments": '{"city": "SF"}'}}]},
        {"role": "tool", "name": "get_weather", "tool_call_id": "c1", "content": "x" * 5000},
        {"role": "assistant", "content": "\n".join(f"row {i}" for i in range(50))},
        {"role": "assistant", "content": ""},
    ]
    lines = transcript_lines(transcript)
    text = "\n".join(lines)
    assert lines[0].startswith("  system: You are helpful.") and "more characters]" in lines[0]
    assert len(lines[0]) < 200, lines[0]
    assert lines[1:3] == ["  user: line one", "      line two"]
    assert lines[3].startswith("  assistant (reasoning): think") and "more characters]" in lines[3]
    assert lines[4] == '  assistant: -> get_weather({"city": "SF"})'
    assert lines[5].startswith("  tool get_weather: xxx") and "more characters]" in lines[5]
    assert len(lines[5]) < 400
    assert "row 5" in text and "row 6" not in text  # at most 6 lines a message
    assert lines[-1] == "  assistant: (empty)"


def test_up_takes_one_model_flag(tmp_path):
    config = tmp_path / "gymflow.yaml"
    config.write_text(yaml.safe_dump({"state_dir": str(tmp_path / "state")}))
    result = CliRunner().invoke(cli, ["up", "--scripted", "--local-model", "--config", str(config)])
    assert result.exit_code == 2 and "give one" in result.output, result.output
    assert not (tmp_path / "state").exists()  # nothing started

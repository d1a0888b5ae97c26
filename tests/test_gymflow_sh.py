"""The README opens with two commands: `./gymflow.sh demo` and `.ci/run`, which ends in `./gymflow.sh test`."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "gymflow.sh"


def test_the_readme_opens_with_the_two_commands():
    block = re.search(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert block
    commands = [line.split("#")[0].strip() for line in block.group(1).splitlines() if line.split("#")[0].strip()]
    assert commands == ["./gymflow.sh demo", ".ci/run"]
    assert "exec ./gymflow.sh test" in (ROOT / ".ci" / "run").read_text()


def test_the_script_runs_from_any_directory(tmp_path):
    done = subprocess.run([str(SCRIPT), "gymflow", "--help"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert "Usage: gymflow" in done.stdout


def test_an_unknown_command_says_what_the_script_does(tmp_path):
    done = subprocess.run([str(SCRIPT), "deploy"], cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert "usage: ./gymflow.sh demo|test|install|gymflow" in done.stderr


def test_a_second_install_is_a_no_op(tmp_path):
    """CI has installed already (`.ci/run` runs `./gymflow.sh install` first): the stamp matches, nothing runs."""
    done = subprocess.run([str(SCRIPT), "install"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    again = subprocess.run([str(SCRIPT), "install"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "+ " not in again.stderr and "up to date" in again.stderr, again.stderr

"""The README's two commands as a newcomer runs them: in a fresh clone of the repository, from another directory.

The clone reuses the installed `.venv` (CI's wheel cache stands in for a first install, which `.ci/run` itself does
from a clean clone): `./gymflow.sh` must find it up to date and run the clone's own code. `./gymflow.sh demo` is
run on the real local model (one sample per task, to keep the suite short); `./gymflow.sh test` runs ruff over the
clone and one test, since the whole suite is what is running this."""

from __future__ import annotations

import hashlib
import os
import subprocess

import pytest
import yaml
from gymflow.workers.local_stack import free_port

from tests.conftest import ROOT
from tests.test_grpo_example import _skip_reason

TORCH = "torch==2.13.0"  # gymflow.sh's pin: part of its install stamp


def _fresh_clone(tmp_path) -> tuple:
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True, timeout=120)
    # Only where the installed venv is the committed pyproject's (always so in CI): otherwise gymflow.sh would
    # reinstall into the shared venv through the link.
    key = f"{hashlib.sha256((clone / 'pyproject.toml').read_bytes()).hexdigest()[:16]} {TORCH}"
    stamp = ROOT / ".venv" / ".gymflow-install"
    if not stamp.exists() or stamp.read_text().splitlines()[0] != key:
        pytest.skip("the installed .venv is not of the committed pyproject.toml (commit it, then ./gymflow.sh install)")
    (clone / ".venv").symlink_to(ROOT / ".venv")
    (tmp_path / "shared").symlink_to(ROOT.parent / "shared")  # beside the clone, as CI has it
    env = {k: v for k, v in os.environ.items()
           if k not in ("TEMPORAL_ADDRESS", "DATABASE_URL", "GYMFLOW_CONFIG", "COLUMNS", "VIRTUAL_ENV")}
    env["PYTHONPATH"] = str(clone)  # the clone's packages before the editable install's (which are ROOT's)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    return clone, env, elsewhere


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(600)
def test_the_first_command_runs_the_demo_on_the_local_model(tmp_path):
    if reason := _skip_reason():
        pytest.skip(reason)
    os.chmod(tmp_path, 0o755)
    clone, env, elsewhere = _fresh_clone(tmp_path)
    config = tmp_path / "gymflow.yaml"  # only ports and a state dir: beside other tests' stacks
    config.write_text(yaml.safe_dump({"state_dir": str(tmp_path / "state"),
                                      "temporal": {"port": free_port(), "ui_port": free_port()}}))
    done = subprocess.run([str(clone / "gymflow.sh"), "demo", "-n", "1"], cwd=elsewhere,
                          env={**env, "GYMFLOW_CONFIG": str(config)}, capture_output=True, text=True, timeout=540)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-6000:]
    assert "gymflow.sh: .venv is up to date" in out, out[-6000:]
    assert "starting the local model" in out, out[-6000:]
    written = yaml.safe_load((tmp_path / "state" / "demo-config.yaml").read_text())
    policy = written["models"]["policy"]
    assert policy["model"] == "SmolLM2-135M-Instruct" and policy["return_token_ids"] and policy["logprobs"]
    lines = out.splitlines()
    # A transcript (best and worst rollout), the report, the next three commands.
    assert "best rollout of the run: demo-single_tool/" in out and "worst rollout of the run" in out, out[-6000:]
    assert any(line.startswith("  user: ") for line in lines), out[-6000:]
    assert "Scores (run_scores) of run demo-single_tool" in out and "solved tasks" in out, out[-6000:]
    assert any(line.startswith("  gymflow report demo-single_tool") for line in lines), out[-6000:]
    assert any(line.startswith("  gymflow up --local-model") for line in lines), out[-6000:]
    assert any(line.startswith("  gymflow collect your.jsonl --env single_tool --model policy") for line in lines)


def test_the_second_command_lints_and_tests_the_clone(tmp_path):
    clone, env, elsewhere = _fresh_clone(tmp_path)
    done = subprocess.run([str(clone / "gymflow.sh"), "test", "-n", "0", "-p", "no:cacheprovider",
                           "tests/test_gymflow_sh.py::test_the_readme_opens_with_the_two_commands"],
                          cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-6000:]
    assert "+ .venv/bin/ruff check ." in out and "All checks passed!" in out, out[-6000:]
    assert "1 passed" in out, out[-6000:]

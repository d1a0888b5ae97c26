"""`gymflow env nemo-gym-install`: servers' own requirements, refused by name where they cannot install offline."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from gymflow.environments import nemo_gym_catalogue as catalogue
from gymflow.environments import nemo_gym_install as install

from gymflow.cli.main import cli
from gymflow.kernel.errors import ConfigError


def _py() -> Path:
    try:
        return catalogue.python()
    except ConfigError as e:
        pytest.skip(f"no NeMo Gym venv: {e}")


def test_a_server_whose_requirements_come_from_git_is_refused_before_any_install() -> None:
    py = _py()
    remote = next((i.name for i in catalogue.catalogue(py).values() if catalogue.requirements(i.folder)[1]), None)
    assert remote is not None, "NeMo Gym 0.7.0 ships servers with git requirements (aviary)"
    result = CliRunner().invoke(cli, ["env", "nemo-gym-install", "arc_agi", remote, "--python", str(py)])
    assert result.exit_code == 1
    assert f"{remote}: its requirements.txt needs packages from a URL or path" in result.output
    assert "pip install" not in result.output  # refused before arc_agi's (empty) install was even reported


def test_an_unknown_server_is_named_with_close_matches() -> None:
    with pytest.raises(ConfigError, match=r"'arc_agx' is not installed in .*similar: arc_agi"):
        install.server_requirements("arc_agx", _py())


def test_a_server_that_needs_nothing_more_runs_no_pip(capsys: pytest.CaptureFixture[str]) -> None:
    py = _py()
    bare = next(i.name for i in catalogue.catalogue(py).values() if not any(catalogue.requirements(i.folder)))
    assert install.install_servers([bare], py) == py
    assert capsys.readouterr().out.strip() == f"{bare}: needs nothing beyond nemo-gym"


def test_a_failed_pip_call_says_which_server_and_why() -> None:
    failing = [sys.executable, "-c", "import sys; sys.stderr.write('WARNING: x is ignored: it is neither a file "
               "nor a directory\\nERROR: No matching distribution found for nopkg==9\\n'); sys.exit(1)"]
    with pytest.raises(ConfigError, match=r"^demo: pip install nopkg==9 failed \(exit 1\): ERROR: No matching "
                                          r"distribution found for nopkg==9$"):
        install._run(failing, "demo: pip install nopkg==9", 30)
    with pytest.raises(ConfigError, match=r"no result within 1 s"):
        install._run([sys.executable, "-c", "import time; time.sleep(30)"], "slow", 1)


def test_a_missing_venv_without_pyenv_313_says_where_it_looked(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path / "pyenv"))
    with pytest.raises(ConfigError, match=r"no Python 3.13 under .*pyenv/versions"):
        install.ensure_venv(tmp_path / "venv" / "bin" / "python", say=lambda _: None)

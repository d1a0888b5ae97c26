"""Make NeMo Gym's venv and install resources servers' own requirements into it (`gymflow env nemo-gym-install`).

NeMo Gym builds a venv per server with uv at start-up, from the network. gymflow instead installs once, ahead of
time, from the package index (the only network these machines have): the venv (Python 3.13 from pyenv, nemo-gym
0.7.0) if it is missing, then each named server's `requirements.txt` lines that name index packages. Lines that
point at a git repository, a URL or a path are refused by name: they cannot install offline. Every pip call is
bounded by a timeout.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from gymflow.environments import nemo_gym_catalogue as catalogue

from gymflow.kernel.errors import ConfigError

NEMO_GYM = "nemo-gym==0.7.0"
PIP_TIMEOUT_S = 1800.0  # one pip call; a wheel build from source (rdkit's, say) takes minutes, not hours
VENV_TIMEOUT_S = 120.0


def pyenv_python313() -> Path:
    """The newest Python 3.13 under pyenv, or a ConfigError saying where it looked."""
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    found = sorted(root.glob("3.13*/bin/python"))
    if not found:
        raise ConfigError(f"no Python 3.13 under {root} (NeMo Gym needs one): `pyenv install 3.13` or set "
                          f"${catalogue.PYTHON_ENV} to a Python 3.13 with nemo-gym installed")
    return found[-1]


def _run(cmd: Sequence[str], what: str, timeout_s: float) -> None:
    try:
        done = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise ConfigError(f"{what}: no result within {timeout_s:.0f} s") from None
    except OSError as e:
        raise ConfigError(f"{what}: cannot run {cmd[0]}: {e.strerror or e}") from None
    if done.returncode != 0:
        lines = [ln for ln in (done.stderr or done.stdout).splitlines() if ln.strip()
                 and "is ignored: it is neither a file nor a directory" not in ln]
        raise ConfigError(f"{what} failed (exit {done.returncode}): " + " | ".join(lines[-4:]))


def ensure_venv(python: Path | None = None, say: Callable[[str], None] = print) -> Path:
    """NeMo Gym's interpreter: `python` (default: $GYMFLOW_NEMO_GYM_PYTHON, else .nemo313), created with nemo-gym
    installed where it does not exist yet."""
    py = python or Path(os.environ.get(catalogue.PYTHON_ENV) or catalogue.REPO_VENV)
    if py.exists():
        return py
    venv = py.parent.parent
    base = pyenv_python313()
    say(f"creating NeMo Gym's venv at {venv} from {base}")
    _run([str(base), "-m", "venv", str(venv)], f"creating {venv}", VENV_TIMEOUT_S)
    say(f"installing {NEMO_GYM} into {venv} (a few minutes)")
    _run([str(py), "-m", "pip", "install", "-q", "--ignore-requires-python", NEMO_GYM],
         f"installing {NEMO_GYM} into {venv}", PIP_TIMEOUT_S)
    return py


def server_requirements(name: str, py: Path) -> list[str]:
    """The index packages server `name` needs beyond nemo-gym; a ConfigError for lines that cannot install
    offline (git, URL, path)."""
    plain, remote = catalogue.requirements(catalogue.server(name, py).folder)
    if remote:
        raise ConfigError(f"{name}: its requirements.txt needs packages from a URL or path ({', '.join(remote)}), "
                          "which cannot install offline")
    return plain


def install_servers(names: Sequence[str], python: Path | None = None,
                    say: Callable[[str], None] = print) -> Path:
    """Install every named server's requirements into NeMo Gym's venv (made first if missing), one pip call per
    server so a failure names its server. Returns the interpreter."""
    py = ensure_venv(python, say)
    wanted = {name: server_requirements(name, py) for name in names}  # refuse before installing anything
    for name, reqs in wanted.items():
        if not reqs:
            say(f"{name}: needs nothing beyond nemo-gym")
            continue
        say(f"{name}: pip install {' '.join(reqs)}")
        _run([str(py), "-m", "pip", "install", "-q", *reqs], f"{name}: pip install {' '.join(reqs)}",
             PIP_TIMEOUT_S)
    catalogue.forget_installed()
    return py

"""The floors of docs/architecture.md, checked by import-linter's contracts in pyproject.toml.

import-linter (grimp) finds a package's modules by walking its folder, and gymflow.workflows & co. live in the
design's top-level folders (mapped by setuptools' package-dir). So the check runs on a tree of symlinks that
puts each folder where its installed name says."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAPPED = ("workflows", "activities", "environments", "workers")


def _installed_layout(into: Path) -> Path:
    pkg = into / "gymflow"
    pkg.mkdir()
    for entry in (ROOT / "gymflow").iterdir():
        if entry.name != "__pycache__":
            (pkg / entry.name).symlink_to(entry)
    for name in MAPPED:
        (pkg / name).symlink_to(ROOT / name)
    (into / "pyproject.toml").symlink_to(ROOT / "pyproject.toml")
    return into


def test_floors_only_look_down(tmp_path):
    tree = _installed_layout(tmp_path)
    proc = subprocess.run([sys.executable, "-c", "from importlinter.cli import lint_imports_command; "
                           "lint_imports_command(['--no-cache'])"],
                          cwd=tree, env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "2 kept, 0 broken" in proc.stdout


def test_scripts_outside_the_package_use_no_test_or_cli_internals():
    """bench/ and examples/ are what a user would write: they import gymflow, never tests or CLI modules."""
    offenders = []
    for folder in ("bench", "examples"):
        for path in (ROOT / folder).rglob("*.py"):
            for n, line in enumerate(path.read_text().splitlines(), 1):
                stripped = line.strip()
                if re.match(r"(from|import) (tests|gymflow\.cli)\b", stripped):
                    offenders.append(f"{path.relative_to(ROOT)}:{n}: {stripped}")
    assert not offenders, "\n".join(offenders)

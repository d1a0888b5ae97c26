"""`gymflow env new NAME`: write an installable environment plug-in package with its tests and example data."""

from __future__ import annotations

import keyword
import re
from importlib.resources import files
from pathlib import Path
from string import Template

from gymflow.kernel.errors import GymflowError

_NAME = re.compile(r"[a-z][a-z0-9_]{0,47}")

# template file -> path in the new package ($package is the import package's name)
_FILES = {
    "pyproject.toml.tmpl": "pyproject.toml",
    "README.md.tmpl": "README.md",
    "init.py.tmpl": "$package/__init__.py",
    "environment.py.tmpl": "$package/environment.py",
    "test.py.tmpl": "tests/test_$name.py",
    "example.jsonl.tmpl": "data/example.jsonl",
}


def check_name(name: str, installed: set[str]) -> None:
    """Refuse a name that cannot be an entry point, a module and a class, or that is already taken."""
    if not _NAME.fullmatch(name) or keyword.iskeyword(name):
        raise GymflowError(f"environment name {name!r}: use a lowercase Python identifier of at most 48 characters "
                           "(letters, digits, underscores; starting with a letter), e.g. 'my_env'")
    if name in installed:
        raise GymflowError(f"environment name {name!r} is already installed (`gymflow env list`); choose another")


def names_for(name: str) -> dict[str, str]:
    cls = "".join(part.capitalize() for part in name.split("_") if part) + "Environment"
    return {"name": name, "package": f"gymflow_{name}", "dist": "gymflow-" + name.replace("_", "-"), "cls": cls}


def new_environment(name: str, parent: Path, installed: set[str]) -> Path:
    """Write the package into `parent/NAME`, which must not exist; returns that folder."""
    check_name(name, installed)
    target = parent / name
    if target.exists() or target.is_symlink():
        raise GymflowError(f"{target}: already exists; choose another name or --dir")
    if not parent.is_dir():
        raise GymflowError(f"{parent}: no such folder (--dir must exist)")
    values = names_for(name)
    rendered = {Template(dest).substitute(values): Template(_template(src)).substitute(values)
                for src, dest in _FILES.items()}
    target.mkdir()  # fails if another process made it meanwhile: never write into someone's folder
    for rel, text in rendered.items():
        path = target / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return target


def _template(name: str) -> str:
    return files("gymflow.authoring").joinpath("templates", name).read_text(encoding="utf-8")

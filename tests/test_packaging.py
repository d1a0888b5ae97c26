"""The wheel's package list matches the tree, and nothing installs under a bare top-level name like `workflows`."""

import tomllib
from importlib.metadata import entry_points
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAPPED = {"workflows", "activities", "environments", "workers"}


def _config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_package_in_the_tree_is_listed_under_the_gymflow_name():
    found = set()
    for top in ["gymflow", *sorted(MAPPED)]:
        for init in (ROOT / top).rglob("__init__.py"):
            if "__pycache__" in init.parts:
                continue
            dotted = ".".join(init.parent.relative_to(ROOT).parts)
            found.add(dotted if top == "gymflow" else f"gymflow.{dotted}")
    assert set(_config()["packages"]) == found


def test_top_level_folders_map_under_gymflow():
    mapping = _config()["package-dir"]
    assert mapping == {f"gymflow.{name}": name for name in MAPPED}
    assert all(p == "gymflow" or p.startswith("gymflow.") for p in _config()["packages"])


def test_environment_entry_points_name_installed_modules():
    ours = [ep for ep in entry_points(group="gymflow.environments") if ep.dist and ep.dist.name == "gymflow"]
    assert len(ours) >= 12
    for ep in ours:
        assert ep.value.startswith("gymflow.environments."), ep.value
        assert ep.load().__module__.startswith("gymflow.environments."), ep.value

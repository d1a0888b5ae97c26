"""User-written YAML: an alias bomb, a huge file, deep nesting and malformed input are refused fast, naming
the file and the line."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from gymflow.kernel import safe_yaml
from gymflow.kernel.config import load_settings
from gymflow.kernel.errors import ConfigError
from gymflow.kernel.safe_yaml import MAX_YAML_BYTES, YAMLFileError, load_file, loads
from tests.conftest import ROOT

# "Billion laughs": 9^9 strings from 10 lines; PyYAML's safe_load shares the references, so it is the walks
# after it (interpolation, validation) that blew up: 771 MB and growing after 60 s.
BOMB = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True))

LOADERS = [pytest.param(safe_yaml._PyLoader, id="python")]  # noqa: SLF001 - both parsers must refuse
if hasattr(safe_yaml, "_CLoader"):
    LOADERS.append(pytest.param(safe_yaml._CLoader, id="libyaml"))  # noqa: SLF001


def test_alias_bomb_in_the_config_is_refused_fast_and_small(tmp_path):
    """In a child process with a memory cap, so a regression fails the test instead of the machine."""
    path = tmp_path / "bomb.yaml"
    path.write_text("rollout:\n  max_turns: 8\n" + BOMB)
    child = textwrap.dedent(f"""
        import json, resource, time
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
        from gymflow.kernel.config import load_settings
        before, t = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.perf_counter()
        try:
            load_settings({str(path)!r}, env={{}})
            error = None
        except Exception as e:
            error = f"{{type(e).__name__}}: {{e}}"
        print(json.dumps({{"s": time.perf_counter() - t, "error": error,
                           "grew_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before}}))
    """)
    out = subprocess.run([sys.executable, "-c", child], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["error"] == (f"YAMLFileError: {path}, line 4, column 8: YAML aliases (*a) are not allowed; "
                               "write the value out")
    assert result["s"] < 2 and result["grew_kb"] < 20_000


@pytest.mark.parametrize("loader", LOADERS)
def test_refusals_name_the_line(loader):
    def error(text: str) -> str:
        with pytest.raises(YAMLFileError) as e:
            loads(text, "conf.yaml", loader=loader)
        return str(e.value)

    assert error("a: 1\nb: *a\n") == ("conf.yaml, line 2, column 4: YAML aliases (*a) are not allowed; "
                                      "write the value out")
    assert error("pools:\n  env: 1\n  env: 2\n") == "conf.yaml, line 3, column 3: duplicate key 'env'"
    # the mapping is level 1, so the 64th bracket (column 3 + 64) is level 65
    assert error("x: " + "[" * 200 + "]" * 200) == f"conf.yaml, line 1, column {3 + 64}: nested deeper than 64 levels"
    assert error("port: " + "9" * 5000).startswith("conf.yaml, line 1, column 7: Exceeds the limit (4300 digits)")
    assert error("day: 2001-02-30\n") == "conf.yaml, line 1, column 6: day is out of range for month"
    assert error("a: [1, 2\nb: 3\n").startswith("conf.yaml, line 2, column 2: not valid YAML (while parsing a flow")
    assert error("a: 1\n---\nb: 2\n").startswith("conf.yaml, line 2, column 1: not valid YAML (expected a single")
    assert error("a: \x07\n").startswith("conf.yaml, line 1, column 4: not valid YAML (character #x0007:")
    assert error(b"a: \xff\n").startswith("conf.yaml, line 1, column 4: not valid YAML (character #x00ff:")


@pytest.mark.parametrize("loader", LOADERS)
def test_plain_yaml_still_loads(loader):
    text = "a: &unused 1\nb: {<<: {c: 2}, c: 3}\nd: [x, 'y', 1.5, null, true]\n"
    assert loads(text, loader=loader) == {"a": 1, "b": {"c": 3}, "d": ["x", "y", 1.5, None, True]}
    assert loads(b"\xef\xbb\xbfa: 1\n", loader=loader) == {"a": 1}  # a UTF-8 BOM


def test_file_over_the_size_limit_is_refused_unread(tmp_path):
    path = tmp_path / "big.yaml"
    with open(path, "wb") as f:
        f.truncate(8 << 30)  # sparse: reading it whole would take 8 GiB
    with pytest.raises(ConfigError, match=rf"^{path}: larger than 1,048,576 bytes, the limit for a YAML file$"):
        load_settings(path, env={})
    small = tmp_path / "small.yaml"
    small.write_text("a: 12345\n")  # 9 bytes
    assert load_file(small, max_bytes=9) == {"a": 12345}
    with pytest.raises(YAMLFileError, match="larger than 8 bytes"):
        load_file(small, max_bytes=8)
    assert MAX_YAML_BYTES == 1 << 20


def test_unreadable_file_names_it(tmp_path):
    with pytest.raises(YAMLFileError, match=rf"^{tmp_path}: cannot read: Is a directory$"):
        load_file(tmp_path)


def test_config_syntax_error_names_the_file_not_a_string(tmp_path):
    path = tmp_path / "g.yaml"
    path.write_text("models:\n  policy:\n    base_url: [u\n")
    with pytest.raises(ConfigError) as e:
        load_settings(path, env={})
    assert str(e.value).startswith(f"{path}, line 4, column 1: not valid YAML (while parsing a flow sequence")
    assert "<unicode string>" not in str(e.value)


def test_example_config_loads_through_the_safe_loader():
    raw = load_file(ROOT / "gymflow.example.yaml")
    assert raw["rollout"]["limits"]["generate"]["start_to_close_s"] == 600
    assert load_settings(ROOT / "gymflow.example.yaml", env={}).rollout.limits.persist.max_attempts == 20

"""Attacks on the local model server's control endpoint (`POST /v1/load_weights`): whoever swaps the weights
chooses the policy every rollout is sampled from. It needs the control token, reads only under the weights
root, and answers a path outside the root the same way whether or not it exists.

The model here is a tiny random Llama (saved and loaded for real by transformers), behind a stand-in for
the engine: these tests are about who may load what, not about generation (tests/test_local_model.py)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gymflow.localmodel import control

transformers = pytest.importorskip("transformers")
pytest.importorskip("torch")

VOCAB = 32


def tiny_model() -> Any:
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32)
    return transformers.LlamaForCausalLM(cfg).eval()


class TinyEngine:
    """What load_weights touches of `Engine`: the served model's vocab, the version, and the swap."""

    name, context = "tiny", 32

    def __init__(self) -> None:
        self.model, self.version = tiny_model(), "v0"

    def swap(self, model: Any, version: str) -> None:
        self.model, self.version = model, version


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("control")
    root, outside = base / "weights", base / "outside"
    root.mkdir()
    outside.mkdir()
    tiny_model().save_pretrained(root / "good")
    tiny_model().save_pretrained(outside / "real")  # a genuine checkpoint, just not under the root
    (root / "escape").symlink_to(outside / "real")  # a directory symlink that leads out
    (root / "mixed").mkdir()  # a checkpoint whose weights file is a symlink to one outside
    (root / "mixed" / "config.json").write_bytes((root / "good" / "config.json").read_bytes())
    (root / "mixed" / "model.safetensors").symlink_to(outside / "real" / "model.safetensors")
    return {"root": root, "outside": outside}


@pytest.fixture(scope="module")
def server(dirs: dict[str, Path]) -> Iterator[Any]:
    from gymflow.localmodel.server import LocalModelServer

    srv = LocalModelServer(TinyEngine(), weights_root=dirs["root"]).start()  # type: ignore[arg-type]
    yield srv
    srv.stop()


def post(server: Any, body: Any, authorization: str | None = None) -> httpx.Response:
    headers = {"Authorization": authorization} if authorization is not None else {}
    return httpx.post(server.base_url + "/load_weights", json=body, headers=headers, timeout=60)


def bearer(server: Any) -> str:
    return f"Bearer {server.control_token}"


def test_the_right_token_loads_weights_from_under_the_root(server: Any, dirs: dict[str, Path]) -> None:
    r = post(server, {"path": "good", "version": "v1"}, bearer(server))
    assert r.status_code == 200 and r.json()["policy_version"] == "v1", r.text
    r = post(server, {"path": str(dirs["root"] / "good"), "version": "v2"}, bearer(server))  # absolute
    assert r.status_code == 200 and server.engine.version == "v2", r.text


@pytest.mark.parametrize("header", [
    lambda t: None, lambda t: "Bearer", lambda t: "Bearer " + "x" * 43, lambda t: f"Basic {t}", lambda t: t,
    lambda t: f"Bearer {t[:-1]}", lambda t: f"Bearer {t}x", lambda t: f"Bearerx {t}", lambda t: f"Bearer {t.upper()}",
], ids=["none", "scheme only", "wrong", "basic", "no scheme", "prefix", "longer", "bad scheme", "case"])
def test_no_or_wrong_token_is_refused_before_the_body_is_read(server: Any, header: Any) -> None:
    before = server.engine.version
    r = post(server, {"path": "good", "version": "hijacked"}, header(server.control_token))
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
    assert server.engine.version == before


def test_paths_outside_the_root_get_one_answer_whether_they_exist_or_not(server: Any, dirs: dict[str, Path]) -> None:
    outside = dirs["outside"]
    probes = [str(outside / "real"), str(outside / "does-not-exist"), "/etc", "/nonexistent/at/all",
              "../outside/real", "good/../../outside/real", "escape", "mixed", "/", "\0etc", "a" * 10_000]
    answers = set()
    for path in probes:
        r = post(server, {"path": path, "version": "evil"}, bearer(server))
        assert r.status_code == 400, (path, r.text)
        answers.add(r.json()["error"]["message"])
    assert answers == {control._OUTSIDE}
    assert server.engine.version != "evil"


def test_inside_the_root_the_errors_still_name_the_problem(server: Any) -> None:
    r = post(server, {"path": "missing", "version": "v9"}, bearer(server))
    assert r.status_code == 400 and "not a directory under the weights root" in r.json()["error"]["message"]


def test_without_a_weights_root_load_weights_is_refused() -> None:
    from gymflow.localmodel.server import LocalModelServer

    with LocalModelServer(TinyEngine()) as srv:  # type: ignore[arg-type]
        r = post(srv, {"path": "/anything", "version": "v1"}, bearer(srv))
    assert r.status_code == 403 and "--weights-root" in r.json()["error"]["message"]


def test_the_server_listens_on_loopback_by_default_and_for_an_empty_host(server: Any) -> None:
    from gymflow.localmodel.server import LocalModelServer

    assert server.server_address[0] == "127.0.0.1"
    with LocalModelServer(TinyEngine(), host="") as srv:  # type: ignore[arg-type]
        assert srv.server_address[0] == "127.0.0.1"  # not every interface, as bind("") would be


# ---- the token file ----------------------------------------------------------------------------------------


def test_the_token_file_is_private_and_others_copies_are_refused(tmp_path: Path) -> None:
    path = control.write_token_file(tmp_path / "state" / "localmodel.token")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    token = control.read_token_file(path)
    assert len(token) >= 32 and control.read_token_file(control.write_token_file(path)) != token  # fresh each time
    path.chmod(0o644)
    with pytest.raises(ValueError, match="readable by others"):
        control.read_token_file(path)
    link = tmp_path / "link.token"
    path.chmod(0o600)
    link.symlink_to(path)
    with pytest.raises(ValueError, match="cannot read"):  # O_NOFOLLOW: a planted symlink is not trusted
        control.read_token_file(link)
    short = tmp_path / "short.token"
    short.write_text("abc")
    short.chmod(0o600)
    with pytest.raises(ValueError, match="shorter than 32"):
        control.read_token_file(short)


def test_writing_a_token_over_a_planted_symlink_replaces_it(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep")
    planted = tmp_path / "localmodel.token"
    planted.symlink_to(victim)
    control.write_token_file(planted)
    assert victim.read_text() == "keep" and not planted.is_symlink()


def test_the_server_refuses_to_start_with_a_readable_token_file(tmp_path: Path) -> None:
    token = tmp_path / "t"
    token.write_text("x" * 40)
    token.chmod(0o644)
    done = subprocess.run([sys.executable, "-m", "gymflow.localmodel", "--control-token-file", str(token)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "readable by others" in done.stderr, done.stderr


def test_the_launcher_passes_a_token_file_never_the_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gymflow.localmodel import launch

    seen: list[list[str]] = []

    class Refused(Exception):
        pass

    def popen(cmd: list[str], **_: Any) -> Any:
        seen.append(cmd)
        raise Refused

    monkeypatch.setattr(launch.subprocess, "Popen", popen)
    with pytest.raises(Refused):
        launch.start_subprocess(["--threads", "1"], state_dir=tmp_path)
    cmd = seen[0]
    token_file = Path(cmd[cmd.index("--control-token-file") + 1])
    assert token_file.parent == tmp_path and stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert control.read_token_file(token_file) not in " ".join(cmd)
    assert os.stat(tmp_path).st_uid == os.geteuid()

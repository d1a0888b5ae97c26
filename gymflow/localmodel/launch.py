"""Start the local model server in this process (on threads) or as a child process."""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gymflow.localmodel.control import read_token_file, write_token_file
from gymflow.localmodel.resolve import DEFAULT_NAME, check_runtime, default_gguf

if TYPE_CHECKING:  # torch is imported only when a model is built
    from gymflow.localmodel.engine import Engine
    from gymflow.localmodel.server import LocalModelServer

READY_PREFIX = "gymflow-localmodel listening on "


def build_engine(model: str | None = None, gguf_file: str | None = None, version: str = "v0",
                 name: str | None = None) -> Engine:
    """The default is the bundled SmolLM2 GGUF; `model` may be a HF directory or a directory holding `gguf_file`."""
    check_runtime()
    from gymflow.localmodel.engine import Engine

    if model is None:
        source, gguf_file = default_gguf()
        name = name or DEFAULT_NAME
    else:
        source = Path(model)
        if not source.is_dir():
            raise FileNotFoundError(f"--model {model!r} is not a directory")
    return Engine.from_source(source, gguf_file, version, name or source.name)


def load_float_model(model: str | None = None, gguf_file: str | None = None) -> Any:
    """The served model as a float32 torch module that `save_pretrained` can write (for a trainer): the bundled
    SmolLM2 GGUF by default, or a HF directory / a directory holding `gguf_file`."""
    check_runtime()
    from gymflow.localmodel.engine import load_model

    if model is None:
        source, gguf_file = default_gguf()
        return load_model(source, gguf_file)
    return load_model(Path(model), gguf_file)


def start_in_thread(host: str = "127.0.0.1", port: int = 0, weights_root: str | Path | None = None,
                    **engine_kw: str | None) -> LocalModelServer:
    """A started `LocalModelServer` (stop it with `.stop()`; its load_weights token is `.control_token`);
    loading the model takes ~10-25 s on 2 cores."""
    from gymflow.localmodel.server import LocalModelServer

    return LocalModelServer(build_engine(**engine_kw), host=host, port=port, weights_root=weights_root).start()


class LocalModelProcess:
    """A server child process: `base_url`, and `control_token` (from `token_file`) for load_weights."""

    def __init__(self, proc: subprocess.Popen, base_url: str, token_file: Path) -> None:
        self.proc = proc
        self.base_url = base_url
        self.token_file = token_file
        self.control_token = read_token_file(token_file)

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=timeout_s)
        with contextlib.suppress(OSError):
            self.token_file.unlink()  # the token dies with its server

    def __enter__(self) -> LocalModelProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_subprocess(args: list[str] | None = None, timeout_s: float = 180.0,
                     state_dir: str | Path = ".gymflow") -> LocalModelProcess:
    """`python -m gymflow.localmodel --port 0 ARGS` in a child process; returns once it listens. Its control
    token is written to a file of its own in `state_dir` (mode 0600), removed when it stops."""
    token_file = write_token_file(Path(state_dir) / f"localmodel-{secrets.token_hex(6)}.token")
    cmd = [sys.executable, "-m", "gymflow.localmodel", "--port", "0", "--control-token-file", str(token_file),
           *(args or [])]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    found: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(READY_PREFIX):
                found.append(line[len(READY_PREFIX):].strip())
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout_s)
    if not found:
        handle = LocalModelProcess(proc, "", token_file)
        handle.stop()
        err = proc.stderr.read()[-2000:] if proc.stderr else ""
        raise RuntimeError(f"the local model server did not start within {timeout_s:.0f}s "
                           f"(exit code {proc.returncode}): {err}")
    # Drain stderr so that a chatty child never blocks on a full pipe.
    threading.Thread(target=lambda: proc.stderr and proc.stderr.read(), daemon=True).start()
    time.sleep(0)
    return LocalModelProcess(proc, found[0], token_file)

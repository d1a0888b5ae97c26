"""gymflow's sandbox as a NeMo Gym sandbox provider: `sandbox_provider: {gymflow: {python: ...}}`.

Runs inside a NeMo Gym resources server (NeMo Gym's Python, not gymflow's): environments/nemo_gym_launch.py
registers it (`nemo_gym.sandbox.providers.registry.register_provider`) before it runs the server's app.py, when the
server's config names it. gymflow's managed servers name it for a server whose config configures a provider in
place (litmus_agent's code-exec tool), as NeMo Gym's own providers (opensandbox, docker, ...) need a service or a
network this machine does not have.

Each `exec` is one process of gymflow's Python (`python -m gymflow.environments.nemo_gym_sandbox_exec`) that runs
the command in gymflow's bubblewrap sandbox: no network, the host's /usr read-only, private /tmp, rlimits, a
memory and pids cgroup where there is one, the wall clock of the call's `timeout_s`. Limits of the stand-in:
- no container images: it stands in for the images in `stands_in_for` (plain Python ones by default, whose
  programs the host's /usr runs) and refuses any other at `create` (SandboxCreateError, naming the image);
- the files the server uploads (and the spec's `files`) are restored before every command; what a command
  writes does not persist to the next one, and only uploaded files can be downloaded;
- `user` is ignored (the sandbox runs as nobody).
"""

import asyncio
import base64
import contextlib
import fnmatch
import json
import os
import shutil
import signal
import tempfile
import uuid
from pathlib import Path
from typing import Any

from nemo_gym.sandbox.providers.base import (
    SandboxCreateError,
    SandboxExecResult,
    SandboxHandle,
    SandboxSpec,
    SandboxStatus,
)

NAME = "gymflow"
EXEC_MODULE = "gymflow.environments.nemo_gym_sandbox_exec"
STANDS_IN_FOR = ("python:*", "docker.io/library/python:*")
RUNTIME_FAILURE = 125
MAX_FILE_BYTES = 16 * 1024 * 1024
MAX_FILES = 64
ANSWER_GRACE_S = 30.0  # beyond the command's own timeout: gymflow's Python starting, the sandbox set up
MAX_ANSWER_BYTES = 16 * 1024 * 1024
_DROPPED_ENV = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "NEMO_GYM_CONFIG_DICT", "NEMO_GYM_CONFIG_PATH")


def _failure(message: str, error_type: str = "error") -> SandboxExecResult:
    return SandboxExecResult(stdout="", stderr=f"gymflow sandbox: {message}", return_code=RUNTIME_FAILURE,
                             error_type=error_type)


class GymflowSandboxProvider:
    name = NAME

    def __init__(self, python: str, stands_in_for: list[str] | None = None, memory_mib: int = 1024,
                 default_timeout_s: float = 180.0) -> None:
        if not python or not os.access(python, os.X_OK):
            raise ValueError(f"sandbox_provider.gymflow.python: {python!r} is not an executable Python")
        self.python = python
        self.stands_in_for = tuple(stands_in_for) if stands_in_for else STANDS_IN_FOR
        self.memory_mib = int(memory_mib)
        self.default_timeout_s = float(default_timeout_s)
        self._open: dict[str, dict[str, Any]] = {}

    async def create(self, spec: SandboxSpec) -> SandboxHandle:
        if spec.image and not any(fnmatch.fnmatchcase(spec.image, p) for p in self.stands_in_for):
            raise SandboxCreateError(
                f"gymflow's sandbox runs the host's /usr, not container images: it stands in for "
                f"{', '.join(self.stands_in_for)} only, not {spec.image!r}")
        sandbox_id = f"gymflow-{uuid.uuid4().hex[:12]}"
        memory = spec.resources.memory_mib if getattr(spec.resources, "memory_mib", None) else self.memory_mib
        self._open[sandbox_id] = {"root": tempfile.mkdtemp(prefix=f"{sandbox_id}-"), "files": {},
                                  "workdir": spec.workdir or "/tmp", "env": dict(spec.env or {}),
                                  "memory_mib": int(memory)}
        return SandboxHandle(sandbox_id=sandbox_id, provider_name=NAME, raw=None)

    def _state(self, handle: SandboxHandle) -> dict[str, Any]:
        state = self._open.get(handle.sandbox_id)
        if state is None:
            raise RuntimeError(f"gymflow sandbox {handle.sandbox_id} is closed")
        return state

    async def upload_file(self, handle: SandboxHandle, source_path: Path, target_path: str) -> None:
        state = self._state(handle)
        if not target_path.startswith(("/tmp/", "/sandbox/")) or "/../" in target_path:
            raise ValueError(f"gymflow sandbox: uploads go under /tmp or /sandbox, not {target_path!r}")
        if Path(source_path).stat().st_size > MAX_FILE_BYTES:
            raise ValueError(f"gymflow sandbox: {target_path} is over {MAX_FILE_BYTES} bytes")
        if target_path not in state["files"] and len(state["files"]) >= MAX_FILES:
            raise ValueError(f"gymflow sandbox: more than {MAX_FILES} files")
        copy = Path(state["root"]) / f"f{len(state['files'])}"
        shutil.copyfile(source_path, copy)
        state["files"][target_path] = str(copy)

    async def download_file(self, handle: SandboxHandle, source_path: str, target_path: Path) -> None:
        state = self._state(handle)
        if source_path not in state["files"]:
            raise FileNotFoundError(f"gymflow sandbox: {source_path} was not uploaded (what a command writes "
                                    "does not persist in gymflow's sandbox)")
        shutil.copyfile(state["files"][source_path], target_path)

    async def exec(self, handle: SandboxHandle, command: str, *, cwd: str | None = None,
                   env: dict[str, str] | None = None, timeout_s: int | float | None = None,
                   user: str | int | None = None) -> SandboxExecResult:
        state = self._state(handle)
        timeout = float(timeout_s) if timeout_s else self.default_timeout_s
        files = {target: base64.b64encode(Path(copy).read_bytes()).decode("ascii")
                 for target, copy in state["files"].items()}
        request = json.dumps({"command": command, "env": {**state["env"], **(env or {})},
                              "cwd": cwd or state["workdir"], "timeout_s": timeout,
                              "memory_mib": state["memory_mib"], "files": files}).encode()
        child_env = {k: v for k, v in os.environ.items() if k not in _DROPPED_ENV}
        proc = await asyncio.create_subprocess_exec(
            self.python, "-m", EXEC_MODULE, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=child_env, start_new_session=True)
        try:
            out, err = await asyncio.wait_for(proc.communicate(request), timeout + ANSWER_GRACE_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
            return _failure(f"no answer within {timeout + ANSWER_GRACE_S:g} s", "timeout")
        if len(out) > MAX_ANSWER_BYTES:
            return _failure("answer too large")
        try:
            answer = json.loads(out)
            return SandboxExecResult(stdout=answer["stdout"], stderr=answer["stderr"],
                                     return_code=int(answer["return_code"]), error_type=answer["error_type"])
        except (ValueError, KeyError, TypeError):
            tail = err.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no output"]
            return _failure(f"{EXEC_MODULE} failed (exit {proc.returncode}): {tail[0][:300]}")

    async def status(self, handle: SandboxHandle) -> SandboxStatus:
        return SandboxStatus.RUNNING if handle.sandbox_id in self._open else SandboxStatus.STOPPED

    async def close(self, handle: SandboxHandle) -> None:
        state = self._open.pop(handle.sandbox_id, None)
        if state is not None:
            shutil.rmtree(state["root"], ignore_errors=True)

    async def aclose(self) -> None:
        for sandbox_id in list(self._open):
            await self.close(SandboxHandle(sandbox_id=sandbox_id, provider_name=NAME, raw=None))

"""One command of a NeMo Gym sandbox, run in gymflow's own sandbox (environments/sandbox: bubblewrap, no network,
rlimits, a memory and pids cgroup where there is one). The provider NeMo Gym's server calls
(environments/nemo_gym_sandbox_provider.py, under NeMo Gym's Python) starts this under gymflow's Python:

    python -m gymflow.environments.nemo_gym_sandbox_exec < request.json

request: {"command": str, "env": {str: str}, "cwd": str | null, "timeout_s": number, "memory_mib": int,
          "files": {absolute path under /tmp or /sandbox: base64 contents}}
answer (stdout, one JSON object): {"stdout", "stderr", "return_code", "error_type"}: NeMo Gym's SandboxExecResult,
with return code 125 and error_type `timeout`, `memory`, `output_limit`, `killed` or `error` when the sandbox ended
the command (125: NeMo Gym's "sandbox runtime failure", not the command's own exit code).

The command runs as `sh -c` inside the sandbox with the files restored to their paths first; each command starts
from the sandbox's files (what a command writes does not persist to the next: the provider's documented limit).
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import sys
from typing import Any

from gymflow.environments.sandbox import Limits, SandboxStatus, get_sandbox

MAX_REQUEST_BYTES = 64 * 1024 * 1024
MAX_TIMEOUT_S = 600.0
MAX_MEMORY_MIB = 8192
RUNTIME_FAILURE = 125  # NeMo Gym's SANDBOX_RUNTIME_RETURN_CODE
WRITABLE = ("/tmp/", "/sandbox/")  # the sandbox's private tmpfs mounts

# Restores the files, then becomes `sh -c command` (same pid: the sandbox's limits and timeout hold for it).
RUNNER = """\
import json, os
spec = json.load(open("request.json"))
for i, target in enumerate(spec["targets"]):
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open("f%d" % i, "rb") as src, open(target, "wb") as dst:
        dst.write(src.read())
os.chdir(spec["cwd"])
os.execve("/bin/sh", ["sh", "-c", spec["command"]], {**os.environ, **spec["env"]})
"""


class BadRequest(ValueError):
    pass


def _checked(request: Any) -> dict[str, Any]:
    if not isinstance(request, dict) or not isinstance(request.get("command"), str):
        raise BadRequest("request: expected an object with a `command` string")
    env = request.get("env") or {}
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) and "=" not in k and k
                                            and "\0" not in k + v for k, v in env.items()):
        raise BadRequest("env: expected an object of name -> string (no NUL, no '=' in names)")
    files = request.get("files") or {}
    if not isinstance(files, dict):
        raise BadRequest("files: expected an object of absolute path -> base64 contents")
    for path in files:
        if not isinstance(path, str) or not path.startswith(WRITABLE) or "/../" in path or path.endswith("/") \
                or "\0" in path:
            raise BadRequest(f"files: {str(path)[:120]!r} is not a file path under /tmp or /sandbox")
    cwd = request.get("cwd") or "/tmp"
    if not isinstance(cwd, str) or not cwd.startswith("/") or "\0" in cwd:
        raise BadRequest("cwd: expected an absolute path")
    timeout = request.get("timeout_s") or 180
    memory = request.get("memory_mib") or 1024
    if not isinstance(timeout, (int, float)) or not math.isfinite(timeout) or timeout <= 0 or \
            not isinstance(memory, int) or memory <= 0:
        raise BadRequest("timeout_s and memory_mib: expected positive numbers")
    if "\0" in request["command"]:
        raise BadRequest("command: contains a NUL byte")
    return {"command": request["command"], "env": env, "cwd": cwd, "files": files,
            "timeout_s": min(float(timeout), MAX_TIMEOUT_S), "memory_mib": min(memory, MAX_MEMORY_MIB)}


async def run(request: dict[str, Any]) -> dict[str, Any]:
    spec = _checked(request)
    targets = list(spec["files"])
    files: dict[str, bytes | str] = {f"f{i}": base64.b64decode(spec["files"][t], validate=True)
                                     for i, t in enumerate(targets)}
    files["request.json"] = json.dumps({"targets": targets, "cwd": spec["cwd"], "command": spec["command"],
                                        "env": spec["env"]})
    limits = Limits(wall_s=spec["timeout_s"], cpu_s=max(1, math.ceil(spec["timeout_s"])),
                    memory_bytes=spec["memory_mib"] << 20, max_procs=32, output_bytes=4 << 20)
    result = await get_sandbox().run_python(RUNNER, files=files, limits=limits)
    if result.status is SandboxStatus.OK:
        return {"stdout": result.stdout, "stderr": result.stderr, "return_code": result.exit_code,
                "error_type": None}
    why = {SandboxStatus.TIMEOUT: f"stopped: over its time limit ({spec['timeout_s']:g} s)",
           SandboxStatus.MEMORY: f"stopped: over its memory limit ({spec['memory_mib']} MiB)",
           SandboxStatus.OUTPUT_LIMIT: f"stopped: over its output limit ({limits.output_bytes} bytes)"}
    note = f"gymflow sandbox: {why.get(result.status, str(result.status))}"
    return {"stdout": result.stdout, "stderr": f"{result.stderr.rstrip()}\n{note}".lstrip(),
            "return_code": RUNTIME_FAILURE, "error_type": str(result.status)}


def main() -> None:
    raw = sys.stdin.buffer.read(MAX_REQUEST_BYTES + 1)
    try:
        if len(raw) > MAX_REQUEST_BYTES:
            raise BadRequest(f"request over {MAX_REQUEST_BYTES} bytes")
        answer = asyncio.run(run(json.loads(raw)))
    except (BadRequest, ValueError) as e:
        answer = {"stdout": "", "stderr": f"gymflow sandbox: {e}", "return_code": RUNTIME_FAILURE,
                  "error_type": "bad_request"}
    except Exception as e:  # noqa: BLE001 - the sandbox itself failed: one line back, never a traceback
        answer = {"stdout": "", "stderr": f"gymflow sandbox: {type(e).__name__}: {str(e)[:500]}",
                  "return_code": RUNTIME_FAILURE, "error_type": "error"}
    sys.stdout.write(json.dumps(answer))


if __name__ == "__main__":
    main()

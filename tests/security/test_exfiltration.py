"""Unit level: the exfiltration corpus runs in `BubblewrapSandbox` from a process whose environment holds a
fake API key and a fake database password; neither may show up in anything a program writes."""

from __future__ import annotations

import asyncio
import os
import uuid

import pytest
from gymflow.environments.sandbox import BubblewrapSandbox, Limits, SandboxResult

from tests.security import requires_bwrap
from tests.security.corpus import PROGRAMS, ran_marker

pytestmark = requires_bwrap

API_KEY = "sk-exfil-unit-" + uuid.uuid4().hex
DB_PASSWORD = "pw-exfil-unit-" + uuid.uuid4().hex
# Generous output caps: the whole search report must come back, not just its tail.
LIMITS = Limits(wall_s=30, cpu_s=20, output_bytes=8 << 20, stderr_bytes=4 << 20)


@pytest.fixture
def secrets_in_env(monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    monkeypatch.setenv("GYMFLOW_EXFIL_API_KEY", API_KEY)
    monkeypatch.setenv("DATABASE_URL", f"postgresql://gymflow:{DB_PASSWORD}@127.0.0.1:5432/gymflow")
    return API_KEY, DB_PASSWORD


async def run_corpus(sandbox: object, names: list[str] | None = None) -> dict[str, SandboxResult]:
    names = names or list(PROGRAMS)
    results = await asyncio.gather(*(sandbox.run_python(PROGRAMS[n], limits=LIMITS) for n in names))  # type: ignore[attr-defined]
    return dict(zip(names, results, strict=True))


async def test_no_program_finds_the_workers_secrets(secrets_in_env: tuple[str, str]) -> None:
    results = await run_corpus(BubblewrapSandbox())
    for name, result in results.items():
        assert ran_marker(name) in result.stderr, (name, result.status, result.stderr[-2000:])  # it really searched
        found = result.stdout + result.stderr
        for secret in secrets_in_env:
            assert secret not in found, f"{name} found a secret: {found[found.index(secret) - 200:][:400]}"
    # Nothing of the worker's environment at all, not only the secrets (its working dir, its PATH).
    environ = results["proc_environ"].stderr
    from_environ = [line for line in environ.splitlines() if line.startswith("FOUND") and "environ:" in line]
    assert from_environ == [] and os.getcwd() not in environ, environ[-3000:]


async def test_the_corpus_finds_secrets_where_they_are_reachable(secrets_in_env: tuple[str, str],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # Control: hand bwrap the worker's environment again (the original bug). The corpus must catch it, or
    # the test above proves nothing.
    leaky = BubblewrapSandbox()
    monkeypatch.setattr(leaky, "_env", lambda staged: dict(os.environ))
    results = await run_corpus(leaky, ["proc_environ", "proc_mem", "proc_root_cwd"])
    for name, result in results.items():
        assert all(s in result.stderr for s in secrets_in_env), (name, result.stderr[-2000:])


async def test_what_the_corpus_tried(secrets_in_env: tuple[str, str]) -> None:
    """The escape routes themselves: each is closed, not merely empty."""
    results = await run_corpus(BubblewrapSandbox(), ["ptrace", "keyring_ipc", "inherited_fds"])
    ptrace = results["ptrace"].stdout
    assert "PTRACE_ATTACH 1: rc=-1 errno=1" in ptrace and "PTRACE_TRACEME: rc=-1 errno=1" in ptrace
    assert "process_vm_readv 1: rc=-1 errno=1" in ptrace and "pidfd_getfd 1: errno=1" in ptrace
    keyring = results["keyring_ipc"].stdout
    assert keyring.count("rc=-1 errno=1") == 7 and "shmat: errno=1" in keyring
    assert "open fds: [0, 1, 2]" in results["inherited_fds"].stdout  # stdin, stdout, stderr and nothing else

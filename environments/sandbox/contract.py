"""The `Sandbox` contract: stage the files, build the command line, run it and classify the result."""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Mapping
from typing import ClassVar

from gymflow.environments.sandbox.cgroups import RunCgroup
from gymflow.environments.sandbox.execution import _Channels, _classify, _shielded, _Spawn
from gymflow.environments.sandbox.types import Limits, SandboxResult, _Staged


class Sandbox(ABC):
    isolated: ClassVar[bool]
    # bwrap reports a child killed by signal N as exit code 128 + N; a plain child shows -N.
    _signal_exit_base: ClassVar[int | None] = None
    # bwrap writes the host pid of its pid namespace's init to --info-fd: killing it ends the namespace.
    _reports_init: ClassVar[bool] = False

    async def check(self) -> None:  # noqa: B027 - optional hook: most sandboxes have nothing to check
        """Raise `SandboxUnavailable` when this sandbox cannot run programs here."""

    async def run_python(self, source: str, stdin: bytes | str = b"", *, files: Mapping[str, bytes | str] | None = None,
                         limits: Limits | None = None) -> SandboxResult:
        """Run `source` as main.py with `files` beside it in the working dir, feeding `stdin`."""
        limits = limits or Limits()
        contents = {"main.py": source, **(files or {})}
        _check_names(contents)
        async with self._confine(limits) as cgroup:
            with self._stage(contents) as staged:
                chan = _Channels.open()
                try:
                    argv, user = self._argv(staged, limits, chan.ready_w, chan.info_w), self._user()
                    if cgroup is not None:  # the shim joins the cgroup, then drops to the sandbox uid
                        argv, user = cgroup.wrap(argv, user), None
                except BaseException:
                    chan.close_all()
                    raise
                spawn = _Spawn(argv, pass_fds=(chan.ready_w, chan.info_w, *staged.fds, *staged.extra_fds),
                               cwd=staged.cwd, env=self._env(staged), user=user)
                run = await _shielded(spawn, _as_bytes(stdin), limits, chan, reports_init=self._reports_init)
            run.oom_killed = cgroup is not None and cgroup.oom_killed()
        return _classify(run, self._signal_exit_base)

    @contextlib.asynccontextmanager
    async def _confine(self, limits: Limits) -> AsyncIterator[RunCgroup | None]:
        """The run's cgroup, removed afterwards (with anything left in it); None where there is none."""
        yield None

    @abstractmethod
    def _stage(self, contents: Mapping[str, bytes | str]) -> contextlib.AbstractContextManager[_Staged]:
        """Make `contents` available to the child (fds or a directory)."""

    @abstractmethod
    def _argv(self, staged: _Staged, limits: Limits, ready_fd: int, info_fd: int) -> list[str]: ...

    def _env(self, staged: _Staged) -> dict[str, str] | None:
        return None

    def _user(self) -> int | None:
        return None


def _check_names(contents: Mapping[str, bytes | str]) -> None:
    for name in contents:
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"sandbox file name {name!r}: a plain file name is required")


def _as_bytes(data: bytes | str) -> bytes:
    return data.encode("utf-8") if isinstance(data, str) else data

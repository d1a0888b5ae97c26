"""A command on a terminal of its own, as a person runs it: Ctrl-C is the byte 0x03 typed at that terminal, which
the kernel turns into SIGINT for the terminal's whole foreground process group (the command and every child that
did not leave it), not a signal sent to one pid."""

from __future__ import annotations

import fcntl
import os
import pty
import subprocess
import termios
import threading
import time
from pathlib import Path


class PtyProcess:
    def __init__(self, cmd: list[str], log: Path, **popen: object) -> None:
        master, slave = pty.openpty()

        def _own_terminal() -> None:  # the pty becomes the child's controlling terminal, its group the foreground
            os.setsid()
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        self.proc = subprocess.Popen(cmd, stdin=slave, stdout=slave, stderr=slave, preexec_fn=_own_terminal,
                                     **popen)  # type: ignore[call-overload]
        os.close(slave)
        self._master, self.log = master, log
        self._reader = threading.Thread(target=self._copy, daemon=True)
        self._reader.start()

    def _copy(self) -> None:
        with self.log.open("wb") as sink:
            while True:
                try:
                    data = os.read(self._master, 65536)
                except OSError:  # EIO: every process holding the terminal has exited
                    return
                if not data:
                    return
                sink.write(data)
                sink.flush()

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def wait_for(self, text: str, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while text not in (out := self.output()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"{text!r} not seen (exit {self.proc.poll()}); output:\n{out[-4000:]}")
            time.sleep(0.1)
        return out

    def ctrl_c(self) -> None:
        os.write(self._master, b"\x03")

    def wait(self, timeout_s: float) -> int:
        try:
            code = self.proc.wait(timeout=timeout_s)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self._reader.join(timeout=5)
            os.close(self._master)
        return code

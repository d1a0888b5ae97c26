"""Who may change the served policy: the control token, the weights root, and the client call that uses them.

`POST /v1/load_weights` swaps the policy every rollout is sampled from, so it needs the control token: a
random string the launcher writes to a file only its owner can read (never on a command line, which every
local user can read in /proc). Weights load only from directories under the server's `--weights-root`; a
path outside it gets one answer whether or not it exists, so the endpoint cannot probe the filesystem.
"""

from __future__ import annotations

import hmac
import os
import secrets
import stat
from pathlib import Path
from typing import Any

import httpx

from gymflow.localmodel.request import BadRequest

TOKEN_FILE_NAME = "localmodel.token"
MAX_PATH_CHARS = 4096
_OUTSIDE = "`path` must name a directory under the server's weights root (--weights-root)"


def write_token_file(path: str | Path) -> Path:
    """A fresh token in `path` (mode 0600; its directory made 0700 if missing), replacing any earlier one
    atomically. The launcher writes `<state dir>/localmodel.token`."""
    path = Path(path)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{secrets.token_hex(8)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, (secrets.token_urlsafe(32) + "\n").encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)  # a symlink planted at `path` is replaced, never followed
    return path


def read_token_file(path: str | Path) -> str:
    """The token in `path`; refused (ValueError) when the file is not ours or others may read it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise ValueError(f"cannot read the control token file {str(path)!r}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise ValueError(f"the control token file {str(path)!r} must be a regular file owned by uid {os.geteuid()}")
        if st.st_mode & 0o077:
            raise ValueError(f"the control token file {str(path)!r} is readable by others (mode "
                             f"{stat.S_IMODE(st.st_mode):o}); chmod 600 it")
        token = os.read(fd, 4096).decode("ascii", "replace").strip()
    finally:
        os.close(fd)
    if len(token) < 32:
        raise ValueError(f"the control token in {str(path)!r} is shorter than 32 characters")
    return token


def authorized(header: str | None, token: str) -> bool:
    """`Authorization: Bearer <token>`, compared in constant time."""
    scheme, _, given = (header or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())


class WeightsRoot:
    """The one directory tree weights may be loaded from (symlinks resolved, so none leads out of it)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise ValueError(f"the weights root {str(root)!r} is not a directory")

    def directory(self, requested: str) -> Path:
        """The weights directory `requested` names (relative to the root, or absolute inside it)."""
        if len(requested) > MAX_PATH_CHARS or "\0" in requested:
            raise BadRequest(_OUTSIDE)
        resolved = (self.root / requested).resolve()
        if not resolved.is_relative_to(self.root):  # decided before any look at the filesystem outside
            raise BadRequest(_OUTSIDE)
        if not resolved.is_dir():
            raise BadRequest(f"`path` {requested!r} is not a directory under the weights root")
        for entry in resolved.iterdir():  # a file symlinked out of the root would be read from outside it
            if not entry.resolve().is_relative_to(self.root):
                raise BadRequest(_OUTSIDE)
        return resolved


def load_weights(base_url: str, token: str, path: str | Path, version: str, timeout_s: float = 600.0) -> dict[str, Any]:
    """Ask the server at `base_url` (its /v1 URL) to serve the weights in `path` as `version`; its JSON reply."""
    resp = httpx.post(base_url.rstrip("/") + "/load_weights", json={"path": str(path), "version": version},
                      headers={"Authorization": f"Bearer {token}"}, timeout=timeout_s)
    if resp.status_code != 200:
        raise RuntimeError(f"load_weights {version}: HTTP {resp.status_code}: {resp.text[:300]}")
    return resp.json()

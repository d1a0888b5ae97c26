"""Render a page to PNG with headless Chromium: the HTML report's test and bench/report_screenshots.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def screenshot(html_path: Path, png: Path, width: int = 1280, height: int = 1800) -> None:
    """Render `html_path` with headless Chromium (flags for a closed network and a root user)."""
    browser = chromium()
    if browser is None:
        raise RuntimeError("chromium is not installed (apt-get install chromium)")
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                        "--disable-background-networking", "--disable-component-update", "--disable-sync",
                        "--hide-scrollbars", f"--user-data-dir={profile}", f"--window-size={width},{height}",
                        f"--screenshot={png}", html_path.resolve().as_uri()],
                       check=True, capture_output=True, timeout=90, env={**os.environ, "HOME": profile})

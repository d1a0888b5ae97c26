"""Security tests of the code sandbox: exfiltration of the worker's secrets and escapes from its limits."""

from __future__ import annotations

import shutil

import pytest

requires_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None,
                                    reason="needs bubblewrap (apt-get install bubblewrap; CI installs it)")

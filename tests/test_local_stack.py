"""The local stack refuses a taken port with a message that says which and why."""

from __future__ import annotations

import socket

import pytest
from gymflow.workers.local_stack import LocalStack


def test_taken_temporal_port_is_a_clear_error(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        stack = LocalStack(tmp_path, port=port, headless=True, database_url="postgresql://unused/db")
        with pytest.raises(RuntimeError, match=f"port {port} on 127.0.0.1 is already in use"):
            stack.start()

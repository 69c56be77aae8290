"""Free ports and the port-in-use check."""

from __future__ import annotations

import socket

import pytest

from autotune.errors import EngineError
from autotune.runtime.ports import ensure_port_free, free_port, port_is_free

pytestmark = pytest.mark.sim


def test_free_port_can_be_bound() -> None:
    port = free_port()
    assert 1024 <= port <= 65535
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_listening_port_is_reported_with_its_number() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert not port_is_free(port)
        with pytest.raises(EngineError) as info:
            ensure_port_free(port)
    message = str(info.value)
    assert f"port {port} on 127.0.0.1 is not free" in message
    assert "\n" not in message


def test_released_port_is_free_again() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
    assert port_is_free(port)
    ensure_port_free(port)

"""Free ports and the port-in-use check."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from autotune.errors import EngineError
from autotune.runtime.ports import LISTEN_FLOOR, ensure_port_free, free_port, port_is_free

pytestmark = pytest.mark.sim


def test_free_port_can_be_bound() -> None:
    port = free_port()
    assert 1024 <= port <= 65535
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_free_port_is_below_the_ephemeral_range(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Outgoing connections take ports from the ephemeral range: one chosen there can be taken
    # by any client between the choice and the engine's bind.
    (tmp_path / "range").write_text("20000\t60999\n")
    monkeypatch.setattr("autotune.runtime.ports.EPHEMERAL_RANGE", tmp_path / "range")
    ports = {free_port() for _ in range(20)}
    assert all(LISTEN_FLOOR <= p < 20000 for p in ports)
    assert len(ports) > 1  # random, so two tuners on one host rarely pick the same


def test_free_port_is_the_kernels_choice_when_the_range_leaves_no_room(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "range").write_text("1024 65535\n")
    monkeypatch.setattr("autotune.runtime.ports.EPHEMERAL_RANGE", tmp_path / "range")
    port = free_port()
    assert 1024 <= port <= 65535 and port_is_free(port)


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

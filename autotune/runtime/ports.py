"""TCP ports for engines: pick a free one, or check that a chosen one is free.

A port picked here can still be taken by someone else before the engine binds it; the engine
then fails with "Address already in use", which adapters report as a port-in-use event and
the engine is launched again on a new port. Ports are picked below the kernel's ephemeral
range, so the outgoing connections of this host (the benchmark client's included) cannot
take one in that window.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

from autotune.errors import EngineError

__all__ = ["ensure_port_free", "free_port", "port_is_free"]


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    # Servers (uvicorn included) bind with SO_REUSEADDR, so a port held only by connections in
    # TIME_WAIT is usable to them; test with the same option to agree with them.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LISTEN_FLOOR = 10000  # below this are the well-known and registered services' usual ports


def _ephemeral_start() -> int:
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default range starts here


def free_port(host: str = "127.0.0.1") -> int:
    """A port on ``host`` that nothing listens on right now: a random one between
    :data:`LISTEN_FLOOR` and the ephemeral range, or the kernel's choice when that span is
    empty or full."""
    top = _ephemeral_start()
    for _ in range(64):
        if top <= LISTEN_FLOOR:
            break
        port = random.randrange(LISTEN_FLOOR, top)
        if port_is_free(port, host):
            return port
    with _bind(host, 0) as sock:
        return int(sock.getsockname()[1])


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could bind ``host:port`` right now."""
    try:
        _bind(host, port).close()
    except OSError:
        return False
    return True


def ensure_port_free(port: int, host: str = "127.0.0.1") -> None:
    """Raise a one-line EngineError when ``host:port`` cannot be bound.

    Raises:
        EngineError: Naming the port, e.g. when a previous engine still holds it.
    """
    try:
        _bind(host, port).close()
    except OSError as err:
        raise EngineError(
            f"port {port} on {host} is not free ({err.strerror}); stop what listens there "
            f"(`ss -ltnp 'sport = :{port}'`) or choose another port"
        ) from None

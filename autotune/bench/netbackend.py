"""An httpcore network backend on plain asyncio, for the load generator's hot path.

httpcore reaches the socket through a *network backend*; on asyncio it picks anyio's. Profiled
here while streaming, anyio's stream costs more per read than the HTTP parsing around it: every
read that has to wait resumes reading on the transport and pauses it again after (two
``epoll_ctl`` calls per chunk and connection), and runs inside a fresh cancel scope. An SSE
stream is one small read per token, so that cost is paid per token.

:class:`AsyncioBackend` implements httpcore's documented backend interface
(``httpcore.AsyncNetworkBackend``) on an ``asyncio.Protocol`` that keeps reading enabled and
queues what arrives; a read takes what is queued or waits for the next ``data_received``.
Timeouts use ``asyncio.timeout`` and only when one is set (the load generator sets none per
read: each request has a total deadline). Errors are httpcore's own, so httpx maps them as usual.
:func:`asyncio_transport` builds an ``httpx.AsyncHTTPTransport`` whose pool uses it.

Reads are tallied per request attempt (:func:`count_reads`, a context variable: httpcore reads in
the task that sends the request), so the load generator knows whether a failed attempt received
any byte of an answer, the line between "never reached the server, safe to resend" and "the
server was answering".
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import socket
import ssl
from collections.abc import Iterable, Iterator
from typing import Any

import httpcore
import httpx

__all__ = ["AsyncioBackend", "AsyncioStream", "ReadTally", "asyncio_transport", "count_reads"]

# httpcore's own type of a socket option (``httpcore._backends.base.SOCKET_OPTION``).
SocketOption = tuple[int, int, int] | tuple[int, int, bytes | bytearray] | tuple[int, int, None, int]


class ReadTally:
    """Bytes the current task read from any connection of this backend while it was counting."""

    __slots__ = ("bytes",)

    def __init__(self) -> None:
        self.bytes = 0


_TALLY: contextvars.ContextVar[ReadTally | None] = contextvars.ContextVar("autotune_read_tally", default=None)


@contextlib.contextmanager
def count_reads() -> Iterator[ReadTally]:
    """Count the bytes this task reads through :class:`AsyncioStream` inside the block.

    Only reads through this backend are seen: with another transport (a test's
    ``httpx.MockTransport``) the tally stays 0.
    """
    tally = ReadTally()
    token = _TALLY.set(tally)
    try:
        yield tally
    finally:
        _TALLY.reset(token)


@contextlib.contextmanager
def _mapped(timeout_exc: type[Exception], error_exc: type[Exception]) -> Iterator[None]:
    """OS and timeout errors as httpcore's exceptions (httpx turns those into its own)."""
    try:
        yield
    except TimeoutError as err:
        raise timeout_exc(str(err) or "timed out") from err
    except (OSError, ssl.SSLError) as err:
        raise error_exc(str(err) or type(err).__name__) from err


class _Protocol(asyncio.Protocol):
    """Queues received bytes; wakes a waiting reader; pauses a writer above the high-water mark."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.chunks: collections.deque[bytes] = collections.deque()
        self.eof = False
        self.error: BaseException | None = None
        self._reader: asyncio.Future[None] | None = None
        self._writable: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.chunks.append(data)
        self._wake_reader()

    def eof_received(self) -> bool | None:
        self.eof = True
        self._wake_reader()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
        self.error = exc
        self._wake_reader()
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    def pause_writing(self) -> None:
        if self._writable is None or self._writable.done():
            self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    def _wake_reader(self) -> None:
        if self._reader is not None and not self._reader.done():
            self._reader.set_result(None)

    async def wait_readable(self) -> None:
        self._reader = asyncio.get_running_loop().create_future()
        try:
            await self._reader
        finally:
            self._reader = None

    async def wait_writable(self) -> None:
        if self._writable is not None and not self._writable.done():
            await self._writable


class AsyncioStream(httpcore.AsyncNetworkStream):
    """One connection (see the module docstring)."""

    def __init__(self, transport: asyncio.Transport, protocol: _Protocol) -> None:
        self._transport = transport
        self._protocol = protocol

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        p = self._protocol
        if not p.chunks and not p.eof:
            with _mapped(httpcore.ReadTimeout, httpcore.ReadError):
                async with asyncio.timeout(timeout):
                    while not p.chunks and not p.eof:
                        await p.wait_readable()
        if not p.chunks:
            if p.error is not None:
                raise httpcore.ReadError(str(p.error) or type(p.error).__name__)
            return b""  # end of stream: httpcore reads b"" as the peer closing
        chunk = p.chunks.popleft()
        if len(chunk) > max_bytes:
            p.chunks.appendleft(chunk[max_bytes:])
            chunk = chunk[:max_bytes]
        tally = _TALLY.get()
        if tally is not None:
            tally.bytes += len(chunk)
        return chunk

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        if self._transport.is_closing():
            raise httpcore.WriteError("the connection is closed")
        self._transport.write(buffer)
        with _mapped(httpcore.WriteTimeout, httpcore.WriteError):
            async with asyncio.timeout(timeout):
                await self._protocol.wait_writable()

    async def aclose(self) -> None:
        self._transport.close()

    async def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        with _mapped(httpcore.ConnectTimeout, httpcore.ConnectError):
            async with asyncio.timeout(timeout):
                tls = await loop.start_tls(
                    self._transport, self._protocol, ssl_context, server_hostname=server_hostname
                )
        if tls is None:
            raise httpcore.ConnectError("TLS could not be started on this connection")
        return AsyncioStream(tls, self._protocol)

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable":  # httpcore asks whether an idle keep-alive connection was closed
            return bool(self._protocol.chunks) or self._protocol.eof
        key = {"client_addr": "sockname", "server_addr": "peername", "socket": "socket"}.get(info, info)
        return self._transport.get_extra_info(key)


class AsyncioBackend(httpcore.AsyncNetworkBackend):
    """TCP connections on plain asyncio (no Unix sockets)."""

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[SocketOption] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        local = (local_address, 0) if local_address else None
        with _mapped(httpcore.ConnectTimeout, httpcore.ConnectError):
            async with asyncio.timeout(timeout):
                transport, protocol = await loop.create_connection(_Protocol, host, port, local_addr=local)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # small requests go out at once
            for option in socket_options or ():
                sock.setsockopt(*option)
        return AsyncioStream(transport, protocol)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[SocketOption] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("the load generator's backend connects over TCP only")

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def asyncio_transport(verify: ssl.SSLContext | bool, keepalive_expiry_s: float) -> httpx.AsyncHTTPTransport:
    """An ``httpx.AsyncHTTPTransport`` (keep-alive, no connection cap) whose pool reads and writes
    through :class:`AsyncioBackend`; an idle connection is dropped after ``keepalive_expiry_s``
    (see :data:`autotune.bench.transport.KEEPALIVE_EXPIRY_S`).

    httpx has no option for the network backend, so the transport's pool is rebuilt with the
    same settings plus the backend; should a future httpx keep its pool elsewhere, the
    transport is returned unchanged (anyio's backend: slower, same results).
    """
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None, keepalive_expiry=keepalive_expiry_s)
    transport = httpx.AsyncHTTPTransport(verify=verify, limits=limits, trust_env=False)
    pool = getattr(transport, "_pool", None)
    if isinstance(pool, httpcore.AsyncConnectionPool):
        transport._pool = httpcore.AsyncConnectionPool(
            ssl_context=pool._ssl_context,
            max_connections=None,
            max_keepalive_connections=None,
            keepalive_expiry=pool._keepalive_expiry,
            http1=True,
            http2=False,
            retries=0,
            network_backend=AsyncioBackend(),
        )
    return transport

"""HTTP clients for the load generator: keep-alive connections without a cap, and without a slow pool.

``vllm bench serve`` shares one aiohttp session across all requests. The httpx equivalent, one
``AsyncClient`` with ``Limits(max_connections=None)``, is correct but gets slower per request as
connections accumulate: httpcore 1.0's pool re-scans every connection for every queued request
(``_assign_requests_to_connections`` is O(connections × requests); encode/httpcore#1035, fixed
only in forks). Measured here with 1-token requests against a zero-work server: 3.8 / 6.2 /
10.0 ms of client CPU per request at 16 / 64 / 256 concurrent requests, against a flat 1.8 ms
when each in-flight request has a client of its own.

So the load generator uses *lanes*: a free list of clients, each carrying at most one request at
a time (hence one keep-alive connection). A request takes the most recently freed lane (its
connection is the warmest), and a new lane is opened only when every lane is busy, so the number
of connections follows the real concurrency with no cap, exactly like a shared pool, while each
pool lookup stays O(1). The lanes share one SSL context, so opening one costs no certificate load,
and a plain-HTTP target gets a context without certificates at all.
"""

from __future__ import annotations

import ssl

import httpx

from autotune.bench.netbackend import asyncio_transport

__all__ = ["ClientLanes", "make_client", "request_timeout", "stream_timeout"]


def request_timeout(request_timeout_s: float) -> httpx.Timeout:
    """Per-operation limits; the total per-request deadline is enforced by the caller."""
    return httpx.Timeout(request_timeout_s, connect=30.0, pool=None)


def stream_timeout() -> httpx.Timeout:
    """Limits of a measured request: connect only. Its total deadline (``asyncio.timeout`` around
    the whole request) bounds every read, so a per-read timer would only cost time per token."""
    return httpx.Timeout(None, connect=30.0)


def make_client(request_timeout_s: float = 300.0, verify: ssl.SSLContext | bool = True) -> httpx.AsyncClient:
    """A client for the load generator: no connection cap, keep-alive, no proxy from the environment.

    ``trust_env=False`` because a proxy picked up from ``HTTP_PROXY`` would sit between the
    client and a local engine and silently add its own latency to every measurement. The
    transport reads and writes through :class:`~autotune.bench.netbackend.AsyncioBackend`.
    """
    return httpx.AsyncClient(
        transport=asyncio_transport(verify),
        timeout=request_timeout(request_timeout_s),
        trust_env=False,
    )


class ClientLanes:
    """A free list of clients, one in-flight request each (see the module docstring).

    Args:
        request_timeout_s: Per-operation timeout of the clients it opens.
        shared: Use this one client for every request instead (tests pass a client with an
            ``httpx.MockTransport``); it is not closed here.
        tls: Whether the target is ``https``; plain HTTP skips loading CA certificates.
    """

    def __init__(
        self, request_timeout_s: float = 300.0, shared: httpx.AsyncClient | None = None, tls: bool = True
    ) -> None:
        self._timeout_s = request_timeout_s
        self._shared = shared
        self._tls = tls
        self._free: list[httpx.AsyncClient] = []
        self._all: list[httpx.AsyncClient] = []
        self._ssl: ssl.SSLContext | None = None

    @property
    def opened(self) -> int:
        """How many lanes were opened (the peak number of requests in flight)."""
        return len(self._all)

    def acquire(self) -> httpx.AsyncClient:
        """A client with no request in flight; give it back with :meth:`release`."""
        if self._shared is not None:
            return self._shared
        if self._free:
            return self._free.pop()
        if self._ssl is None:
            self._ssl = httpx.create_ssl_context(verify=self._tls)
        client = make_client(self._timeout_s, verify=self._ssl)
        self._all.append(client)
        return client

    def release(self, client: httpx.AsyncClient) -> None:
        if client is not self._shared:
            self._free.append(client)

    async def aclose(self) -> None:
        """Close every lane this object opened (never the shared client)."""
        for client in self._all:
            await client.aclose()
        self._all.clear()
        self._free.clear()
